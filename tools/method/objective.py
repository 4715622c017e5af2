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

The values and words are the core model's (agent/models/objective.py: `Objective.value`, `value_of_run`,
`number`, `at`, `change_words`), so the reports, which read the ledger alone, write the same numbers; this module
adds the prediction. A run's judged values come from `value_of_run(result)`: by concurrency level for the per-level objectives, and one
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


class Objective(Protocol):
    """The value a run is judged by, its metric's name and unit, and how verdicts write it."""

    @property
    def name(self) -> str:
        """throughput, goodput, capacity or energy."""
        ...

    @property
    def metric(self) -> str:
        """The level's key (bench_serving's spelling), e.g. "output_throughput"; "capacity" for capacity."""
        ...

    @property
    def unit(self) -> str:
        """E.g. "output tok/s", "good req/s", "concurrent requests", "output tok/J"."""
        ...

    @property
    def what(self) -> str:
        """The objective in words, e.g. "capacity at TTFT <= 500 ms, TPOT <= 50 ms"."""
        ...

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


@dataclass(frozen=True)
class PlanObjective:
    """The plan's `[objective]` as the method reads it: its value, words and unit from the core model
    (agent/models/objective.py: the reports read the same), and its prediction from an engine's predictor."""

    objective: m.Objective = field(default_factory=m.Objective)

    @property
    def name(self) -> str:
        return self.objective.kind

    @property
    def metric(self) -> str:
        return self.objective.metric

    @property
    def unit(self) -> str:
        return self.objective.unit

    @property
    def what(self) -> str:
        return self.objective.what

    def value(self, level: m.BenchLevel) -> float | None:
        return self.objective.value(level)

    def value_of_run(self, result: m.BenchResult) -> dict[int, float]:
        return self.objective.value_of_run(result)

    def predict(
        self, predictor: Predictor, config: m.ServerConfig, spec: m.BenchSpec, level: int
    ) -> tuple[Prediction, float | None]:
        """One predicted level for the per-level objectives. For capacity: the reading at the compared level (a
        predicted crash shows there) and the predicted crossing, bisected on the predictor's levels at several loads
        (tools/loadgen/capacity.py: at most PREDICTION_STEPS predictions, each cached by the predictor); 0 when even
        the lowest load is predicted to miss the target."""
        p = predictor.predict(config, spec, level)
        if p.crashed or p.level is None:
            return p, None
        if self.objective.kind != "capacity":
            return p, self.value(p.level)
        from tools.loadgen.capacity import CapacityPlan, attainment, predicted_capacity, twin_predict

        plan = CapacityPlan.of(self.objective, spec)
        predict = twin_predict(predictor, config, spec, plan)
        value = predicted_capacity(predict, plan) if predict is not None else None
        if predict is None or value is None:
            return p, None
        if value <= plan.load_min:  # predicted_capacity gives the lowest load both when it meets and when it misses
            lowest = predict(plan.load_min)
            value = plan.load_min if lowest is not None and attainment(lowest) >= plan.target else 0.0
        return p, value

    def number(self, value: float) -> str:
        return self.objective.number(value)

    def at(self, concurrency: int) -> str:
        return self.objective.at(concurrency)

    def change_words(self, before: float, after: float) -> str:
        return self.objective.change_words(before, after)


THROUGHPUT = PlanObjective()


def objective_for(plan: m.Plan | m.Objective) -> Objective:
    """The objective a plan's `[objective]` asks for (throughput when it sets none)."""
    o = plan.objective if isinstance(plan, m.Plan) else plan
    return THROUGHPUT if o == THROUGHPUT.objective else PlanObjective(o)


def noise_pct(values: list[float]) -> float | None:
    """Twice the standard error of the mean of `values`, in % of the mean (None for fewer than two values): about a
    95% bound on how far the mean of these runs is from the configuration's true value (m.BenchLevel.noise_pct: the
    reports read the same statistic)."""
    return m.BenchLevel.noise_pct(values)
