"""What the method hears of the twin, read from the ledger: its record on this campaign's measured changes, the
weight its prediction has in a change's judged gain, a surprise (a measurement that contradicts it), and the doubt
rule for a gain it put inside the band (tools/method/reading.py's docstring says the rules; `Method` reads the ledger
and inherits these)."""

from __future__ import annotations

from typing import Protocol

from agent import models as m
from tools.method.judgement import NEAR_BAND_RUNS, twin_error

TWIN_MIN_PCT = 0.5  # the twin's own error on a change is never taken below this, whatever its record
TWIN_RECORD = ("adopted", "no_gain", "regressed", "superseded")  # verdicts whose measured change is the twin's record


class _Reading(Protocol):
    """What the twin's word reads of `Method` (tools/method/reading.py), which inherits it."""

    experiments: list[m.Experiment]

    @property
    def settings(self) -> m.SessionSettings: ...
    def twin_record(self, e: m.Experiment) -> list[tuple[float, float, int, int]]: ...
    def run_sd_pct(self, workload: m.BenchSpec | None = None) -> float | None: ...
    def _compared(self, e: m.Experiment) -> tuple[int, list[float], list[float]] | None: ...
    def _standard_error(self, e: m.Experiment, runs: int, base_runs: int) -> float | None: ...


class TwinWord:
    """The twin's word in the method's reading: a part of `Method` (tools/method/reading.py), kept apart."""

    def twin_record(self: _Reading, e: m.Experiment) -> list[tuple[float, float, int, int]]:
        """The twin's record in this campaign before `e`: (measured change, predicted change, runs, base runs) of
        each change judged so far on e's workload that was predicted before its launch."""
        key = e.workload.workload_key()
        out = []
        for x in self.experiments:
            if (x.id or 0) >= (e.id or 0) or x.kind != "change" or x.predicted_change_pct is None:
                continue
            if x.verdict not in TWIN_RECORD or x.workload.workload_key() != key or x.not_modelled:
                continue
            if (cmp := self._compared(x)) is not None and (b := sum(cmp[1]) / len(cmp[1])) > 0:
                measured = (sum(cmp[2]) / len(cmp[2]) - b) / b * 100
                out.append((measured, x.predicted_change_pct, len(cmp[2]), len(cmp[1])))
        return out

    def with_twin(
        self: _Reading, e: m.Experiment, change: float, runs: int, base_runs: int, band: float
    ) -> tuple[float, str, float]:
        """The change `e` is judged by, how it was reached, in words, and the prediction's weight in it (0: the
        measurement alone): the measured change, or, when the twin predicted it before launch, its errors on this
        campaign's measured changes (beyond what the noise explains) stay under the band and this measurement does
        not contradict it, the measured and the predicted change weighted by their precision."""
        p, unit_runs = e.predicted_change_pct, f"{runs} run{'s' if runs != 1 else ''}"
        sd = self.run_sd_pct(e.workload)
        heard = p is not None and self.settings.search and e.kind == "change" and not e.not_modelled
        record = self.twin_record(e) if heard else []  # the greedy path (search off) judges measurements alone
        if p is None or sd is None or not record:
            return change, "", 0.0
        var = sd**2 * (1 / runs + 1 / base_runs)  # of the measured change
        twin2 = twin_error(record, sd, TWIN_MIN_PCT) ** 2
        of = f"{len(record)} measured change{'s' if len(record) != 1 else ''}"
        if twin2**0.5 >= band:
            return (
                change,
                (
                    f"; the twin predicted {p:+.1f}%, but its predictions were off by {twin2**0.5:.1f}% of {of} beyond "
                    "the noise: judged on the measurement alone"
                ),
                0.0,
            )
        if abs(change - p) > 2 * (var + twin2) ** 0.5:
            return (
                change,
                (
                    f"; the twin predicted {p:+.1f}% (within {twin2**0.5:.1f}% of {of}), but this measurement contradicts "
                    "it beyond both their errors: judged on the measurement alone"
                ),
                0.0,
            )
        weight = var / (var + twin2)  # of the prediction
        judged = change + weight * (p - change)
        return (
            judged,
            (
                f"; measured {change:+.1f}% ({unit_runs}) and predicted {p:+.1f}% (the twin, within {twin2**0.5:.1f}% of "
                f"{of}; run-to-run noise {sd:.1f}%): {judged:+.1f}%"
            ),
            weight,
        )

    def _surprise(self: _Reading, e: m.Experiment, change: float, band: float) -> bool:
        """Whether the measured change differs from the prediction made before the launch by more than the band
        (with the search on; a change of flags the engine does not model has no prediction to contradict)."""
        p = e.predicted_change_pct
        return self.settings.search and p is not None and not e.not_modelled and abs(change - p) > band

    def _doubt(self: _Reading, e: m.Experiment, judged: float, band: float, runs: int, base_runs: int, weight: float,
               base: m.Experiment | None, moved: bool) -> tuple[float | None, float | None, bool]:  # fmt: skip
        """Of a gain the twin put inside the band (the module docstring): its standard error where it clears the band
        by less and the twin is heard (no gain); the twin's error here where that is the band or more (not heard),
        and whether its base is measured again first."""
        doubt = (self._standard_error(e, runs, base_runs) or 0.0) * (1 - weight) ** 0.5
        if judged >= band + doubt:
            return None, None, False
        sd, record = self.run_sd_pct(e.workload), self.twin_record(e)
        off = twin_error(record, sd, TWIN_MIN_PCT) if record and sd is not None else 0.0
        again = base_runs < NEAR_BAND_RUNS and not moved and base is not None and base.status == "finished"
        return (None, off, again) if off >= band else (doubt, None, False)
