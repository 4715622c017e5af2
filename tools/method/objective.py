"""What the method optimizes: an Objective turns a run into the value every comparison judges, in its own words.

Every reading of "the number a change is judged by" goes through one Objective: the method's judgement, the noise
band and the best configuration (tools/method/reading.py), the search's predictions and their correction to the
campaign (tools/search.py), and the words of verdicts, pivots and summaries. The plan's `[objective]`
(agent/models/objective.py) picks one:

- throughput: output tok/s at the judged level (bench_serving's `output_throughput`), the default;
- goodput: request goodput (good req/s, SGLang's `request_goodput`) or token goodput (output tok/s of the requests
  that met every SLO, pivot's `token_goodput_tok_s`) at the judged level;
- energy: output tokens per joule at the judged level (1 / `energy_per_output_token_j`); under SLOs only the tokens
  of good requests count, and a level whose attainment is under the target does not count at all;
- capacity: the highest load whose SLO attainment meets the target, a value per run (the bracket a capacity search
  found, `BenchResult.capacity`), not per level.

A run's judged values come from `value_of_run(result)`: by concurrency level for the per-level objectives, and one
value for capacity, filed under the workload's highest concurrency (the level a run is compared at), so the callers
need no special case. A prediction's value comes from `predict(predictor, config, spec, level)`: one predicted level
for the per-level objectives; for capacity, the predicted crossing (the twin's levels at several loads, bisected,
each cached by the predictor).

The noise statistic lives here too, because it is a statement about the judged values: twice the standard error of
the reference's mean over its runs (2 x sample standard deviation / sqrt(runs), in % of the mean). For two runs it
equals their spread (max - min) / mean; every further run narrows it by about sqrt(n / (n + 1)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agent import models as m
from agent.contracts import Prediction, Predictor
from agent.models.objective import DEFAULT_ATTAINMENT


class Objective(Protocol):
    """The value a run is judged by, its metric's name and unit, and how verdicts write it."""

    name: str  # e.g. "throughput"
    metric: str  # the level's key (bench_serving's spelling), e.g. "output_throughput"
    unit: str  # e.g. "output tok/s"

    def value(self, level: m.BenchLevel) -> float | None:
        """The judged value of one level; None when the level does not count (it failed or completed nothing)."""
        ...

    def value_of_run(self, result: m.BenchResult) -> dict[int, float]:
        """The judged values of one run, by the concurrency they are compared at (levels that count only)."""
        ...

    def predict(
        self, predictor: Predictor, config: m.ServerConfig, spec: m.BenchSpec, level: int
    ) -> tuple[Prediction, float | None]:
        """The predictor's reading of `config` at `level` of `spec`, and the objective's predicted value."""
        ...

    def number(self, value: float) -> str:
        """A value as verdicts write it, without its unit."""
        ...

    def at(self, concurrency: int) -> str:
        """What was measured where, after a number or a change: "output tok/s at concurrency 64"."""
        ...

    def change_words(self, before: float, after: float) -> str:
        """A change in the objective's words: "capacity at TPOT <= 50 ms from 640 to 896 concurrent requests
        (+40%)"."""
        ...


def _num(x: float) -> str:
    """Three significant figures at least: 1,234 / 45.6 / 3.21 / 0.0512."""
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if abs(x) >= 0.1 or x == 0 else f"{x:.3g}"


def _pct_words(before: float, after: float) -> str:
    return f"{(after - before) / before * 100:+.0f}%" if before > 0 else "from nothing"


def _counts(level: m.BenchLevel) -> bool:
    """A level counts when it ran at a concurrency and holds (completed requests, none failed, a measurement)."""
    return level.max_concurrency is not None and level.holds


@dataclass(frozen=True)
class _PerLevel:
    """An objective read at each level of a run (throughput, goodput, energy): the shared behaviour."""

    name: str = "throughput"
    metric: str = "output_throughput"
    unit: str = "output tok/s"
    what: str = "output tok/s"  # the objective in words, for "raised ... from A to B"

    def value(self, level: m.BenchLevel) -> float | None:
        raise NotImplementedError

    def value_of_run(self, result: m.BenchResult) -> dict[int, float]:
        out: dict[int, float] = {}
        for lv in result.levels:
            v = self.value(lv)
            if v is not None and lv.max_concurrency is not None:
                out[lv.max_concurrency] = v
        return out

    def predict(
        self, predictor: Predictor, config: m.ServerConfig, spec: m.BenchSpec, level: int
    ) -> tuple[Prediction, float | None]:
        p = predictor.predict(config, spec, level)
        return p, (None if p.crashed or p.level is None else self.value(p.level))

    def number(self, value: float) -> str:
        return _num(value)

    def at(self, concurrency: int) -> str:
        return f"{self.unit} at concurrency {concurrency}"

    def change_words(self, before: float, after: float) -> str:
        return (
            f"{self.what} from {self.number(before)} to {self.number(after)} {self.unit} ({_pct_words(before, after)})"
        )


@dataclass(frozen=True)
class Throughput(_PerLevel):
    """Output tok/s of a level that completed with no failed request (pivot's objective so far)."""

    def value(self, level: m.BenchLevel) -> float | None:
        if not _counts(level):
            return None
        return level.output_throughput

    def number(self, value: float) -> str:
        return f"{value:,.0f}"

    def change_words(self, before: float, after: float) -> str:
        return f"output tok/s from {before:,.0f} to {after:,.0f} ({_pct_words(before, after)})"


