"""Paired measurement (A/B/A): a change judged against its base measured beside it, not minutes before.

On a real engine the host drifts. On a shared CPU host a baseline's runs climbed 74 -> 92 -> 115 -> 126 tok/s while
other processes' load fell, and float32, whose gain measured at equal load was +167.7%, was adopted at "+270.6%": its
runs were compared with the base's mean of runs taken before the load fell. So a change whose runs would decide a
verdict (adopted or regressed) is not judged on them alone: its base is measured again *after* it (the method's
`rebase`: a rerun of the base experiment, A/B/A), and then

- each of the change's runs at the judged level is paired with the base's value at the moment the run started,
  interpolated in time between the base's last run before it and its first run after it (drift that is smooth over
  a few minutes cancels; a run with no base run after it has no pair and does not count);
- the change is the mean of the paired ratios (run / base at its time) less one, and those ratios' own spread is
  the comparison's noise (the method's own band: `own_band`);
- the verdict's words say which comparison decided: "paired with its base measured before and after it (A/B/A)".

The base is measured again at most once per change (a pairing exists after that), and only for a decisive verdict:
a change inside the band is rerun or called no gain as before. When: the session's `paired` setting, `auto` (the
default) pairs the runs of an engine that measures (a run whose source is not "simulated": the twin's noise has no
drift, and pairing would only double its launches), `on` always, `off` never.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent import models as m
from tools.method.objective import noise_pct

DECISIVE = ("adopted", "regressed")


@dataclass(frozen=True)
class Pairing:
    """A change's runs paired with its base's values at their times."""

    ratios: list[float]  # each paired run / the base's value at its time
    refs: list[float]  # the base's value at each paired run's time
    base_runs: int  # the base's runs at the judged level

    @property
    def change_pct(self) -> float:
        return (sum(self.ratios) / len(self.ratios) - 1) * 100

    @property
    def ref_mean(self) -> float:
        return sum(self.refs) / len(self.refs)

    def words(self, base_number: int | None) -> str:
        """How the comparison was made, for the verdict's text."""
        ratios = ", ".join(f"{(r - 1) * 100:+.1f}%" for r in self.ratios)
        spread = noise_pct(self.ratios) if len(self.ratios) >= 2 else None
        own = f", their spread {spread:.1f}%" if spread is not None else ""
        return (
            f"; paired with its base measured before and after it (A/B/A, experiment {base_number}'s "
            f"{self.base_runs} runs): {len(self.ratios)} paired run{'s' if len(self.ratios) != 1 else ''} at "
            f"{ratios}{own}"
        )


def timed(runs: list[m.BenchResult], value_of_run, level: int) -> list[tuple[float, float]]:
    """(start time in seconds, the objective's value at `level`) of each run that completed the level."""
    out = []
    for r in runs:
        v = value_of_run(r).get(level)
        if v is not None:
            out.append((r.started_at.timestamp(), v))
    return sorted(out)


def back_to_back(base_id: int, experiments: list[m.Experiment], runs: dict[int, list[m.BenchResult]], value_of_run,
                 level: int) -> list[float]:  # fmt: skip
    """The baseline's values at `level` from its runs taken back to back, before any other experiment's first run:
    its noise, without the drift of its later re-measurements (the pairs cancel that)."""
    others = [r.started_at for e in experiments if e.id != base_id for r in runs.get(e.id or 0, [])]
    first_other = min(others) if others else None
    return [v for r in runs.get(base_id, []) if (first_other is None or r.started_at < first_other)
            and (v := value_of_run(r).get(level)) is not None]  # fmt: skip


def pair(base: list[tuple[float, float]], runs: list[tuple[float, float]]) -> Pairing | None:
    """The pairing of `runs` with `base` (both (time, value)); None when no run has a base run before and after it."""
    ratios, refs = [], []
    for t, v in runs:
        before = [(tb, vb) for tb, vb in base if tb < t]
        after = [(ta, va) for ta, va in base if ta > t]
        if not before or not after:
            continue
        (tb, vb), (ta, va) = before[-1], after[0]
        ref = vb + (va - vb) * (t - tb) / (ta - tb)
        if ref > 0:
            ratios.append(v / ref)
            refs.append(ref)
    return Pairing(ratios, refs, len(base)) if ratios else None


def enabled(setting: str, runs: list[m.BenchResult]) -> bool:
    """Whether a change with these runs is measured in pairs (the module docstring's `paired` setting)."""
    if setting == "on":
        return True
    if setting == "off":
        return False
    return any(r.source != "simulated" for r in runs)


def rebase_words(base_number: int | None, band: float) -> str:
    """The verdict's words while a decisive change waits for its base measured again."""
    return (
        f", beyond the {band:.1f}% noise band against its base's runs taken before it: the base (experiment "
        f"{base_number}) is measured again after it before the verdict (A/B/A: a host that drifted in between "
        f"moves both, and the runs are judged in pairs)"
    )
