"""The method, read from the ledger: the baseline, the best configuration so far (and the chain of adopted changes
it is built from), the measured noise, and how a change is judged against its base.

The tools (run_benchmark's comparison, record_verdict), the method's moves (tools/method/moves.py) and the search
read the ledger through this one module, so an LLM and the built-in policy are held to the same rules:

- every comparison is made on the judged level: the highest concurrency both runs completed without failures;
  the judged value is the session's objective there (tools/method/objective.py: output tok/s), averaged over the
  experiment's runs (a rerun adds a run);
- the noise band is max(min_gain_pct, measured noise), where the measured noise is twice the standard error of the
  baseline's mean at its judged level (for two runs: their spread (max - min) / mean; more runs narrow it);
- a change is judged by its measured gain, or, with the search on, when the twin predicted it before launch and has a
  record in this campaign, by the measured and the predicted gain weighted by their precision: the measurement's
  variance is the pooled run-to-run variance over its runs and its base's, the prediction's is the twin's mean squared
  error on the changes judged so far beyond what the noise explains (never below TWIN_MIN_PCT); a twin whose error is
  as large as the band is not heard (the measured gain alone), nor one the measurement contradicts (they differ by
  more than twice their combined error). The weighted gain lies between the two, so a change the twin and the
  measurement both put below the band is never adopted;
- a change is adopted only when its (judged) gain beats the band on the mean of at least two runs (a gain beyond the
  band on one run is rerun to confirm it, and so is a loss far beyond it that the twin predicted inside the band,
  a slight one being no gain at once (below), unless the session's `search` setting is off: the old greedy path),
  or on one run where it clears the band by CLEAR_SE standard errors where the twin predicted it beyond the band
  too (judgement.runs_needed: no draw of the noise, whether the twin was off by more than the band or not; its
  second run waits until a change judged against it is near the band, and is taken then, before that verdict); a gain
  inside the band is rerun (up to `reruns` times) and then called no gain (with the search on, at once where the
  twin predicted it inside the band too and the measurement is not near the band); a loss beyond the band is a
  regression; failed requests are a crash;
- a surprise is confirmed before its verdict: with the search on, a measured change that differs from the prediction
  made before its launch by more than the band (the twin is wrong about it, or the runs were unlucky) and calls for
  another verdict than the prediction does (one is beyond the band where the other is not) is rerun until it has
  SURPRISE_RUNS runs before it is adopted or called a regression (a loss too: with two, three false regressions
  appeared in 140 wrong-twin campaigns, near the band), but two for a loss CLEAR_SE standard errors past the band;
  predicted +8.6% and measured +12.8% both say adopt, and a gain's usual second run confirms it;
- but a loss past the band that the twin predicted inside it, about to be measured again (a surprise, or one run),
  is no gain at once unless it is past the band by CLEAR_SE standard errors (`_slight_loss`, the noise taken at least
  SD_FLOOR_PCT): another run could only tell a regression from no gain, and neither is adopted (a flag predicted
  +0.0% measured -6.7% on one run is not measured twice more to call it a regression: in 90 noisy campaigns on
  random wrong twins such confirmations cost 89 launches, one a campaign);
- with the search on, a loss is called a regression only when its (judged) mean is beyond the band by LOSS_SE
  standard errors (the pooled run-to-run noise over its runs and its base's): a loss just past the band that the
  noise can explain is no gain, not a claim that the change hurts, whether the twin predicted it or not (a rider
  taken back, predicted -2%, measured -3.3% on one run, is no gain; with one standard error, 2 of 110 noisy
  wrong-twin rows called a true -1..-2% change a regression); and, with noisy runs, a loss past the band by more
  than one standard error but less than CLEAR_SE (the noise taken at least SD_FLOOR_PCT) against a best adopted on
  fewer than NEAR_BAND_RUNS runs waits for that best's next run before it is no gain or a regression: a lucky draw
  of the bar reads as a loss in everything judged against it (a best measured +10.5% on one run, truly +7.2%, made a
  rider truly -1.6% read -4.1%; one measured +11.2% on two, truly +8.6%, one truly -2.2% read -5.1%), and the next
  gain judged against it would read low too; but not a loss the twin foresaw past the band (the check of a loss it
  settled, measured as it said): no verdict turns on that best's next run there, and on an exact twin it cost three
  of its runs (eval-llama70b-h200x2, noisy: 10.4 -> 8.7 launches);
- a gain near the band is measured again before its verdict: with the search on, a change whose (judged) gain lies
  within its standard error of the band, on either side, is rerun until it has NEAR_BAND_RUNS runs, so that a
  true +3.2% that two unlucky runs put at +2.6% is not called no gain, nor a true +1% that two lucky runs put at
  +3.5% adopted (noise-free runs have no standard error: nothing is near; a change judged in pairs with its base,
  tools/method/paired.py, is not: a run of it after its base's last has no pair and would not count); where its base
  is a change still the best (not the baseline, whose runs set the band), the side with fewer runs is measured next
  (judgement.near_move), until each has one run fewer than NEAR_BAND_RUNS (a best measured that often already: the
  change's NEAR_BAND_RUNS): as many launches as four runs against a base's two, a smaller error, and a best that
  read high on two runs (truly +3.1%, measured +4.8%) makes a true +4.3% gain judged against it read +2.4% on four
  runs and be called no gain less often;
- with the search on, a gain the twin predicted inside the band (a check of its word: the items it settled
  unmeasured, the riders taken back) is adopted only when it clears the band by its standard error: there the twin
  is right more often than not, and a near-band draw of the noise is no reason to believe it wrong. Where it was off
  here by the band or more it is not heard: a base on fewer than NEAR_BAND_RUNS runs is measured again first (a best
  measured highest: what is judged against it reads off by that draw), then the measurements alone judge;
- with the search on, where every run repeated on the workload gave the same value (`repeats_exactly`: a
  deterministic engine, the twin without noise; no real engine repeats to the last digit), no verdict waits for
  another run: a gain, a surprise and a gain inside the band are judged on their one run;
- a change whose changed flags the engine does not model (a simulated engine: `Experiment.not_modelled`) is not
  measured, whatever numbers the engine gave: its effect is not in them.

What may happen next (launches, verdicts, pivots, the end) is not read here: tools/method/moves.py computes it once
from this reading, and the guard, the autopilot and the search all read that.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from agent import models as m
from agent.contracts import load_engine
from agent.errors import PivotError
from agent.store import Store
from tools.method import paired, words
from tools.method.judgement import (  # noqa: F401 (re-exported)
    CLEAR_SE,
    LOSS_SE,
    NEAR_BAND_RUNS,
    OWN_SPREAD_FACTOR,
    SD_FLOOR_PCT,
    SURPRISE_RUNS,
    Judgement,
    Suggestion,
    near_move,
    own_band,
    rebasable,
    runs_needed,
)
from tools.method.objective import Objective, noise_pct, objective_for
from tools.method.twin_word import TWIN_MIN_PCT, TWIN_RECORD, TwinWord  # noqa: F401 (re-exported)
from tools.method.words import _names, engine_words, not_measured_text, refused_text, unmet_words  # noqa: F401

HOST_MOVED_CORES = 0.5  # other processes' CPU use (cores) that differs this much between two runs is a moved host
REFUSED_FAILURES = (
    "unrecognized-argument",
    "ambiguous-argument",
    "invalid-choice",
    "argument-validation",
    "unsupported-hardware",
)


@dataclass
class Method(TwinWord):
    """One reading of a session's ledger by the method's rules."""

    store: Store
    record: m.Session
    experiments: list[m.Experiment]
    runs: dict[int, list[m.BenchResult]]
    pivots: list[m.Pivot] = field(default_factory=list)

    @classmethod
    def read(cls, store: Store, session_id: str) -> Method:
        record = store.get_session(session_id)
        experiments = store.experiments(session_id)
        runs = {e.id or 0: store.bench_results(e.id or 0) for e in experiments}
        return cls(store, record, experiments, runs, store.pivots(session_id))

    @property
    def settings(self) -> m.SessionSettings:
        return self.record.settings

    @property
    def plan(self) -> m.Plan:
        return self.record.plan

    @functools.cached_property
    def model_flags(self) -> Sequence[str]:
        """The flags that name the model in the session's engine's spelling (Engine.model_flags)."""
        try:
            return load_engine(self.record.engine, **self.settings.engine_options).model_flags
        except PivotError:  # the engine is not installed here (a ledger read elsewhere): SGLang's spelling
            return m.DEFAULT_MODEL_FLAGS

    def base_config(self) -> m.ServerConfig:
        """The plan's base flags with the model named in the engine's spelling (Target.base_config)."""
        return self.plan.target.base_config(self.model_flags)

    @functools.cached_property
    def objective(self) -> Objective:
        """What every comparison judges: the plan's objective (output tok/s at the judged level by default)."""
        return objective_for(self.plan)

    def experiment(self, experiment_id: int | None) -> m.Experiment | None:
        return next((e for e in self.experiments if e.id == experiment_id), None)

    def number(self, experiment_id: int | None) -> int | None:
        """The session's number of the experiment with this ledger id (what a user and a model call it)."""
        e = self.experiment(experiment_id)
        return e.number if e is not None else None

    # ---- levels

    def ok_values(self, e: m.Experiment) -> dict[int, list[float]]:
        """The objective's value per concurrency and run, for the levels that count (completed, no failure; for
        capacity, one value per run at the workload's highest concurrency)."""
        out: dict[int, list[float]] = {}
        for result in self.runs.get(e.id or 0, []):
            for c, value in self.objective.value_of_run(result).items():
                out.setdefault(c, []).append(value)
        return dict(sorted(out.items()))

    def failed_levels(self, e: m.Experiment) -> list[int]:
        return sorted(
            {
                lv.max_concurrency
                for r in self.runs.get(e.id or 0, [])
                for lv in r.levels
                if lv.failed > 0 and lv.max_concurrency is not None
            }
        )

    def refused_levels(self, e: m.Experiment) -> list[int]:
        """Levels of `e` refused as measurements (the twin fell behind its clock), which no judgement uses."""
        return sorted(
            {lv.max_concurrency for r in self.runs.get(e.id or 0, []) for lv in r.levels
             if lv.refused and lv.max_concurrency is not None}
        )  # fmt: skip

    def _refused_clause(self, e: m.Experiment) -> str:
        refused = self.refused_levels(e)
        if not refused:
            return ""
        return (
            f"; not a measurement at concurrency {', '.join(map(str, refused))} (this host fell behind the twin's "
            "clock): not compared"
        )

    def run_count(self, e: m.Experiment) -> int:
        return len(self.runs.get(e.id or 0, []))

    # ---- baseline, noise, best

    def baseline(self, workload: m.BenchSpec | None = None) -> m.Experiment | None:
        """The baseline on `workload` (default: the plan's): the first baseline experiment measured on it, else the
        latest one tried (which may have failed to start)."""
        key = (workload or self.plan.workload).workload_key()
        tried = [e for e in self.experiments if e.kind == "baseline" and e.workload.workload_key() == key]
        measured = [e for e in tried if self.run_count(e) > 0]
        return measured[0] if measured else (tried[-1] if tried else None)

    def workload_ready(self, item: m.PlanItem) -> bool:
        """Whether the item's own workload has its baseline measured and judged (an item on the plan's workload
        always has: the plan's baseline comes first)."""
        if not item.workload:
            return True
        base = self.baseline(item.workload_for(self.plan.workload))
        return base is not None and base.verdict == "baseline"

    def noise_pct(self, workload: m.BenchSpec | None = None) -> float | None:
        """The measured noise: twice the standard error of the baseline's mean at its top level, in % (for two runs
        their spread (max - min) / mean); None before two runs."""
        base = self.baseline(workload)
        if base is None:
            return None
        values = self.ok_values(base)
        if values and self._pairs(base):  # drift is the pairs' to cancel: the noise is of the back-to-back runs
            values = {max(values): paired.back_to_back(base.id or 0, self.experiments, self.runs,
                                                       self.objective.value_of_run, max(values))}  # fmt: skip
        return noise_pct(values[max(values)]) if values else None

    def band_pct(self, workload: m.BenchSpec | None = None) -> float:
        noise = self.noise_pct(workload)
        return max(self.settings.min_gain_pct, noise or 0.0)

    def best(self, workload: m.BenchSpec | None = None) -> m.Experiment | None:
        """The best configuration so far on `workload`: the last adopted change, else the baseline."""
        key = (workload or self.plan.workload).workload_key()
        adopted = [e for e in self.experiments if e.verdict == "adopted" and e.workload.workload_key() == key]
        return adopted[-1] if adopted else self.baseline(workload)

    def best_config(self) -> m.ServerConfig:
        best = self.best()
        return best.config if best is not None else self.base_config()

    def step_base(self, items: Sequence[str] = (), reverts: Collection[str] = ()) -> m.ServerConfig:
        """The configuration a step builds on: the best on its items' workload (the first item's; the plan's
        without items), rebuilt from its chain of adopted changes without `reverts` when there are any."""
        item = self.plan.item(items[0]) if items and items[0] in self.plan.item_ids() else None
        workload = item.workload_for(self.plan.workload) if item is not None else self.plan.workload
        if reverts:
            return self.rebuild(drop=reverts, workload=workload)
        best = self.best(workload)
        return best.config if best is not None else self.base_config()

    # ---- the chain of adopted changes the best configuration is built from

    def chain(self, workload: m.BenchSpec | None = None) -> list[m.Experiment]:
        """The adopted changes on `workload` (default: the plan's), in order: the best configuration is the base
        flags with each one's items applied (and its reverts taken back) in turn."""
        key = (workload or self.plan.workload).workload_key()
        return [e for e in self.experiments if e.verdict == "adopted" and e.workload.workload_key() == key]

    def active_items(self, workload: m.BenchSpec | None = None) -> list[str]:
        """The plan items the best configuration holds, in the order they were adopted (reverted ones left out)."""
        active: list[str] = []
        for e in self.chain(workload):
            active = [i for i in active if i not in e.reverts]
            active += [i for i in e.plan_items if i not in active]
        return active

    def adopted_by(self, item_id: str, workload: m.BenchSpec | None = None) -> m.Experiment | None:
        """The adopted experiment that brought `item_id` into the best configuration (None when it is not in it)."""
        found = None
        for e in self.chain(workload):
            if item_id in e.reverts:
                found = None
            if item_id in e.plan_items:
                found = e
        return found

    def rebuild(self, drop: Collection[str] = (), workload: m.BenchSpec | None = None) -> m.ServerConfig:
        """The best configuration rebuilt from the chain of adopted changes without the items in `drop`: the base
        flags, then each adopted step in order, its items applied (reverted ones left out) and then the flags it
        added beyond them (a bounded retry's cap). With nothing dropped it is the best configuration itself."""
        base = self.base_config()
        steps: list[tuple[list[str], m.ServerConfig]] = []  # (items still active, extra flags) per adopted step
        for e in self.chain(workload):
            for items, _ in steps:
                items[:] = [i for i in items if i not in e.reverts]
            expected = self._replay(base, [*steps, ([i for i in e.plan_items if i in self.plan.item_ids()],
                                                      m.ServerConfig())], ())  # fmt: skip
            extra = m.ServerConfig(
                flags=tuple(f for f in e.config.flags if expected.get(f.name) != f), env=dict(e.config.env)
            )
            steps.append(([i for i in e.plan_items if i in self.plan.item_ids()], extra))
        return self._replay(base, steps, drop)

    def _replay(
        self, base: m.ServerConfig, steps: list[tuple[list[str], m.ServerConfig]], drop: Collection[str]
    ) -> m.ServerConfig:
        config = base
        for items, extra in steps:
            for item_id in items:
                if item_id not in drop:
                    config = self.plan.item(item_id).apply(config)
            if extra.flags or extra.env:
                config = config.with_flags(extra)
        return config

    # ---- tiers, answers and items

    def final(
        self, item: m.PlanItem, since: datetime | None = None, before: datetime | None = None
    ) -> list[m.Experiment]:
        """The item's experiments with a verdict (a baseline of its own workload does not settle it)."""
        out = []
        for e in self.experiments:  # an item tested inside a combined experiment counts as tested
            if item.id not in e.plan_items or e.verdict is None or e.kind == "baseline":
                continue
            if since is not None and e.created_at <= since:
                continue
            if before is not None and (e.finished_at or e.created_at) > before:
                continue
            out.append(e)
        return out

    def done(self, item: m.PlanItem, since: datetime | None = None, before: datetime | None = None) -> bool:
        """Whether the item needs no more work: a verdict recorded (after `since`, before `before`), a code item
        (documented for the user), or a workload item whose baseline is judged."""
        if item.kind == "code":
            return True  # documented for the user: there is nothing to run
        if item.workload:
            base = self.baseline(item.workload_for(self.plan.workload))
            if item.flags is None and not item.remove_flags:
                return base is not None and base.verdict is not None
            if base is not None and base.verdict not in (None, "baseline"):
                return True  # its workload's baseline did not run: nothing on that workload can be compared
        return bool(self.final(item, since, before))

    # ---- judging

    def ran(self, config: m.ServerConfig, workload: m.BenchSpec | None = None) -> m.Experiment | None:
        """An experiment that already ran `config` on `workload` (nothing is launched twice as a new experiment)."""
        key = (workload or self.plan.workload).workload_key()
        for e in self.experiments:
            if e.config == config and e.workload.workload_key() == key and self.run_count(e) > 0:
                return e
        return None

    def changed_flags(self, e: m.Experiment) -> list[str]:
        """The flags `e` changes against its base (else the plan's base flags), as typed."""
        base = self.experiment(e.base_experiment_id)
        base_config = base.config if base is not None else self.base_config()
        return [c.name for c in e.config.diff(base_config).flags]

    def unmodelled_change(self, e: m.Experiment) -> tuple[list[str], list[str]]:
        """(changed flags, those of them the engine does not model) for a change; both empty for a baseline."""
        if e.kind == "baseline":
            return [], []
        changed = self.changed_flags(e)
        base = self.experiment(e.base_experiment_id)
        unmodelled = set(e.not_modelled) | set(base.not_modelled if base is not None else [])
        return changed, [f for f in changed if f in unmodelled]

    def run_sd_pct(self, workload: m.BenchSpec | None = None) -> float | None:
        """The run-to-run standard deviation of the objective, in % of the mean, pooled over the experiments on
        `workload` measured more than once (at their top level); None before any."""
        key = (workload or self.plan.workload).workload_key()
        squares, df = 0.0, 0
        for x in self.experiments:
            values = self.ok_values(x) if x.workload.workload_key() == key else {}
            runs = values[max(values)] if values else []
            if len(runs) > 1 and (mean := sum(runs) / len(runs)) > 0:
                squares += sum(((v - mean) / mean * 100) ** 2 for v in runs)
                df += len(runs) - 1
        return (squares / df) ** 0.5 if df else None

    def repeats_exactly(self, workload: m.BenchSpec | None = None) -> bool:
        """Whether every run repeated on `workload` gave the same value (a deterministic engine: the twin without
        noise): another run adds nothing, so no verdict waits for one. No real engine repeats to the last digit."""
        sd = self.run_sd_pct(workload)
        return sd is not None and sd < 1e-9

    def _compared(self, e: m.Experiment) -> tuple[int, list[float], list[float]] | None:
        """(the judged level, the base's runs there, e's runs there) for a change measured against its base."""
        base = self.experiment(e.base_experiment_id)
        before, after = (self.ok_values(base) if base is not None else {}), self.ok_values(e)
        shared = sorted(set(before) & set(after))
        return (shared[-1], before[shared[-1]], after[shared[-1]]) if shared else None

    def _pairs(self, e: m.Experiment) -> bool:
        """Whether e is judged in pairs with its base (tools/method/paired.py: the session's `paired` setting)."""
        return paired.enabled(self.settings.paired, self.runs.get(e.id or 0, []))

    def _pairing(self, e: m.Experiment, base: m.Experiment | None, c: int) -> paired.Pairing | None:
        """e's runs at level c paired with its base's measured before and after them (A/B/A), when e is judged in
        pairs and its base has a run after one of e's; else None (the means are compared)."""
        if base is None or not self._pairs(e):
            return None
        value = self.objective.value_of_run
        return paired.pair(paired.timed(self.runs.get(base.id or 0, []), value, c),
                           paired.timed(self.runs.get(e.id or 0, []), value, c))  # fmt: skip

    def _runs_needed(self, e: m.Experiment, judged: float, band: float, runs: int, base_runs: int,
                     surprise: bool) -> tuple[int, int]:  # fmt: skip
        """The runs a surprise and a gain need before their verdict (judgement.runs_needed), the noise taken at least
        SD_FLOOR_PCT."""
        se = self.floored_se(e, runs, base_runs)
        return runs_needed(judged, band, e.predicted_change_pct if not e.not_modelled else None, surprise, se)

    def floored_se(self, e: m.Experiment, runs: int, base_runs: int) -> float:
        """The standard error of `e`'s change in points, the run-to-run noise taken at least SD_FLOOR_PCT (a noise
        measured on few runs often reads low)."""
        sd = max(self.run_sd_pct(e.workload) or 0.0, SD_FLOOR_PCT)
        return sd * (1 / max(runs, 1) + 1 / max(base_runs, 1)) ** 0.5

    def _unsure_loss(self, e: m.Experiment, judged: float, band: float, runs: int, base_runs: int) -> float | None:
        """The standard error of a loss past the band that it does not clear by LOSS_SE of them (see the module
        docstring), else None."""
        se = self._standard_error(e, runs, base_runs)
        return se if se is not None and -band - LOSS_SE * se < judged <= -band else None

    def _loss_doubts(self, e: m.Experiment, judged: float, band: float, runs: int, base_runs: int,
                     base: m.Experiment | None, moved: bool, suggestion: Suggestion,
                     pairs: paired.Pairing | None) -> tuple[float | None, float | None]:  # fmt: skip
        """Of a loss about to be called a regression, with the search on (the module docstring): the standard error
        it does not clear the band by, where the twin predicted it (no gain at once); else, against a best adopted on
        fewer than NEAR_BAND_RUNS runs, the standard error (the noise taken at least SD_FLOOR_PCT; noisy runs) it
        clears the band by less than CLEAR_SE of (that best measured again first); else the standard error of a loss
        past the band by less than LOSS_SE of them (no gain); else None for each."""
        if suggestion != "regressed" or not self.settings.search:
            return None, None
        unsure = self._unsure_loss(e, judged, band, runs, base_runs) if e.predicted_change_pct is not None else None
        if unsure is not None and judged > -band - unsure:
            return unsure, None  # a surprise is one too
        sd = self.run_sd_pct(e.workload)
        few = rebasable(base, moved)
        p = e.predicted_change_pct if not e.not_modelled else None
        if p is not None and p <= -band:  # a loss the twin foresaw: the best's next run changes no verdict here
            return unsure, None
        if pairs is not None or not sd or not few or base_runs >= NEAR_BAND_RUNS:  # a best measured enough
            return unsure, None
        se = self.floored_se(e, runs, base_runs)
        return (None, se) if judged > -band - CLEAR_SE * se else (unsure, None)

    def _slight_loss(self, e: m.Experiment, judged: float, band: float, runs: int, base_runs: int,
                     suggestion: Suggestion, agreed: bool, exact: bool) -> tuple[Suggestion, float | None]:  # fmt: skip
        """A loss past the band that the twin predicted inside it (the module docstring): on one run where the twin
        agreed, measured again (a second run confirms the loss); about to be measured again and not past the band by
        CLEAR_SE standard errors (the noise taken at least SD_FLOOR_PCT), no gain at once, with that standard error:
        another run could only tell a regression from no gain, and neither is adopted. Else (`suggestion`, None)."""
        p = e.predicted_change_pct if e.predicted_change_pct is not None else float("nan")
        if suggestion == "regressed" and agreed and -band < p and runs < 2 and not exact:
            suggestion = "rerun"  # the twin put it inside the band and one run beyond: a second run confirms the loss
        if suggestion != "rerun" or exact or not self.settings.search or not judged <= -band < p < band:
            return suggestion, None
        se = self.floored_se(e, runs, base_runs)
        return ("no_gain", se) if judged > -band - CLEAR_SE * se else (suggestion, None)

    def _standard_error(self, e: m.Experiment, runs: int, base_runs: int) -> float | None:
        """The standard error of `e`'s measured change in points: the pooled run-to-run noise over its runs and its
        base's; None before any experiment ran twice."""
        sd = self.run_sd_pct(e.workload)
        return sd * (1 / runs + 1 / base_runs) ** 0.5 if sd is not None and runs and base_runs else None

    def _near_band(self, e: m.Experiment, judged: float, band: float, runs: int, base_runs: int, weight: float,
                   rebase: bool) -> float | None:  # fmt: skip
        """The standard error of a gain that lies within it of the band and is not measured enough yet (with the
        search on; see the module docstring), else None: enough is NEAR_BAND_RUNS runs of the change, or, where its
        base may be measured again too (`rebase`), one fewer on each side (more precise, for as many launches, than
        four runs against a base's two; a base measured more keeps the change's four). Where the twin's prediction
        has `weight` in the judged gain, the judged gain's variance is the measurement's times (1 - weight)."""
        enough = runs >= NEAR_BAND_RUNS or (rebase and runs == base_runs == NEAR_BAND_RUNS - 1)
        if not self.settings.search or enough or judged <= 0:
            return None
        se = self._standard_error(e, runs, base_runs)
        se = se * (1 - weight) ** 0.5 if se is not None else None
        return se if se is not None and abs(judged - band) < se else None

    def _suggest(self, change: float, band: float, runs: int, moved: bool, surprise: int = 0, agreed: bool = False,
                 confirm: int = 2) -> Suggestion:  # fmt: skip
        """The verdict a change of `change` % on `runs` runs suggests, by the rules in the module docstring
        (`surprise`: the runs a surprise needs before its verdict; `agreed`: the twin predicted it inside the band
        and the measurement does not contradict that; `confirm`: the runs a gain needs before it is adopted)."""
        if change >= band and change > 0 and moved:
            return "superseded"  # a change tested beside it gained more and became the best
        if runs < surprise and ((change >= band and change > 0) or change <= -band):
            return "rerun"  # the measurement contradicts the prediction: one more run before the verdict
        if change >= band and change > 0 and self.settings.search and runs < confirm:
            return "rerun"  # one lucky run never becomes the bar: a second run confirms it (unless it is clear)
        if change >= band and change > 0:
            return "adopted"
        if change <= -band:
            return "regressed"
        if change > 0 and runs < 1 + self.settings.reruns and not agreed:
            return "rerun"
        return "no_gain"

    def _after_words(self, e: m.Experiment, suggestion: Suggestion, best: m.Experiment | None, c: int,
                     noops: list[str], unmodelled: list[str]) -> str:  # fmt: skip
        """What a change's judgement says after its verdict: the change run beside it that became the best, levels
        that were no measurement, no-op flags and flags the twin does not model."""
        text = ""
        if suggestion == "adopted" and self.settings.search and len(self.ok_values(e).get(c) or []) == 1:
            text += ("; adopted on its one run: every run repeated here gave the same value (no run-to-run noise), so "
                     "a second adds nothing" if self.repeats_exactly(e.workload) else
                     f"; adopted on its one run: past the band by more than {CLEAR_SE:g} standard errors, as the twin "
                     f"predicted ({e.predicted_change_pct or 0.0:+.1f}%), which no draw of the noise explains")  # fmt: skip
        if suggestion == "superseded" and best is not None:
            bv = self.ok_values(best).get(c) or []
            at = f" with {self.objective.number(sum(bv) / len(bv))} {self.objective.at(c)}" if bv else ""
            text += (
                f", but experiment {best.number}, run beside it, became the best{at}: not adopted (the search weighs it "
                "again on the new best)"
            )
        text += self._refused_clause(e)
        if noops:
            text += f"; {', '.join(noops)} {'is' if len(noops) == 1 else 'are'} accepted but read nowhere (no-op)"
        if unmodelled:
            text += (
                f"; the twin does not model {_names(unmodelled)}, also changed: its effect is not in these numbers "
                "(measure it on a GPU)"
            )
        return text

    def _host_clause(self, e: m.Experiment, c: int) -> str:
        """Words when other processes loaded this host differently during e's runs and its base's (a CPU engine
        shares the cores with them: tools/hostload.py), else ''."""

        def busy(x: m.Experiment | None) -> float | None:
            values = [
                lv.host_other_cores
                for r in (self.runs.get(x.id or 0, []) if x is not None else [])
                if (lv := r.level(c)) is not None and lv.host_other_cores is not None
            ]
            return sum(values) / len(values) if values else None

        mine, theirs = busy(e), busy(self.experiment(e.base_experiment_id))
        if mine is None or theirs is None or abs(mine - theirs) < HOST_MOVED_CORES:
            return ""
        return (
            f"; other processes kept {mine:.1f} cores of this host busy during its runs against {theirs:.1f} during "
            "its base's: the host's load moved, so part of this change may be the host's, not the flags'"
        )

    def _baseline_judgement(self, e: m.Experiment, after: dict[int, list[float]], noise: float | None,
                            common: dict) -> Judgement:  # fmt: skip
        """A baseline's reading: its value at the top level, its runs and noise, and whether it meets the objective."""
        top = max(after)
        runs = after[top]
        mean = sum(runs) / len(runs)
        n = self.objective.number
        text = f"{n(mean)} {self.objective.at(top)}"
        if len(runs) > 1:
            word = "spread" if len(runs) == 2 else "noise, twice the standard error of the mean"
            text += f" (mean of {len(runs)} runs: {', '.join(n(v) for v in runs)}; {word} {noise or 0:.1f}%)"
        if mean <= 0:
            text += f"; {unmet_words(self, e)}"
        busy = [lv.host_other_cores for r in self.runs.get(e.id or 0, []) if (lv := r.level(top)) is not None
                and lv.host_other_cores is not None]  # fmt: skip
        if len(busy) > 1 and max(busy) - min(busy) >= HOST_MOVED_CORES:
            text += (f"; other processes kept {min(busy):.1f} to {max(busy):.1f} cores of this host busy across its "
                     "runs: the host's load moved, so part of this spread (the noise band) may be the host's")  # fmt: skip
        text += self._refused_clause(e)
        return Judgement(suggestion="baseline", concurrency=top, after_tok_s=mean, runs_tok_s=runs, text=text, **common)

    def _failure_judgement(self, e: m.Experiment, failed: list[int], common: dict) -> Judgement | None:
        """The judgement of an experiment the engine refused, whose requests failed, or that never started; else
        None."""
        if e.failure in REFUSED_FAILURES and self.run_count(e) == 0:
            return Judgement(suggestion="ruled_out", text=refused_text(e), **common)
        if failed:
            why = f" ({e.failure})" if e.failure else ""
            return Judgement(
                suggestion="crashed",
                text=f"requests failed at concurrency {', '.join(map(str, failed))}{why}",
                **common,
            )
        if e.status == "failed" and self.run_count(e) == 0:
            detail = f": {e.failure_detail}" if e.failure_detail else ""
            what = (
                "the server refused the benchmark's requests"
                if e.failure == "request-refused"
                else "started, then failed every first request"  # up, but its first batch failed (a CUDA OOM)
                if (e.failure_detail or "").startswith("warmup failed")
                else "did not start"
            )
            return Judgement(suggestion="crashed", text=f"{what} ({e.failure or 'failed'}){detail}", **common)
        return None

    def judge(self, e: m.Experiment) -> Judgement:
        """`e` against its base, by the rules in the module docstring."""
        eid = e.id or 0
        band = self.band_pct(e.workload)
        noise = self.noise_pct(e.workload)
        noops = [i.flag for i in e.audit if i.status == "noop"]
        failed = self.failed_levels(e)
        common = {"experiment_id": eid, "base_experiment_id": e.base_experiment_id, "band_pct": band,
                  "noise_pct": noise, "noop_flags": noops, "failed_levels": failed}  # fmt: skip
        if (failure := self._failure_judgement(e, failed, common)) is not None:
            return failure
        changed, unmodelled = self.unmodelled_change(e)
        common["not_modelled"] = unmodelled
        if changed and len(unmodelled) == len(changed):
            return Judgement(suggestion="not_measured", text=not_measured_text(unmodelled), **common)
        after = self.ok_values(e)
        if not after:
            return Judgement(suggestion="pending", text="not measured yet", **common)
        if e.kind == "baseline":
            return self._baseline_judgement(e, after, noise, common)
        compared = self._compared(e)
        if compared is None:
            return Judgement(suggestion="pending", text="no level to compare with its base", **common)
        c, before_runs, runs = compared
        base = self.experiment(e.base_experiment_id)
        pairs = self._pairing(e, base, c)
        b = pairs.ref_mean if pairs else sum(before_runs) / len(before_runs)
        a = sum(runs) / len(runs)
        # a base that met the objective nowhere (0 good req/s): any value above it is a gain beyond every band
        change = pairs.change_pct if pairs else (a - b) / b * 100 if b > 0 else (100.0 if a > 0 else 0.0)
        band, spread_note = own_band(pairs.ratios if pairs else runs, band)  # its own runs may disagree more
        common["band_pct"] = band
        judged, combined, weight = self.with_twin(e, change, len(runs), len(before_runs), band)
        best = self.best(e.workload)
        moved = (  # another change was adopted since e was launched on its base (an executor ran them side by side)
            best is not None and e.base_experiment_id is not None and best.id not in (e.id, e.base_experiment_id)
        )
        surprise = self._surprise(e, change, band)
        p_pct = e.predicted_change_pct if e.predicted_change_pct is not None else float("nan")
        agreed = self.settings.search and not surprise and not e.not_modelled and p_pct < band
        exact = self.settings.search and self.repeats_exactly(e.workload)  # a deterministic engine: no reruns
        need, confirm = (0, 1) if exact else self._runs_needed(e, judged, band, len(runs), len(before_runs), surprise)
        suggestion = self._suggest(judged, band, len(runs), moved, need, agreed or exact, confirm)
        suggestion, slight = self._slight_loss(e, judged, band, len(runs), len(before_runs), suggestion, agreed, exact)
        host_note = self._host_clause(e, c)
        if host_note and suggestion in ("adopted", "regressed") and len(runs) < 2:
            suggestion = "rerun"  # one run on a host whose load moved: measured again before the verdict
        rebase = (suggestion in paired.DECISIVE and pairs is None and not moved and self._pairs(e)
                  and base is not None and base.status == "finished")  # fmt: skip  # (a failed re-measure: no more)
        suggestion = "rebase" if rebase else suggestion  # the base measured again after it (A/B/A) first
        unsure, once = self._loss_doubts(e, judged, band, len(runs), len(before_runs), base, moved, suggestion, pairs)
        suggestion = "no_gain" if unsure is not None else "rebase" if once is not None else suggestion
        near = (self._near_band(e, judged, band, len(runs), len(before_runs), weight, rebasable(base, moved))
                if suggestion in ("adopted", "no_gain") and not rebase and pairs is None else None)  # fmt: skip
        suggestion = near_move(base, len(before_runs), moved, len(runs)) if near is not None else suggestion
        doubt, unheard, again = (self._doubt(e, judged, band, len(runs), len(before_runs), weight, base, moved)
                                 if suggestion == "adopted" and agreed and -band < p_pct else (None, None, False))  # fmt: skip
        suggestion = "no_gain" if doubt is not None else "rebase" if again else suggestion
        n = self.objective.number
        measured = f"{n(a)}" if len(runs) == 1 else f"{n(a)}, mean of {len(runs)} runs: {', '.join(n(v) for v in runs)}"
        text = (
            (
                f"{change:+.1f}% {self.objective.at(c)} ({n(b)} -> {measured}; experiment "
                f"{self.number(e.base_experiment_id)} -> {e.number})"
            )
            + combined
            + (pairs.words(self.number(e.base_experiment_id)) if pairs else "")
            + spread_note
            + host_note
            + (paired.rebase_words(self.number(e.base_experiment_id), band) if rebase else
               words.slight_loss_clause(band, slight, p_pct, len(runs)) if slight is not None and suggestion == "no_gain"
               else
               f", past the {band:.1f}% noise band by less than {LOSS_SE:g} standard errors ({unsure:.1f} points "
               f"each) against the "
               f"{e.predicted_change_pct or 0.0:+.1f}% predicted: no gain, not a regression" if
               unsure is not None and suggestion == "no_gain" else
               words.unheard_clause(band, unheard, p_pct, len(before_runs)) if unheard is not None and again else
               words.few_runs_clause(judged, band, once, self.number(e.base_experiment_id), len(before_runs))
               if once is not None else
               words.near_clause(judged, band, near, len(runs), self.number(base.id) if suggestion == "rebase" else None,
                                 len(before_runs))
               if near is not None else
               f", beyond the {band:.1f}% noise band by less than its standard error ({doubt:.1f} points) where the "
               f"twin predicted {p_pct:+.1f}%, inside it: no gain, not an adoption" if doubt is not None else
               words.verdict_clause(e, suggestion, surprise, change, judged, band, noise, self.settings.min_gain_pct))
        )  # fmt: skip
        text += self._after_words(e, suggestion, best, c, noops, unmodelled)
        return Judgement(
            suggestion=suggestion,
            concurrency=c,
            before_tok_s=b,
            after_tok_s=a,
            runs_tok_s=runs,
            change_pct=change,
            judged_pct=judged,
            text=text,
            **common,
        )
