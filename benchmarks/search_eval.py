"""The search evaluation: pivot's campaign scored against the exhaustive grid of its plan, computed with the twin.

For every plan under benchmarks/search_plans/ (or --plans FILES), the grid is every combination of the plan's flag
and config items applied to the base flags (in plan order), predicted by the twin without noise at the workload's top
level. It is cached in benchmarks/search_grid.json; `--grid` recomputes it:

    .venv/bin/python benchmarks/search_eval.py --grid          # the grid (about a second per point)
    .venv/bin/python benchmarks/search_eval.py --jobs 2        # the table: search and greedy, noise 0 and 0.015 (about 10 minutes on 2 shared cores)

Then pivot's campaign runs as a user would run it (`pivot run PLAN --engine sim`, the autopilot, answering
`continue` at every pivot), with the search (the default) and with the plain greedy path (`search` off: plan
order, one item at a time, an adoption on one run), without noise (seed 0) and with --noise 0.015 over 10 seeds.
Each campaign is scored:

- ratio: the noise-free twin's output tok/s of the campaign's final best configuration / the grid's best;
- launches: server launches (benchmark runs, the baseline's two included, plus servers that failed to start),
  against the grid's size;
- noop launches: launches of an item whose flags are all no-ops in SGLang 0.5.23;
- false adoptions: adopted while the noise-free change (the twin, the experiment's config against its base's) is
  below the campaign's least gain (min_gain_pct, 3%); false regressions: regressed while it is above minus that;
- reverts: launches that took an adopted item back (the best configuration rebuilt without it), and how many of
  them were adopted;
- aborts: campaigns that ended other than finished (a failure, a stop, an exception, or still at a pivot after 30).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent import models as m  # noqa: E402
from agent.plans import load_plan  # noqa: E402

PLANS = ROOT / "benchmarks" / "search_plans"
GRID = ROOT / "benchmarks" / "search_grid.json"


def _items(plan: m.Plan) -> list[m.PlanItem]:
    from tools.search import searchable

    return [it for it in plan.items if searchable(it)]


def _config(plan: m.Plan, ids: tuple[str, ...]) -> m.ServerConfig:
    config = plan.target.base_config()
    for it in plan.items:
        if it.id in ids:
            config = it.apply(config)
    return config


def true_tok(plan: m.Plan, config: m.ServerConfig, truth: str | None = None) -> float:
    """The noise-free twin's output tok/s at the workload's top level (0 when it does not start or crashes); with
    `truth` (a truth file, tools/engines/sim/truth.py), the twin as that truth has the target behave."""
    from tools.engines.sim.predictor import TwinPredictor

    t = plan.target
    r = TwinPredictor(str(t.model_profile), t.hardware, t.gpus, truth).predict(
        config, plan.workload, max(plan.workload.concurrency)
    )
    return r.tok_s or 0.0


def twin_fingerprint(path: Path) -> str:
    """What a cached grid was computed with: the plan file, the shipped profiles and the twin's code. A grid whose
    fingerprint differs (a profile re-fitted, the cost model changed) is computed again, never read stale."""
    h = hashlib.sha256(Path(path).read_bytes())
    for f in sorted([*(ROOT / "tools" / "profiles").rglob("*.toml"), ROOT / "tools" / "profiles" / "__init__.py",
                     *(ROOT / "tools" / "engines" / "sim").glob("*.py")]):  # fmt: skip
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def fresh(entry: dict | None, path: Path) -> bool:
    """A cached grid computed by the twin as it is now (see twin_fingerprint)."""
    return entry is not None and entry.get("twin") == twin_fingerprint(path)


def grid(path: Path, truth: str | None = None) -> dict:
    """Every combination of the plan's searchable items, measured noise-free by the twin (or by `truth`)."""
    plan = load_plan(str(path))
    ids = [it.id for it in _items(plan)]
    points = {}
    for n in range(len(ids) + 1):
        for combo in itertools.combinations(ids, n):
            points["+".join(combo)] = true_tok(plan, _config(plan, combo), truth)
    best = max(points, key=lambda k: points[k])
    return {
        "plan": plan.name,
        "items": ids,
        "size": len(points),
        "points": points,
        "best": best,
        "best_tok_s": points[best],
        "twin": twin_fingerprint(path),
    }


