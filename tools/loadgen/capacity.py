"""Capacity: the highest load at which SLO attainment still meets a target, found per experiment by levels that
bracket the crossing (measured levels alone when the engine has no predictor: vLLM's campaigns).

The load is concurrency (max_concurrency) or a request rate with Poisson arrivals (the objective's `load`). A load
"meets" the target when its level's `slo_attainment` (good requests / requests sent, failures counting against)
is at least the target. The search knows what was measured already (the workload's own levels, on the concurrency
axis) and where a predictor (the twin) places the crossing, then measures one level at a time:

1. the predicted capacity, when it lies inside the bracket still open (else the bracket's geometric middle);
2. one step of `resolution` beside it (above when it met the target, below when it did not): with a good
   prediction, the crossing is bracketed in two levels;
3. the bracket [highest load that met, lowest load above it that missed] halved geometrically until
   upper / lower - 1 <= resolution (or the loads are neighbouring integers); an open bracket doubles outwards
   to the bounds. At most `max_levels` levels are measured; the bracket and every point are reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agent import models as m
from agent.contracts import Deployment, Engine, Predictor

DEFAULT_RATE_MIN = 0.1  # req/s
DEFAULT_RATE_MAX = 1000.0
PREDICTION_STEPS = 12  # predictor calls to place the first bracket, at most
OPEN_ABOVE = 8  # the concurrency a search may reach, as a multiple of the workload's highest, when none is given


@dataclass(frozen=True)
class CapacityPlan:
    """What to bracket: the load axis and its bounds, the SLOs and the target, and the level budget."""

    axis: m.LoadAxis
    slos_ms: dict[str, float]
    target: float
    load_min: float
    load_max: float
    max_levels: int
    resolution: float
    rate_cap: int  # on the request-rate axis: the max_concurrency every level keeps (the workload's highest)

    @classmethod
    def of(cls, objective: m.Objective, spec: m.BenchSpec) -> CapacityPlan:
        """The plan of a capacity objective on a workload: bounds default to the workload's lowest level up to
        OPEN_ABOVE times its highest (concurrency), or 0.1 to 1000 req/s (request rate)."""
        if objective.kind != "capacity" or not objective.slos_ms:
            raise ValueError("a capacity search needs a capacity objective with SLOs")
        conc = objective.load == "concurrency"
        lo = objective.load_min or (min(spec.concurrency) if conc else DEFAULT_RATE_MIN)
        # a sweep whose every level meets the SLOs says only "at least its top": the search goes on doubling past
        # it (up to OPEN_ABOVE x the top level) unless the objective bounds it (load_max)
        hi = objective.load_max or (max(spec.concurrency) * OPEN_ABOVE if conc else DEFAULT_RATE_MAX)
        if hi <= lo:  # one workload level: search up to 4x it
            hi = lo * 4
        return cls(objective.load, dict(objective.slos_ms), objective.attainment_target, float(lo), float(hi),
                   objective.max_levels, objective.resolution, max(spec.concurrency))  # fmt: skip

    def load_of(self, x: float) -> float:
        """A load on this axis within the bounds: concurrency is a whole number."""
        x = min(max(x, self.load_min), self.load_max)
        return float(round(x)) if self.axis == "concurrency" else float(f"{x:.4g}")

    def spec_at(self, spec: m.BenchSpec, load: float) -> m.BenchSpec:
        """The workload's one level at `load`, judged by the SLOs."""
        update: dict[str, object] = {"goodput_slos_ms": dict(self.slos_ms)}
        if self.axis == "concurrency":
            update["concurrency"] = [int(load)]
        else:
            update |= {"concurrency": [self.rate_cap], "request_rate": load,
                       "num_prompts": spec.num_prompts or spec.prompts_for(self.rate_cap)}  # fmt: skip
        return spec.model_copy(update=update)

    def level_index(self, level: m.BenchLevel) -> float | None:
        """The load a measured level ran at, on this axis (None when it is not one of this axis' levels)."""
        if self.axis == "concurrency":
            rate = level.request_rate
            if isinstance(rate, int | float) and math.isfinite(rate):
                return None
            return None if level.max_concurrency is None else float(level.max_concurrency)
        rate = level.request_rate
        return float(rate) if isinstance(rate, int | float) and math.isfinite(rate) else None


