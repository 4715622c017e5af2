"""The method's words for a change it cannot measure (a launch the engine refused, in the engine's own sentence with
pivot's framing taken off; a change of flags a simulated engine does not model), for how a measured change stands
against the noise band, and for what a baseline that meets the objective nowhere measured."""

from __future__ import annotations

import re
from typing import Protocol

from agent import models as m
from tools.method.judgement import CLEAR_SE, Suggestion
from tools.method.objective import Objective


class Reading(Protocol):
    """What unmet_words reads of a ledger's reading (tools/method/reading.py's Method)."""

    runs: dict[int, list[m.BenchResult]]

    @property
    def objective(self) -> Objective: ...


# the words a launch failure was recorded with (tools/engines/process.py): "vllm exited while starting (exit code 1):
# argument-validation (Value error, ...)"; the engine's own sentence is the part in brackets at the end
_STARTUP_WORDS = re.compile(r"^.*? exited while starting \([^)]*\): [\w-]+ \((?P<words>.*)\)$", re.DOTALL)


def engine_words(detail: str | None) -> str:
    """The engine's own sentence from a failure's recorded detail (pivot's framing taken off), else ''."""
    if not detail:
        return ""
    found = _STARTUP_WORDS.match(detail.strip())
    return (found.group("words") if found else detail).strip()


def refused_text(e: m.Experiment) -> str:
    """Why a change the engine refused at startup is ruled out, in the engine's own words where it gave some."""
    words = engine_words(e.failure_detail)
    what = (
        "the engine cannot run it on this hardware"
        if e.failure == "unsupported-hardware"
        else "the engine refused the flags"
    )
    return f"{what} ({e.failure})" + (f": {words}" if words else "")


def _names(flags: list[str]) -> str:
    return ", ".join(flags[:-1]) + f" and {flags[-1]}" if len(flags) > 1 else (flags[0] if flags else "")


def not_measured_text(flags: list[str]) -> str:
    """Why a change is not measured, and what would measure it."""
    return (
        f"not measured: the twin does not model {_names(flags)}, so its numbers cannot show what this change does; "
        "measure it on a GPU (--engine sglang)"
    )


def verdict_clause(e: m.Experiment, suggestion: Suggestion, surprise: bool, change: float, judged: float, band: float,
                   noise: float | None, floor: float) -> str:  # fmt: skip
    """How the change stands against the band, or, for a surprise rerun, against its prediction, in words."""
    if not (surprise and suggestion == "rerun" and (judged >= band or judged <= -band)):
        return band_clause(suggestion, judged, band, noise, floor)
    p = e.predicted_change_pct or 0.0
    return (
        f", beyond the {band:.1f}% noise band, but {change - p:+.1f} points off the {p:+.1f}% predicted before "
        "the launch (more than the band): one more run before the verdict"
    )


def band_clause(suggestion: Suggestion, change: float, band: float, noise: float | None, floor: float) -> str:
    """How the change stands against the noise band (`floor`: the session's least gain), in words."""
    why_band = f"measured noise {noise:.1f}%, floor {floor:g}%" if noise is not None else f"floor {floor:g}%"
    if suggestion == "rerun" and change >= band:
        return (
            f", beyond the {band:.1f}% noise band on one run ({why_band}): a second run confirms it before it "
            "becomes the bar (the band applies to the mean)"
        )
    if suggestion == "rerun" and change <= -band:
        return f", beyond the {band:.1f}% noise band on one run ({why_band}): measured again before the verdict"
    if suggestion in ("no_gain", "rerun"):
        return f", inside the {band:.1f}% noise band ({why_band})"
    if suggestion in ("adopted", "superseded"):
        return f", beyond the {band:.1f}% noise band ({why_band})"
    return ""


def near_clause(judged: float, band: float, se: float, runs: int, base_number: int | None, base_runs: int = 1) -> str:
    """A gain within its standard error `se` of the band, in words: what is measured again before its verdict (its
    base, experiment `base_number`, measured on `base_runs` runs, fewer than the change's or one; else the change)."""
    on = "its one run" if base_runs == 1 else f"{base_runs} runs, fewer than this change's {runs}"
    what = (
        f"its base (experiment {base_number}), adopted on {on}, is measured again before the verdict"
        if base_number is not None
        else "one more run before the verdict"
    )
    return (
        f", {judged - band:+.1f} points from the {band:.1f}% noise band, within its standard error ({se:.1f} points "
        f"on {runs} run{'s' if runs != 1 else ''}): {what}"
    )


def few_runs_clause(judged: float, band: float, se: float, base_number: int | None, base_runs: int) -> str:
    """A loss past the band, judged against a best adopted on `base_runs` runs (fewer than it takes near the band),
    in words: that best is measured again before the verdict (a best adopted on lucky runs reads high, and every
    change judged against it low)."""
    on = "its one run" if base_runs == 1 else f"{base_runs} runs"
    return (
        f", {-band - judged:.1f} points past the {band:.1f}% noise band, within {CLEAR_SE:g} standard errors "
        f"({se:.1f} points) of it, against experiment {base_number}, adopted on {on}: a lucky draw of the best "
        "reads as a loss here, so the best is measured again before the verdict"
    )


def unmet_words(method: Reading, e: m.Experiment) -> str:
    """What the objective's value was per level of `e`, said when it is 0 at the level judged: no level's requests
    met the SLOs (the SLO attainment per level, where the runs measured it)."""
    by_level: dict[int, list[tuple[float, float | None]]] = {}
    for result in method.runs.get(e.id or 0, []):
        values = method.objective.value_of_run(result)
        for lv in result.levels:
            c = lv.max_concurrency
            if c is not None and c in values:
                by_level.setdefault(c, []).append((values[c], lv.slo_attainment))
    parts = []
    for c, pairs in sorted(by_level.items()):
        value = sum(v for v, _ in pairs) / len(pairs)
        att = [a for _, a in pairs if a is not None]
        share = f" ({100 * sum(att) / len(att):.0f}% of requests within the SLOs)" if att else ""
        unit = getattr(method.objective, "unit", "")
        parts.append(f"{method.objective.number(value)} {unit}{share} at concurrency {c}".replace("  ", " "))
    return "no level meets the objective: " + "; ".join(parts) if parts else "no level meets the objective"


def unheard_clause(band: float, off: float, predicted: float, base_runs: int) -> str:
    """Why a gain the twin put inside the band, where it has been off here by the band or more, waits for its base."""
    return (f", past the {band:.1f}% noise band by less than its standard error where the twin, off by {off:.1f}% on "
            f"this campaign's changes, predicted {predicted:+.1f}%: its base measured again ({base_runs} runs so far) "
            "before the verdict")  # fmt: skip


def slight_loss_clause(band: float, se: float, predicted: float, runs: int) -> str:
    """The words of a loss the twin predicted inside the band, past it on too few runs to call it a regression."""
    return (f", past the {band:.1f}% noise band on {runs} run{'s' if runs != 1 else ''} but not by {CLEAR_SE:g} "
            f"standard errors ({se:.1f} points each) where the twin predicted {predicted:+.1f}%: no gain, not "
            "measured again to call it a regression (no verdict turns on it)")  # fmt: skip