@dataclass
class Campaign:
    """A campaign run to its end on the sim engine: its method (read from the ledger), how it ended, its pivots."""

    plan: m.Plan
    method: Any
    status: str
    error: str
    pivots: int


def run_campaign(plan_path: str, noise: float, seed: int, searched: bool | str = True, truth: str | None = None,
                 budget: int | None = None, min_gain: float | None = None) -> Campaign:  # fmt: skip
    """One campaign of the autopilot on the sim engine in a throwaway home, `continue` at every pivot (30 at most);
    an exception is an abort, kept as its error. With `truth`, the engine measures the target as that truth has it
    while the search keeps the plan's own twin (the sim engine's predictor is the stock twin). `min_gain`: the
    session's least gain adopted (default: the setting's own)."""
    from agent import loop
    from agent.session import Paths, Session
    from agent.store import Store
    from tools.method import Method

    plan = load_plan(plan_path)
    with tempfile.TemporaryDirectory() as home:
        paths = Paths.from_env(home)
        paths.state_dir.mkdir(parents=True, exist_ok=True)
        store = Store(paths.db_path)
        t = plan.target
        options = {"model_profile": t.model_profile, "hardware": t.hardware, "gpus": t.gpus, "noise": noise}
        proposer = searched if isinstance(searched, str) else "twin" if searched else "plan-order"
        settings = m.SessionSettings(
            seed=seed, search=proposer != "plan-order", proposer=proposer, max_launches=budget,
            engine_options={**options, **({"truth": truth} if truth else {})},
            **({"min_gain_pct": min_gain} if min_gain is not None else {}),
        )  # fmt: skip
        session = Session.create(store, paths, plan, name=plan.name, engine_name="sim", settings=settings)
        pivots, status, error = 0, "failed", ""
        with session:
            try:
                outcome = loop.run(session)
                while outcome.status == "pivot" and pivots < 30:
                    pivots += 1
                    outcome = loop.run(session, answer="continue")
                status, error = outcome.status, outcome.message if outcome.status != "finished" else ""
            except Exception as e:  # an abort, counted as one
                error = f"{type(e).__name__}: {e}"
            method = Method.read(store, session.id)  # read whole: it needs the ledger no more
        store.close()
    return Campaign(plan, method, status, error, pivots)


def launched(method: Any, e: m.Experiment) -> int:
    """The launches an experiment took: its runs, or one for a server that crashed before its first run."""
    runs = method.run_count(e)
    return runs + (1 if e.status == "failed" and runs == 0 and e.verdict == "crashed" else 0)


def campaign(args: tuple) -> dict:
    """One campaign of the autopilot on the sim engine, `continue` at every pivot, scored from its ledger against
    the twin (or, with a fifth member, against that truth file: what the engine measured with)."""
    plan_path, noise, seed, searched = args[:4]
    truth: str | None = args[4] if len(args) > 4 else None
    budget: int | None = args[5] if len(args) > 5 else None
    min_gain: float | None = args[6] if len(args) > 6 else None
    from tools.engines.catalog import audit, load_catalog
    from tools.search import noop_reason

    started = time.monotonic()
    run = run_campaign(plan_path, noise, seed, searched, truth, budget, min_gain)
    plan, method, status, error, pivots = run.plan, run.method, run.status, run.error, run.pivots
    catalog = load_catalog("sglang", "0.5.23")
    noop_items = set()
    for it in _items(plan):
        issues = audit(catalog, it.apply(plan.target.base_config()))
        if noop_reason([i for i in issues if i.flag in it.flags.names()], it) is not None:
            noop_items.add(it.id)
    launches = noop = false_adopt = false_regress = reverts = reverts_adopted = 0
    for e in method.experiments:
        n = launched(method, e)
        launches += n
        if n and e.reverts:
            reverts += 1
            reverts_adopted += e.verdict == "adopted"
        if n and set(e.plan_items) & noop_items:
            noop += n
        base = method.experiment(e.base_experiment_id)
        if e.verdict in ("adopted", "regressed") and base is not None:
            before, after = true_tok(plan, base.config, truth), true_tok(plan, e.config, truth)
            change = (after - before) / before * 100 if before else 0.0
            floor = method.settings.min_gain_pct  # the least gain the campaign was asked to adopt
            false_adopt += e.verdict == "adopted" and change < floor
            false_regress += e.verdict == "regressed" and change > -floor
    steps = [_step(plan, method, e, truth) for e in method.experiments]
    trail = _trail(plan, method, truth)
    best = method.best()
    final = true_tok(plan, best.config if best is not None else plan.target.base_config(), truth)
    print(
        f"{plan.name} {path_name(searched)} noise {noise:g} seed {seed}: {launches} launches, "
        f"{time.monotonic() - started:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return {
        "plan": plan.name,
        "noise": noise,
        "seed": seed,
        "search": searched,
        "truth": truth,
        "final_tok_s": final,
        "final_key": "+".join(sorted(method.active_items())),  # the plan items the final best configuration holds
        "launches": launches,
        "noop_launches": noop,
        "false_adoptions": false_adopt,
        "false_regressions": false_regress,
        "reverts": reverts,
        "reverts_adopted": reverts_adopted,
        "pivots": pivots,
        "min_gain_pct": method.settings.min_gain_pct,
        "outcome": status,
        "aborted": status != "finished",
        "error": error[:300],
        "seconds": round(time.monotonic() - started, 1),
        "steps": steps,
        "trail": trail,
    }