def attainment(level: m.BenchLevel) -> float:
    """A level's SLO attainment; 0 when it has none (nothing was sent, or the server was down)."""
    return float(level.slo_attainment) if level.slo_attainment is not None else 0.0


def predicted_capacity(predict: Callable[[float], m.BenchLevel | None], plan: CapacityPlan) -> float | None:
    """Where a predictor places the crossing: the highest load in the bounds whose predicted attainment meets the
    target, by geometric bisection (PREDICTION_STEPS calls at most); None when the predictor has no reading."""

    def meets(x: float) -> bool | None:
        level = predict(x)
        return None if level is None else attainment(level) >= plan.target

    lo, hi = plan.load_min, plan.load_max
    top, bottom = meets(hi), meets(lo)
    if top is None or bottom is None:
        return None
    if top:
        return hi
    if not bottom:
        return lo
    for _ in range(PREDICTION_STEPS - 2):
        mid = plan.load_of(math.sqrt(lo * hi))
        if mid in (lo, hi) or hi / lo - 1 <= plan.resolution / 2:
            break
        ok = meets(mid)
        if ok is None:
            return None
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def twin_predict(
    predictor: Predictor | None, config: m.ServerConfig, spec: m.BenchSpec, plan: CapacityPlan
) -> Callable[[float], m.BenchLevel | None] | None:
    """A load -> predicted level function from an engine's predictor (None without one)."""
    if predictor is None:
        return None

    def predict(load: float) -> m.BenchLevel | None:
        one = plan.spec_at(spec, load)
        reading = predictor.predict(config, one, one.concurrency[0])
        return reading.level if reading.level is not None and reading.error is None else None

    return predict


def search_capacity(
    measure: Callable[[float], m.BenchLevel | None],
    plan: CapacityPlan,
    *,
    known: Mapping[float, m.BenchLevel] | None = None,
    predicted: float | None = None,
) -> tuple[m.Capacity, list[m.BenchLevel]]:
    """Bracket the crossing: measure levels one at a time (`measure(load)`: the level, or None when the run was cut
    short) until the bracket is as narrow as `plan.resolution` or `plan.max_levels` levels ran. `known`: levels
    measured already by load (they cost nothing). Returns the bracket and the levels measured here, in order."""
    seen: dict[float, m.BenchLevel] = dict(known or {})
    measured: list[m.BenchLevel] = []
    points = [_point(load, lv) for load, lv in sorted(seen.items())]
    start = None if predicted is None else plan.load_of(predicted)
    step_from: float | None = None
    note = ""
    while len(measured) < plan.max_levels:
        lower, upper = _bracket(seen, plan.target)
        if _narrow(plan, lower, upper, seen):
            break
        load = _next_load(plan, seen, lower, upper, start, step_from)
        if load is None:
            break
        if load == start:
            start, step_from = None, load
        elif step_from is not None:
            step_from = None
        level = measure(load)
        if level is None:
            note = f"cut short before the level at {load:g}"
            break
        seen[load] = level
        measured.append(level)
        points.append(_point(load, level))
    lower, upper = _bracket(seen, plan.target)
    if not note and not _narrow(plan, lower, upper, seen) and len(measured) >= plan.max_levels:
        note = f"stopped after {plan.max_levels} levels (the objective's max_levels): the bracket is wider than asked"
    capacity = m.Capacity(axis=plan.axis, slos_ms=plan.slos_ms, target=plan.target, capacity=lower, upper=upper,
                          load_min=plan.load_min, load_max=plan.load_max, points=points, predicted_capacity=predicted,
                          max_levels=plan.max_levels, note=note)  # fmt: skip
    return capacity, measured


def _point(load: float, level: m.BenchLevel) -> m.CapacityPoint:
    return m.CapacityPoint(load=load, attainment=attainment(level), output_throughput=level.output_throughput)


