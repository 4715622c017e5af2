"""The method's judgement of one experiment as a value (what tools read: its verdict, its numbers, its sentence), and
the band a change's own runs are judged by; tools/method/reading.py computes it from the ledger."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from tools.method.objective import noise_pct

OWN_SPREAD_FACTOR = 2.0  # a change's own runs' spread beyond this many bands replaces the band (own_band)


def own_band(runs: list[float], band: float) -> tuple[float, str]:
    """The band a change's runs are judged by: the session's, or their own spread when it is wider (a null control
    measured at 473 and 221 tok/s is not a regression on a 4% band), with the words that say so. Their spread
    counts once it is OWN_SPREAD_FACTOR times the band: runs that merely scatter as the baseline's do keep its band."""
    own = noise_pct(runs) if len(runs) >= 2 else None
    if own is None or own <= OWN_SPREAD_FACTOR * band:
        return band, ""
    return own, (
        f"; its own {len(runs)} runs spread {own:.1f}%, wider than the session's {band:.1f}% band: judged against "
        "their spread"
    )


Suggestion = Literal[
    "baseline",
    "adopted",
    "no_gain",
    "regressed",
    "crashed",
    "ruled_out",
    "not_measured",
    "rerun",
    "rebase",
    "pending",
    "superseded",
]


class Judgement(BaseModel):
    """An experiment measured against its base, and the verdict the method gives it."""

    experiment_id: int
    base_experiment_id: int | None = None
    suggestion: Suggestion = Field(description="The method's verdict; `rerun` when the gain is inside the noise.")
    concurrency: int | None = Field(default=None, description="The judged level.")
    before_tok_s: float | None = None
    after_tok_s: float | None = Field(default=None, description="Mean output tok/s over this experiment's runs.")
    runs_tok_s: list[float] = Field(default_factory=list, description="Output tok/s of each run at the judged level.")
    change_pct: float | None = Field(default=None, description="The measured change (mean against mean), in %.")
    judged_pct: float | None = Field(
        default=None,
        description="The change the verdict is judged by: the measured one, or the measured and the twin's predicted "
        "change weighted by their precision (`text` says which, with both numbers).",
    )
    noise_pct: float | None = Field(
        default=None, description="Measured: twice the standard error of the baseline's mean (two runs: their spread)."
    )
    band_pct: float = Field(description="A change must beat this to be adopted: max(floor, measured noise).")
    failed_levels: list[int] = Field(default_factory=list)
    noop_flags: list[str] = Field(default_factory=list, description="Flags the engine accepts but never reads.")
    not_modelled: list[str] = Field(
        default_factory=list, description="Flags this change touches that the engine does not model (simulated)."
    )
    text: str = Field(description="The comparison in one sentence, with its numbers: usable as a verdict's reason.")
