"""The SLO evaluation: pivot's campaign on plans with SLO objectives, scored against the exhaustive grid of the objective.

Plans: the shipped capacity plan (plans/glm5-nvfp4-rtxpro6000x8-capacity.toml: capacity at TPOT <= 250 ms) and the
plans under benchmarks/slo_plans/ (request goodput under TTFT and TPOT SLOs; output tokens per joule with GPU power
limits), or --plans FILES. The grid is every combination of a plan's searchable items (flag, config and power items)
applied to the base flags in plan order, each valued by the plan's objective on the twin through `pivot sim predict
--goodput`'s code path (Twin.build on the configuration, Twin.predict on the workload, noise-free): goodput and
energy at the workload's top level, capacity as the crossing bisected on the twin's levels at several loads
(tools/loadgen/capacity.py). It is cached in benchmarks/slo_grid.json; `--grid` recomputes it:

    nice .venv/bin/python benchmarks/slo_eval.py --grid            # the grids (a few minutes on 2 shared cores)
    nice .venv/bin/python benchmarks/slo_eval.py --jobs 2          # the table, noise-free (a few minutes)
    nice .venv/bin/python benchmarks/slo_eval.py --jobs 2 --seeds 3  # and 3 noisy seeds per plan (--noise 0.015)

Each campaign runs as a user would run it (`pivot run PLAN --engine sim`, the autopilot, `continue` at every pivot)
and is scored:

- ratio: the grid value (the objective, noise-free) of the campaign's final best configuration / the grid's best;
- launches: server launches (benchmark runs, the baseline's included, plus servers that failed to start), also as
  a share of the grid's size;
- aborts: campaigns that ended other than finished.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent import models as m  # noqa: E402
from agent.contracts import Prediction  # noqa: E402
from agent.plans import load_plan  # noqa: E402
from benchmarks.search_eval import fresh, launched, run_campaign, twin_fingerprint  # noqa: E402

PLANS = [
    ROOT / "plans" / "glm5-nvfp4-rtxpro6000x8-capacity.toml",
    *sorted((ROOT / "benchmarks" / "slo_plans").glob("*.toml")),
]
GRID = ROOT / "benchmarks" / "slo_grid.json"


class SimPredict:
    """`pivot sim predict`'s path as a predictor: Twin.build on the configuration (SGLang's refusals and startup
    faults), Twin.predict on the workload at one level, noise-free; one twin per configuration."""

    name = "pivot sim predict"

    def __init__(self, target: m.Target) -> None:
        self.target = target
        self._twins: dict[str, object] = {}

    def predict(self, config: m.ServerConfig, spec: m.BenchSpec, level: int) -> Prediction:
        from tools.engines.catalog import CatalogError
        from tools.engines.sim.twin import Twin, TwinStartupError

        key = config.model_dump_json()
        if key not in self._twins:
            t = self.target
            try:
                self._twins[key] = Twin.build(str(t.model_profile), str(t.hardware), t.gpus, config)
            except (CatalogError, TwinStartupError) as e:
                self._twins[key] = e
        twin = self._twins[key]
        if isinstance(twin, Exception):
            return Prediction(crashed=True, error=str(twin))
        ((level_, sim),) = twin.predict(spec.model_copy(update={"concurrency": [level]}))  # type: ignore[attr-defined]
        return Prediction(level=level_, crashed=sim.fault is not None or level_.failed > 0)


def _items(plan: m.Plan) -> list[m.PlanItem]:
    from tools.search import searchable

    return [it for it in plan.items if searchable(it)]


def _config(plan: m.Plan, ids: tuple[str, ...]) -> m.ServerConfig:
    config = plan.target.base_config()
    for it in plan.items:
        if it.id in ids:
            config = it.apply(config)
    return config


def value(plan: m.Plan, config: m.ServerConfig, predictor: SimPredict | None = None) -> float:
    """The plan's objective for `config` on the noise-free twin (0 when it does not start, crashes or misses)."""
    from tools.method import objective_for

    predictor = predictor or SimPredict(plan.target)
    _, v = objective_for(plan).predict(predictor, config, plan.workload, max(plan.workload.concurrency))
    return v or 0.0


def grid(path: Path) -> dict:
    plan = load_plan(str(path))
    ids = [it.id for it in _items(plan)]
    predictor = SimPredict(plan.target)
    started = time.monotonic()
    points = {}
    for n in range(len(ids) + 1):
        for combo in itertools.combinations(ids, n):
            points["+".join(combo)] = value(plan, _config(plan, combo), predictor)
    best = max(points, key=lambda k: points[k])
    return {"plan": plan.name, "objective": plan.objective.describe(), "unit": plan.objective.unit, "items": ids,
            "size": len(points), "points": points, "best": best, "best_value": points[best],
            "base_value": points[""], "seconds": round(time.monotonic() - started, 1),
            "twin": twin_fingerprint(path)}  # fmt: skip