def _bracket(seen: Mapping[float, m.BenchLevel], target: float) -> tuple[float | None, float | None]:
    """(the highest load that met the target below the lowest that missed it, that lowest missing load)."""
    missed = [x for x, lv in seen.items() if attainment(lv) < target]
    upper = min(missed) if missed else None
    met = [x for x, lv in seen.items() if attainment(lv) >= target and (upper is None or x < upper)]
    return (max(met) if met else None), upper


def _narrow(plan: CapacityPlan, lower: float | None, upper: float | None, seen: Mapping[float, object]) -> bool:
    """Whether the search is done: a closed bracket within the resolution, or an open one at its bound."""
    if lower is not None and upper is not None:
        return upper / lower - 1 <= plan.resolution + 1e-9 or (plan.axis == "concurrency" and upper - lower <= 1)
    if upper is None:
        return bool(seen) and max(seen) >= plan.load_max
    return min(seen) <= plan.load_min


def _next_load(
    plan: CapacityPlan,
    seen: Mapping[float, object],
    lower: float | None,
    upper: float | None,
    start: float | None,
    step_from: float | None,
) -> float | None:
    """The next load to measure (see the module's docstring), or None when none is left to try."""
    lo = lower if lower is not None else plan.load_min
    hi = upper if upper is not None else plan.load_max
    inside = lambda x: x not in seen and (lower is None or x > lower) and (upper is None or x < upper)  # noqa: E731
    candidates: list[float] = []
    if start is not None:
        candidates.append(start)
    if step_from is not None:  # one resolution step beside the predicted capacity, on the side not yet known
        met = step_from == lower
        candidates.append(plan.load_of(step_from * (1 + plan.resolution) if met else step_from / (1 + plan.resolution)))
    if (lower is not None and upper is not None) or not seen:
        candidates.append(plan.load_of(math.sqrt(lo * hi)))
    elif upper is None:  # everything met: double up to the bound
        candidates.append(plan.load_of(max(seen) * 2))
    else:  # everything missed: halve down to the bound
        candidates.append(plan.load_of(min(seen) / 2))
    for x in candidates:
        if inside(x):
            return x
    if plan.axis == "concurrency" and lower is not None and upper is not None:
        for x in (plan.load_of(lower + 1), plan.load_of(upper - 1)):
            if inside(x):
                return x
    return None


def run_capacity(
    deployment: Deployment,
    spec: m.BenchSpec,
    objective: m.Objective,
    swept: m.BenchResult,
    *,
    predicted: float | None = None,
    on_progress: Callable[[str], None] | None = None,
    output_file: Path | None = None,
) -> m.Capacity:
    """The capacity search on a running server, after its sweep `swept` of `spec` (whose levels on the search's
    axis count as measured): one `Deployment.benchmark` per level; each level is appended to `output_file`."""
    plan = CapacityPlan.of(objective, spec)
    known = {}
    for level in swept.levels:
        load = plan.level_index(level)
        if load is not None and level.goodput_slos_ms == plan.slos_ms:
            known[load] = level
    say = on_progress or (lambda line: None)

    def measure(load: float) -> m.BenchLevel | None:
        say(f"capacity search: a level at {load:g} {'concurrent requests' if plan.axis == 'concurrency' else 'req/s'}")
        result = deployment.benchmark(plan.spec_at(spec, load), on_progress, output_file=output_file)
        if result.interrupted or not result.levels:
            return None
        return result.levels[0]

    capacity, _ = search_capacity(measure, plan, known=known, predicted=predicted)
    say(f"capacity at {m.slo_text(plan.slos_ms)}: {capacity.bracket_text}")
    return capacity


def capacity_search_of(
    objective: m.Objective, engine: Engine, target: m.Target, config: m.ServerConfig, spec: m.BenchSpec
) -> tuple[m.Objective | None, float | None]:
    """For a capacity objective: the objective (what the run brackets after its sweep) and where the engine's
    predictor (the twin) places the crossing for `config` (None without a predictor); (None, None) otherwise."""
    if objective.kind != "capacity":
        return None, None
    plan = CapacityPlan.of(objective, spec)
    predict = twin_predict(engine.predictor(target), config, spec, plan)
    return objective, (predicted_capacity(predict, plan) if predict is not None else None)