def _trail(plan: m.Plan, method: Any, truth: str | None) -> list[tuple[int, float]]:
    """(launches so far, the truth's output tok/s of the best configuration so far) after each launch, in the order
    the launches ran: when the campaign first held a configuration worth a share of the grid's best, and its score at
    any budget (what a campaign cut there would have kept). An adopted change becomes the best after its last run
    before the next experiment's first: its runs after that (its base measured again for a later verdict) count where
    they ran, not before its adoption."""
    launches: list[tuple[Any, int, int, m.Experiment]] = []  # (when, experiment order, run index, experiment)
    for order, e in enumerate(method.experiments):
        runs = method.runs.get(e.id or 0, [])
        launches += [(r.started_at, order, i, e) for i, r in enumerate(runs)]
        if launched(method, e) > len(runs):  # a server that crashed before its first run
            launches.append((e.started_at or e.created_at, order, len(runs), e))
    launches.sort(key=lambda x: (x[0], x[1], x[2]))
    first = {}  # an experiment's first launch's position
    for n, (_, _, _, e) in enumerate(launches):
        first.setdefault(e.id, n)
    starts = sorted(first.values())
    adopted_at = {}  # an adopted change's position: its last launch before the next experiment's first
    for n, (_, _, _, e) in enumerate(launches):
        if e.kind == "change" and e.verdict == "adopted":
            later = next((x for x in starts if x > first[e.id]), len(launches))
            if n < later:
                adopted_at[e.id] = n
    out: list[tuple[int, float]] = []
    tok = true_tok(plan, plan.target.base_config(), truth)
    for n, (_, _, _, e) in enumerate(launches):
        if adopted_at.get(e.id) == n:
            tok = true_tok(plan, e.config, truth)
        out.append((n + 1, tok))
    return out