THROUGHPUT = Throughput()


@dataclass(frozen=True)
class Goodput(_PerLevel):
    """Request goodput (good req/s) or token goodput (output tok/s of good requests) at the level, by the plan's
    SLOs (a level measured without them has no goodput and does not count)."""

    slos: str = ""  # "TTFT <= 500 ms, TPOT <= 50 ms"

    def value(self, level: m.BenchLevel) -> float | None:
        if not _counts(level):
            return None
        v = level.request_goodput if self.metric == "request_goodput" else level.token_goodput_tok_s
        return None if v is None else float(v)

    def at(self, concurrency: int) -> str:
        return f"{self.unit} at concurrency {concurrency} ({self.slos})"


@dataclass(frozen=True)
class Energy(_PerLevel):
    """Output tokens per joule at the level (1 / J per output token); under SLOs only the good requests' tokens,
    and a level under the attainment target does not count."""

    slos: str = ""  # "" when the energy is not judged under SLOs
    target: float = DEFAULT_ATTAINMENT

    def value(self, level: m.BenchLevel) -> float | None:
        j = level.energy_per_output_token_j
        if not _counts(level) or j is None or j <= 0:
            return None
        if not self.slos:
            return 1.0 / j
        if level.slo_attainment is None or level.slo_attainment < self.target or level.token_goodput_tok_s is None:
            return None
        share = level.token_goodput_tok_s / level.output_throughput if level.output_throughput > 0 else 0.0
        return share / j

    def at(self, concurrency: int) -> str:
        return f"{self.unit} at concurrency {concurrency}" + (f" ({self.slos})" if self.slos else "")


@dataclass(frozen=True)
class Capacity:
    """The highest load whose SLO attainment meets the target: one value per run, the bracket's lower end that its
    capacity search found (`BenchResult.capacity`; 0 when even the lowest load tried missed the target)."""

    objective: m.Objective = field(default_factory=lambda: m.Objective(kind="capacity", tpot_ms=100))
    name: str = "capacity"
    metric: str = "capacity"
    unit: str = "concurrent requests"

    @property
    def what(self) -> str:
        return f"capacity at {self.objective.slo_words()}"

    def value(self, level: m.BenchLevel) -> float | None:
        """A level alone has no capacity (it is a property of a run's levels at several loads)."""
        return None

    def value_of_run(self, result: m.BenchResult) -> dict[int, float]:
        cap = result.capacity
        if cap is None or not result.spec.concurrency:
            return {}
        return {max(result.spec.concurrency): float(cap.capacity or 0.0)}

    def predict(
        self, predictor: Predictor, config: m.ServerConfig, spec: m.BenchSpec, level: int
    ) -> tuple[Prediction, float | None]:
        """The twin's reading at the compared level (a predicted crash shows there), and its predicted capacity:
        the crossing bisected on its levels at several loads (tools/loadgen/capacity.py, at most PREDICTION_STEPS
        predictions, each cached by the predictor)."""
        from tools.loadgen.capacity import CapacityPlan, predicted_capacity, twin_predict

        p = predictor.predict(config, spec, level)
        if p.crashed or p.level is None:
            return p, None
        plan = CapacityPlan.of(self.objective, spec)
        predict = twin_predict(predictor, config, spec, plan)
        value = predicted_capacity(predict, plan) if predict is not None else None
        if value is None:
            return p, None
        if value <= plan.load_min:  # the lowest load predicted to miss the target, or to just meet it
            level_at = predict(plan.load_min) if predict is not None else None
            met = level_at is not None and (level_at.slo_attainment or 0.0) >= plan.target
            value = plan.load_min if met else 0.0
        return p, value

    def number(self, value: float) -> str:
        return f"{value:,.0f}" if self.objective.load == "concurrency" else _num(value)

    def at(self, concurrency: int) -> str:
        share = f"{self.objective.attainment_target * 100:g}% of requests"
        return f"{self.unit} of capacity at {self.objective.slo_words()} ({share})"

    def change_words(self, before: float, after: float) -> str:
        return (
            f"{self.what} from {self.number(before)} to {self.number(after)} {self.unit} ({_pct_words(before, after)})"
        )


def objective_for(plan: m.Plan | m.Objective) -> Objective:
    """The objective a plan's `[objective]` asks for (throughput when it sets none)."""
    o = plan.objective if isinstance(plan, m.Plan) else plan
    slos = o.slo_words()
    if o.kind == "goodput":
        if o.goodput == "request":
            return Goodput("goodput", "request_goodput", "good req/s", f"request goodput at {slos}", slos)
        return Goodput("goodput", "token_goodput_tok_s", "good output tok/s", f"token goodput at {slos}", slos)
    if o.kind == "energy":
        return Energy("energy", "energy_per_output_token_j", "output tok/J",
                      "output tokens per joule" + (f" at {slos}" if slos else ""), slos, o.attainment_target)  # fmt: skip
    if o.kind == "capacity":
        return Capacity(o, unit=o.unit)
    return THROUGHPUT


def noise_pct(values: list[float]) -> float | None:
    """Twice the standard error of the mean of `values`, in % of the mean (None for fewer than two values): about a
    95% bound on how far the mean of these runs is from the configuration's true value (m.BenchLevel.noise_pct: the
    reports read the same statistic)."""
    return m.BenchLevel.noise_pct(values)
