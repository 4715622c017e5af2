"""The ledger, read once per rendering: the `Ledger` read model (figures, spreads, the noise band, the best per
level) and the plan checks' warnings per item."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent import models as m
from agent.store import Store
from tools.reports.common import KEPT_VERDICTS


@dataclass
class Ledger:
    """Everything a report needs about one session, read from the store."""

    record: m.Session
    experiments: list[m.Experiment]
    levels: dict[int, dict[int, m.BenchLevel]]  # experiment -> concurrency -> the mean of its runs (BenchLevel.mean)
    sources: dict[int, str]
    telemetry: dict[int, dict[int, m.Telemetry]]
    findings: list[m.Finding]
    documents: list[m.Document]
    pivots: list[m.Pivot]
    runs: dict[int, int] = field(default_factory=dict)  # experiment -> benchmark runs (reruns average)
    usage: list[m.ModelUsage] = field(default_factory=list)  # the model's use, one row per agent run
    investigations: list[m.Investigation] = field(default_factory=list)  # sub-agent reports (agent/investigate.py)
    # experiment -> concurrency -> the noise of its runs' objective (output tok/s by default; twice the standard error of their mean, in %;
    # for two runs their spread (max - min) / mean), where it has two or more
    spread_pct: dict[int, dict[int, float]] = field(default_factory=dict)
    capacity: dict[int, list[m.Capacity]] = field(default_factory=dict)  # experiment -> its runs' capacity brackets
    launched: dict[int, list[str]] = field(default_factory=dict)  # experiment -> the argv its last server ran

    @classmethod
    def read(cls, store: Store, session_id: str) -> Ledger:
        record = store.get_session(session_id)
        experiments = store.experiments(record.id)
        levels: dict[int, dict[int, m.BenchLevel]] = {}
        sources: dict[int, str] = {}
        telemetry: dict[int, dict[int, m.Telemetry]] = {}
        runs: dict[int, int] = {}
        spread: dict[int, dict[int, float]] = {}
        capacity: dict[int, list[m.Capacity]] = {}
        objective = record.plan.objective  # the values the method judges (output tok/s by default)
        for e in experiments:
            eid = e.id or 0
            by_level: dict[int, list[m.BenchLevel]] = {}
            results = store.bench_results(eid)
            runs[eid] = len(results)
            for result in results:
                sources[eid] = result.source
                if result.capacity is not None:
                    capacity.setdefault(eid, []).append(result.capacity)
                for level in result.levels:
                    if level.max_concurrency is not None:
                        by_level.setdefault(level.max_concurrency, []).append(level)
            levels[eid] = {c: m.BenchLevel.mean(lvs) for c, lvs in by_level.items()}
            by_value: dict[int, list[float]] = {}  # the plan's objective per level and run (output tok/s by default)
            for result in results:
                for c, value in objective.value_of_run(result).items():
                    by_value.setdefault(c, []).append(value)
            for c, values in by_value.items():
                if (noise := m.BenchLevel.noise_pct(values)) is not None:
                    spread.setdefault(eid, {})[c] = noise
            telemetry[eid] = {t.max_concurrency: t for t in store.telemetry(eid) if t.max_concurrency is not None}
        return cls(
            record=record,
            experiments=experiments,
            levels=levels,
            sources=sources,
            telemetry=telemetry,
            findings=store.findings(record.id),
            documents=store.documents(record.id),
            pivots=store.pivots(record.id),
            runs=runs,
            usage=store.usage(record.id),
            investigations=store.investigations(record.id),
            spread_pct=spread,
            capacity=capacity,
            launched={s.experiment_id: s.argv for s in store.servers(record.id) if s.experiment_id is not None},
        )

    def band_pct(self) -> float:
        """The noise band, as the method sets it: max(the session's minimum gain, the noise of the baseline's runs at
        its highest level that completed: twice the standard error of their mean)."""
        floor = self.record.settings.min_gain_pct
        base = self.baseline()
        if base is None:
            return floor
        ok = self.ok_levels(base)
        spread = self.spread_pct.get(base.id or 0, {}).get(max(ok)) if ok else None
        return max(floor, spread or 0.0)

    @property
    def plan(self) -> m.Plan:
        return self.record.plan

    def experiment(self, experiment_id: int | None) -> m.Experiment | None:
        return next((e for e in self.experiments if e.id == experiment_id), None)

    def number(self, experiment_id: int | None) -> int | None:
        """The session's number of the experiment with this ledger id (what a user and a model call it)."""
        e = self.experiment(experiment_id)
        return e.number if e is not None else None

    def ok_levels(self, e: m.Experiment) -> dict[int, m.BenchLevel]:
        """Levels that completed requests without failures."""
        return {c: lv for c, lv in self.levels.get(e.id or 0, {}).items() if lv.holds}

    def figure(self, e: m.Experiment) -> tuple[float, int, int] | None:
        """The one number every view gives for an experiment: (output tok/s, concurrency, runs), the mean of its
        runs at the level it is judged at, as the method judges it: the highest level both it and the experiment it
        changed completed (its own highest for a baseline or a run with no base), levels with failed requests or
        refused as measurements left out. None when nothing completed, or when the engine did not model the change
        (its numbers say nothing of it)."""
        ok = self.ok_levels(e)
        if not ok or e.verdict == "not_measured":
            return None
        base = None if e.kind == "baseline" or e.verdict == "baseline" else self.base_of(e)
        shared = sorted(set(ok) & set(self.ok_levels(base))) if base is not None else []
        c = shared[-1] if shared else max(ok)
        return ok[c].output_throughput, c, self.runs.get(e.id or 0, 0)

    def figure_text(self, e: m.Experiment) -> str:
        """`figure` in words: "2,046 @2048 (2 runs)" (the mean of 2 runs), "" when there is none."""
        found = self.figure(e)
        if found is None:
            return ""
        tok_s, c, runs = found
        return f"{tok_s:,.0f} @{c} ({runs} run{'s' if runs != 1 else ''})"

    def best(self) -> m.Experiment | None:
        """The best configuration now on the plan's workload, as the method reads it: the last adopted change, else
        the baseline."""
        key = self.workload_key()
        adopted = [e for e in self.experiments if e.verdict == "adopted" and e.workload.workload_key() == key]
        return adopted[-1] if adopted else self.baseline()

    def base_of(self, e: m.Experiment) -> m.Experiment | None:
        return self.experiment(e.base_experiment_id)

    def baseline(self) -> m.Experiment | None:
        for e in self.experiments:
            if e.kind == "baseline" or e.verdict == "baseline":
                return e
        return None

    def change_text(self, e: m.Experiment) -> str:
        """What the experiment changed, in SGLang's spelling: against its base, else the plan's base flags."""
        base = self.base_of(e)
        if e.kind == "imported":  # the label the user gave it, then what it ran with
            flags = config_text(e.config) if base is None else str(e.config.diff(base.config))
            label = f"imported {e.title!r}" if e.title else "imported"
            return f"{label}: {flags or '(flags not given)'}"
        if e.kind == "baseline" or e.verdict == "baseline":
            return "base flags: " + config_text(e.config)
        diff = e.config.diff(base.config if base else self.plan.target.base_config())
        return str(diff)

    def unmodelled(self, e: m.Experiment) -> list[str]:
        """The flags `e` changes that its engine does not model (recorded on the experiments), as typed."""
        if e.kind == "baseline" or e.verdict == "baseline":
            return []
        base = self.base_of(e)
        gone = set(e.not_modelled) | set(base.not_modelled if base is not None else [])
        if not gone:
            return []
        diff = e.config.diff(base.config if base else self.plan.target.base_config())
        return [c.name for c in diff.flags if c.name in gone]

    def not_measured_text(self, e: m.Experiment) -> str:
        """What a report says of a change the engine could not measure, and what would measure it."""
        flags = self.unmodelled(e)
        names = ", ".join(flags) if flags else "the flags this change touches"
        return f"the twin does not model {names}; measure it on a GPU"

    def power_w(self, e: m.Experiment, c: int) -> tuple[float | None, float | None]:
        """(mean power per GPU, power limit) at a level, from telemetry."""
        t = self.telemetry.get(e.id or 0, {}).get(c)
        if t is None:
            return None, None
        watts = [g.power_w_mean for g in t.gpus if g.power_w_mean is not None]
        limits = [g.power_limit_w for g in t.gpus if g.power_limit_w]
        return (sum(watts) / len(watts) if watts else None), (sum(limits) / len(limits) if limits else None)

    def energy(self, e: m.Experiment, c: int) -> tuple[float | None, float | None]:
        """(mean power per GPU in W, joules of all GPUs per output token) at a level: the level's own figures
        (measured with it, or the twin's power model), else its telemetry's."""
        level = self.levels.get(e.id or 0, {}).get(c)
        watts = level.mean_gpu_power_w if level is not None else None
        joules = level.energy_per_output_token_j if level is not None else None
        t = self.telemetry.get(e.id or 0, {}).get(c)
        if watts is None:
            watts = self.power_w(e, c)[0]
        if joules is None and t is not None and t.energy_j and t.output_tokens:
            joules = t.energy_j / t.output_tokens
        return watts, joules

    def capacity_of(self, e: m.Experiment) -> m.Capacity | None:
        """The experiment's capacity bracket: its last run's (None when it ran no capacity search)."""
        found = self.capacity.get(e.id or 0)
        return found[-1] if found else None

    def item_experiments(self, item_id: str) -> list[m.Experiment]:
        return [e for e in self.experiments if item_id in e.plan_items]  # combined experiments name every item

    def taken_back(self, item_id: str) -> m.Experiment | None:
        """The adopted revert that took the item back out of the best configuration, if any (the latest)."""
        reverts = [e for e in self.experiments if item_id in e.reverts and e.verdict == "adopted"]
        return reverts[-1] if reverts else None

    def best_by_level(self) -> dict[int, tuple[m.Experiment, m.BenchLevel]]:
        """Per concurrency, the highest output tok/s among the configurations that stand (baseline, adopted, not
        judged) on the reference workload; a level none of them measured falls back to any experiment's."""
        key = self.workload_key()
        kept: dict[int, tuple[m.Experiment, m.BenchLevel]] = {}
        other: dict[int, tuple[m.Experiment, m.BenchLevel]] = {}
        for e in self.experiments:
            if e.workload.workload_key() != key:
                continue
            target = kept if e.verdict in KEPT_VERDICTS else other
            for c, lv in self.ok_levels(e).items():
                if c not in target or lv.output_throughput > target[c][1].output_throughput:
                    target[c] = (e, lv)
        return {c: kept.get(c) or other[c] for c in sorted(set(kept) | set(other))}

    def workload_key(self) -> str:
        """The workload results are compared on: the baseline's (an import may differ from the plan's), else the plan's."""
        base = self.baseline()
        return (base.workload if base else self.plan.workload).workload_key()

    def analysed_experiment(self) -> int | None:
        """The experiment the root cause describes: the best one at the top level if analysed, else the latest."""
        analysed = [f.experiment_id for f in self.findings if f.kind == "bottleneck" and f.experiment_id]
        if not analysed:
            return None
        best = self.best_by_level()
        if best:
            top = best[max(best)][0].id
            if top in analysed:
                return top
        return analysed[-1]


def config_text(config: m.ServerConfig) -> str:
    """The flags of a config without --model-path (the target names the model)."""
    return str(config.without("--model-path", "--model"))


def plan_warnings(ledger: Ledger) -> dict[str, list[str]]:
    """Per plan item, the plan checks' warnings and errors recorded in the ledger ("error: ...", "warning: ..."),
    errors first: what a pivot option proposing the item, its document and the summary's next steps must say.
    The checks are tools/analysis/ `check_plan`; they run with every document and summary the tools write."""
    out: dict[str, list[str]] = {}
    claims = [f for f in ledger.findings if f.kind == "claim" and f.plan_item and f.severity in ("warning", "error")]
    for f in sorted(claims, key=lambda f: (f.severity != "error", f.plan_item or "")):
        out.setdefault(f.plan_item or "", []).append(f"{f.severity}: {f.text}")
    return out


def _items(e: m.Experiment) -> str:
    """The plan items an experiment names: "05", "05+06" for a combined step, "-01" for a revert of 01."""
    return ("+".join(e.plan_items) + "".join(f" -{i}" for i in e.reverts)).strip()