def _step(plan: m.Plan, method, e: m.Experiment, truth: str | None = None) -> str:
    """One experiment of a campaign in a line: what it launched, its verdict, and its change as measured, as
    judged (the measurement weighted with the twin's prediction, when it was), as predicted and noise-free."""
    out = (
        f"#{e.id} {'+'.join(e.plan_items) + ''.join(f' -{i}' for i in e.reverts) or 'baseline'} {e.verdict} "
        f"runs={method.run_count(e)}"
    )
    j = method.judge(e) if e.kind == "change" and method.run_count(e) else None
    if j is not None and j.change_pct is not None:
        out += f" measured={j.change_pct:+.2f}%"
        out += f" judged={j.judged_pct:+.2f}%" if j.judged_pct is not None and j.judged_pct != j.change_pct else ""
    if e.predicted_change_pct is not None:
        out += f" pred={e.predicted_change_pct:+.2f}%"
    base = method.experiment(e.base_experiment_id)
    if base is not None and e.kind == "change" and (before := true_tok(plan, base.config, truth)):
        out += f" true={(true_tok(plan, e.config, truth) - before) / before * 100:+.2f}%"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", action="store_true", help="Recompute the grid cache (benchmarks/search_grid.json).")
    ap.add_argument("--plans", nargs="*", help="Plan files (default: benchmarks/search_plans/*.toml).")
    ap.add_argument("--seeds", type=int, default=10, help="Seeds of the noisy campaigns.")
    ap.add_argument("--noise", type=float, default=0.015)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument(
        "--modes",
        default="search,greedy",
        help="search (the twin's), greedy (the plan's order), optuna-tpe, random (peers in the method).",
    )
    ap.add_argument("--max-launches", type=int, help="The launch budget of every campaign (pivot run --max-launches).")
    ap.add_argument("--json", dest="as_json", help="Also write every campaign's scores to this file.")
    opts = ap.parse_args()
    paths = [Path(p) for p in opts.plans] if opts.plans else sorted(PLANS.glob("*.toml"))
    cached = json.loads(GRID.read_text()) if GRID.exists() else {}
    missing = [p for p in paths if opts.grid or not fresh(cached.get(load_plan(str(p)).name), p)]
    if missing:
        with ProcessPoolExecutor(max(1, opts.jobs)) as pool:
            for g in pool.map(grid, missing):
                cached[g["plan"]] = g
                print(
                    f"grid {g['plan']}: {g['size']} points, best {g['best'] or 'base'} {g['best_tok_s']:,.0f}",
                    file=sys.stderr,
                )
        GRID.write_text(json.dumps(cached, indent=1, sort_keys=True) + "\n")
    if opts.grid:
        return
    modes = [mo == "search" if mo in ("search", "greedy") else mo for mo in opts.modes.split(",")]
    runs = [
        (str(p), noise, seed, s, None, opts.max_launches)
        for p in paths
        for s in modes
        for noise, seeds in ((0.0, [0]), (opts.noise, list(range(1, opts.seeds + 1))))
        for seed in seeds
    ]
    with ProcessPoolExecutor(max(1, opts.jobs)) as pool:
        results = list(pool.map(campaign, runs))
    if opts.as_json:
        Path(opts.as_json).write_text(json.dumps(results, indent=1) + "\n")
    print(TABLE_HEADER)
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["plan"], r["search"], r["noise"]), []).append(r)
    for (plan, searched, noise), rs in groups.items():
        print(_row(plan, path_name(searched), f"{noise:g}", rs, cached))
    for searched in sorted({r["search"] for r in results}, key=path_name):
        rs = [r for r in results if r["search"] == searched]
        print(_row("all", path_name(searched), "both", rs, cached))
    for r in results:
        if r["aborted"]:
            print(
                f"aborted: {r['plan']} noise {r['noise']:g} seed {r['seed']}: {r['outcome']}: {r['error']}",
                file=sys.stderr,
            )


def path_name(searched: bool | str) -> str:
    """A campaign's path in the table: search (the twin's), greedy (the plan's order), or the peer's name."""
    return searched if isinstance(searched, str) else "search" if searched else "greedy"


TABLE_HEADER = (
    "| plan | path | noise | campaigns | ratio to grid best: mean (min) | launches: mean (max) | % of grid: mean (max) "
    "| reverts (adopted) | aborts | noop launches | false adoptions | false regressions |"
)


def _row(plan: str, path: str, noise: str, rs: list[dict], cached: dict) -> str:
    """One line of the table: the campaigns of one plan, path and noise (or all of them)."""
    ratios = [r["final_tok_s"] / cached[r["plan"]]["best_tok_s"] for r in rs]
    launches = [r["launches"] for r in rs]
    share = [100 * r["launches"] / cached[r["plan"]]["size"] for r in rs]
    return (
        f"| {plan} | {path} | {noise} | {len(rs)} | {statistics.mean(ratios):.3f} ({min(ratios):.3f}) | "
        f"{statistics.mean(launches):.1f} ({max(launches)}) | {statistics.mean(share):.1f}% ({max(share):.1f}%) | "
        f"{sum(r['reverts'] for r in rs)} ({sum(r['reverts_adopted'] for r in rs)}) | "
        f"{sum(r['aborted'] for r in rs)} | {sum(r['noop_launches'] for r in rs)} | "
        f"{sum(r['false_adoptions'] for r in rs)} | {sum(r['false_regressions'] for r in rs)} |"
    )


if __name__ == "__main__":
    main()