def campaign(args: tuple[str, float, int]) -> dict:
    """One campaign of the autopilot on the sim engine, `continue` at every pivot, scored from its ledger."""
    plan_path, noise, seed = args
    started = time.monotonic()
    run = run_campaign(plan_path, noise, seed)
    plan, method, status, error, pivots = run.plan, run.method, run.status, run.error, run.pivots
    launches = sum(launched(method, e) for e in method.experiments)
    steps = [
        f"#{e.id} {'+'.join(e.plan_items) + ''.join(f' -{i}' for i in e.reverts) or 'baseline'} {e.verdict} "
        f"runs={method.run_count(e)}"
        + (f" pred={e.predicted_change_pct:+.1f}%" if e.predicted_change_pct is not None else "")
        for e in method.experiments
    ]
    best = method.best()
    final_items = tuple(method.active_items())
    final = value(plan, best.config if best is not None else plan.target.base_config())
    print(f"{plan.name} noise {noise:g} seed {seed}: {launches} launches, {time.monotonic() - started:.0f} s",
          file=sys.stderr, flush=True)  # fmt: skip
    return {"plan": plan.name, "noise": noise, "seed": seed, "final_value": final, "final_items": "+".join(final_items),
            "launches": launches, "pivots": pivots, "outcome": status, "aborted": status != "finished",
            "error": error[:300], "seconds": round(time.monotonic() - started, 1), "steps": steps}  # fmt: skip


TABLE_HEADER = (
    "| plan | objective | grid: points, best (base) | noise | campaigns | ratio to grid best: mean (min) "
    "| launches: mean (max) | % of grid: mean (max) | aborts |"
)


def _row(plan: str, noise: str, rs: list[dict], cached: dict) -> str:
    g = cached[plan]
    ratios = [r["final_value"] / g["best_value"] if g["best_value"] else 1.0 for r in rs]
    launches = [r["launches"] for r in rs]
    share = [100 * r["launches"] / g["size"] for r in rs]
    best = f"{g['best_value']:,.4g} ({g['base_value']:,.4g}) {g['unit']}"
    return (
        f"| {plan} | {g['objective']} | {g['size']}, {best} | {noise} | {len(rs)} | "
        f"{statistics.mean(ratios):.3f} ({min(ratios):.3f}) | {statistics.mean(launches):.1f} ({max(launches)}) | "
        f"{statistics.mean(share):.1f}% ({max(share):.1f}%) | {sum(r['aborted'] for r in rs)} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", action="store_true", help="Recompute the grid cache (benchmarks/slo_grid.json).")
    ap.add_argument(
        "--plans", nargs="*", help="Plan files (default: the shipped capacity plan and benchmarks/slo_plans)."
    )
    ap.add_argument("--seeds", type=int, default=0, help="Noisy campaigns per plan (default: noise-free only).")
    ap.add_argument("--noise", type=float, default=0.015)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", dest="as_json", help="Also write every campaign's scores to this file.")
    opts = ap.parse_args()
    paths = [Path(p) for p in opts.plans] if opts.plans else PLANS
    cached = json.loads(GRID.read_text()) if GRID.exists() else {}
    missing = [p for p in paths if opts.grid or not fresh(cached.get(load_plan(str(p)).name), p)]
    if missing:
        with ProcessPoolExecutor(max(1, opts.jobs)) as pool:
            for g in pool.map(grid, missing):
                cached[g["plan"]] = g
                print(f"grid {g['plan']}: {g['size']} points, best {g['best'] or 'base'} {g['best_value']:,.4g} "
                      f"{g['unit']} ({g['seconds']:.0f} s)", file=sys.stderr)  # fmt: skip
        GRID.write_text(json.dumps(cached, indent=1, sort_keys=True) + "\n")
    if opts.grid:
        return
    runs = [(str(p), 0.0, 0) for p in paths]
    runs += [(str(p), opts.noise, seed) for p in paths for seed in range(1, opts.seeds + 1)]
    with ProcessPoolExecutor(max(1, opts.jobs)) as pool:
        results = list(pool.map(campaign, runs))
    if opts.as_json:
        Path(opts.as_json).write_text(json.dumps(results, indent=1) + "\n")
    print(TABLE_HEADER)
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["plan"], r["noise"]), []).append(r)
    for (plan, noise), rs in groups.items():
        print(_row(plan, f"{noise:g}", rs, cached))
    for r in results:
        print(f"{r['plan']} noise {r['noise']:g} seed {r['seed']}: final {r['final_items'] or 'base'} "
              f"{r['final_value']:,.4g}; {' | '.join(r['steps'])}", file=sys.stderr)  # fmt: skip
        if r["aborted"]:
            print(f"aborted: {r['plan']} noise {r['noise']:g} seed {r['seed']}: {r['outcome']}: {r['error']}",
                  file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
