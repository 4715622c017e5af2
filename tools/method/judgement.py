"""The method's judgement of one experiment as a value (what tools read: its verdict, its numbers, its sentence), and
the band a change's own runs are judged by; tools/method/reading.py computes it from the ledger."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from agent import models as m
from tools.method.objective import noise_pct

OWN_SPREAD_FACTOR = 2.0  # a change's own runs' spread beyond this many bands replaces the band (own_band)
SURPRISE_RUNS = 3  # runs before a change that contradicts its prediction is judged (runs_needed)
CLEAR_SE, SD_FLOOR_PCT = 3.0, 1.0  # a loss or gain this many standard errors past the band needs fewer runs
NEAR_BAND_RUNS = 4  # runs before a gain within its standard error of the band is judged (tools/method/reading.py)
LOSS_SE = 2.0  # a loss is a regression only past the band by this many standard errors (tools/method/reading.py)


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


def runs_needed(judged: float, band: float, predicted: float | None, surprise: bool, se: float) -> tuple[int, int]:
    """The runs before a verdict, as (a surprise's, a gain's), for a change judged at `judged` % against `band` %
    with standard error `se` points, predicted `predicted` % before its launch (None: no prediction). A surprise
    (measured off its prediction by more than the band) that calls for another verdict than the prediction does
    needs SURPRISE_RUNS, but two for a loss past the band by CLEAR_SE standard errors, which only a broken run could
    explain (0: none beyond the usual). A gain needs two (one lucky run never becomes the bar), but one where it
    clears the band by CLEAR_SE standard errors and the twin predicted it beyond the band too, off by more than the
    band or not: a +18% predicted and measured once is no draw of the noise, nor is a +24.6% predicted +29.5%."""
    gain = 1 if predicted is not None and predicted >= band and judged >= band + CLEAR_SE * se else 2
    if surprise:
        p = predicted if predicted is not None else float("nan")
        flips = (judged >= band) != (p >= band) or (judged <= -band) != (p <= -band)
        return (2 if judged <= -band - CLEAR_SE * se else SURPRISE_RUNS) if flips else 0, gain
    return 0, gain


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


def twin_error(record: list[tuple[float, float, int, int]], sd: float, floor: float) -> float:
    """The twin's error on a campaign's measured changes beyond what the noise explains, in points, never below
    `floor`: `record` as Method.twin_record reads it (measured change, predicted change, runs, base runs), `sd` the
    run-to-run noise in %."""
    noise2 = sum(sd**2 * (1 / n + 1 / nb) for _, _, n, nb in record) / len(record)
    return max(floor**2, sum((mc - pc) ** 2 for mc, pc, _, _ in record) / len(record) - noise2) ** 0.5


def near_move(base: m.Experiment | None, base_runs: int, moved: bool, runs: int = 1) -> Suggestion:
    """What a change near the band needs next (tools/method/reading.py's docstring): its base measured again where
    the base is a change adopted since (not the baseline, nor a best another change has replaced) on fewer runs than
    the change has, or on its one run (a clear gain: its confirming run waits until a verdict needs its precision);
    else a run of its own. The standard error of the difference falls fastest on the side with fewer runs."""
    if rebasable(base, moved) and base_runs < max(runs, 2):
        return "rebase"
    return "rerun"


def rebasable(base: m.Experiment | None, moved: bool) -> bool:
    """Whether a change's base may be measured again before its verdict: a finished change (the baseline's runs set
    the band), still the best (`moved`: another change replaced it since the change was launched on it)."""
    return base is not None and base.kind != "baseline" and base.status == "finished" and not moved
