"""pivot's search beside the searches its users would pick instead, on the same grids, noise and seeds.

The peers search the plan's item combinations (on/off per item, as vllm-tuner and vllm-optimizer do with Optuna) by
launching one configuration per trial and reading its noisy measurement:

- random: combinations in a random order (the baseline first, as every peer);
- optuna-tpe: Optuna's TPESampler (Optuna 5: multivariate, the constant liar), ask and tell, one categorical on/off
  per item, seeded; a combination asked again is launched again (a real tuner relaunches);
- plan-order: pivot's own greedy path (`--no-search`): the items in plan order, each on top of the best so far,
  adopted when its one run gains 3% or more.

Every launch measures the plan's grid (benchmarks/search_grid.json: the twin's noise-free output tok/s of every
combination, as benchmarks/search_eval.py computes it) times (1 + noise x N(0, 1)). After each launch the incumbent is
the configuration with the best measured value; its score is its *true* value over the grid's best. Printed side by
side: the launches each peer needs until its incumbent reaches 0.99 of the grid's best (mean over seeds and the worst;
"-" when the budget ran out first), and its score at budgets of 8, 16, 32 and 64 launches. pivot's own rows come from
benchmarks/search_eval.py's --json (its campaigns as a user runs them, through the method, the baseline's two runs
included):

    .venv/bin/python benchmarks/search_eval.py --modes search --seeds 3 --json /tmp/pivot.json
    .venv/bin/python benchmarks/peers.py --pivot /tmp/pivot.json --seeds 10

Optuna's GPSampler needs torch and is left out where torch is not installed (it says so). Here the peers run on the
grid, with no method (no noise band, no reruns): what a plain tuner does. The same peers *inside* pivot's method
(`pivot run --search optuna-tpe|random`, tools/peers.py) are scored by benchmarks/search_eval.py:

    .venv/bin/python benchmarks/search_eval.py --modes search,optuna-tpe,random --seeds 2 --max-launches 16

`--large` runs the plans of benchmarks/peers_plans/ instead (16 items, 65,536 combinations: no exhaustive grid). A
combination is valued by the noise-free twin when a proposer first launches it; the reference is the best any
proposer finds (each peer again with --reference-budget launches, noise-free, and pivot's campaigns), hill-climbed
one item at a time until no switch gains, and printed under the table. pivot's campaigns run here through the
method (benchmarks/search_eval.py's campaign), unbounded and again under each budget they went past:

    .venv/bin/python benchmarks/peers.py --large --seeds 5 --jobs 2

`--plans FILE...` runs plans of your own the same way; a plan of at most 10 items (EXHAUSTIVE combinations) is
scored against the best of every combination, valued once each:

    .venv/bin/python benchmarks/peers.py --plans my-plan.toml --seeds 5 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "benchmarks" / "search_grid.json"
LARGE = ROOT / "benchmarks" / "peers_plans"
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
BUDGETS = (8, 16, 32, 64)
TARGET = 0.99
EXHAUSTIVE = 1024  # --plans: a plan with at most this many combinations is scored against every one's best
MIN_GAIN = 0.03

Measure = Callable[[tuple[str, ...]], float]


def key(items: tuple[str, ...]) -> str:
    return "+".join(sorted(items))


def plan_order(items: list[str], measure: Measure, rng: random.Random) -> Iterator[tuple[str, ...]]:
    best: tuple[str, ...] = ()
    best_value = measure(best)
    yield best
    for item in items:
        trial = tuple(sorted((*best, item)))
        value = measure(trial)
        yield trial
        if value >= best_value * (1 + MIN_GAIN):
            best, best_value = trial, value


def combinations(items: list[str]) -> list[tuple[str, ...]]:
    """Every combination of the items, in plan order within each: the base () first."""
    return [tuple(i for i, bit in zip(items, f"{n:0{len(items)}b}", strict=True) if bit == "1")
            for n in range(2 ** len(items))]  # fmt: skip


def random_order(items: list[str], measure: Measure, rng: random.Random) -> Iterator[tuple[str, ...]]:
    combos = combinations(items)[1:]
    rng.shuffle(combos)
    measure(())
    yield ()
    for combo in combos:
        measure(combo)
        yield combo


def optuna_sampler(kind: str) -> Callable[[int], object] | None:
    try:
        import optuna
    except ImportError:
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if kind == "tpe":
        return lambda seed: optuna.samplers.TPESampler(seed=seed)
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    return lambda seed: optuna.samplers.GPSampler(seed=seed)


def optuna_order(make_sampler: Callable[[int], object]):
    def order(items: list[str], measure: Measure, rng: random.Random) -> Iterator[tuple[str, ...]]:
        import optuna

        study = optuna.create_study(direction="maximize", sampler=make_sampler(rng.randrange(2**31)))
        study.enqueue_trial(dict.fromkeys(items, "off"))  # the baseline first, as every peer
        while True:
            trial = study.ask()
            combo = tuple(i for i in items if trial.suggest_categorical(i, ["off", "on"]) == "on")
            study.tell(trial, measure(combo))
            yield combo

    return order


def run(grid: dict, order, seed: int, noise: float, budget: int) -> list[float]:
    """The incumbent's true value after each launch (up to `budget` launches): what the configuration with the best
    mean measurement so far truly gives (grid["points"] maps a combination's key to it; 0: it does not start)."""
    rng = random.Random(seed)
    points = grid["points"]
    measured: dict[tuple[str, ...], list[float]] = {}

    def measure(combo: tuple[str, ...]) -> float:
        true = points.get(key(combo)) or 0.0  # a combination that crashes measures nothing
        value = true * (1 + noise * rng.gauss(0, 1))
        measured.setdefault(combo, []).append(value)
        return value

    values = []
    for _ in order(list(grid["items"]), measure, rng):
        incumbent = max(measured, key=lambda c: statistics.mean(measured[c]))
        values.append(points.get(key(incumbent)) or 0.0)
        if len(values) >= budget:
            break
    return values


class TwinPoints(dict):
    """A large plan's combinations valued by the noise-free twin on demand (benchmarks/search_eval.py's true_tok, at
    the workload's top level), each once: a plan of 16 items has 65,536, too many for an exhaustive grid."""

    def __init__(self, plan_path: Path) -> None:
        super().__init__()
        import search_eval

        self.plan = search_eval.load_plan(str(plan_path))
        self.items = [it.id for it in search_eval._items(self.plan)]
        self._value = lambda ids: search_eval.true_tok(self.plan, search_eval._config(self.plan, ids))

    def get(self, k: str, default: float | None = None) -> float:
        if k not in self:
            self[k] = self._value(tuple(k.split("+")) if k else ())
        return super().get(k, default)

    def climb(self, start: str) -> str:
        """Hill-climbing from `start`, one item switched on or off at a time, until no switch gains: where the best
        any proposer found can still be improved, the reference moves there."""
        best = start
        while True:
            have = set(best.split("+")) - {""}
            moves = [key(tuple(have ^ {i})) for i in self.items]
            top = max(moves, key=lambda k: self.get(k) or 0.0)
            if (self.get(top) or 0.0) <= (self.get(best) or 0.0) * (1 + 1e-9):
                return best
            best = top


def launches_to(scores: list[float]) -> int | None:
    return next((i + 1 for i, s in enumerate(scores) if s >= TARGET), None)


def pivot_rows_large(plan_path: Path, seeds: int, noise: float, jobs: int) -> list[dict]:
    """pivot's own campaigns on a large plan through the method (benchmarks/search_eval.py's campaign): unbounded,
    and again under every budget the unbounded campaign went past."""
    import search_eval

    tasks = [(str(plan_path), noise, seed, True) for seed in range(1, seeds + 1)]
    with ProcessPoolExecutor(jobs) as pool:
        rows = list(pool.map(search_eval.campaign, tasks))
        bounded = [(*t, None, b) for t, r in zip(tasks, rows, strict=True) for b in BUDGETS if r["launches"] > b]
        for t, r in zip(bounded, pool.map(search_eval.campaign, bounded), strict=True):
            rows.append({**r, "budget": t[5]})
    return rows


def _peer_row(name: str, peer: str, runs: list[list[float]], best: float) -> str:
    scores = [[v / best for v in s] for s in runs]
    reached = [launches_to(s) for s in scores]
    got = [x for x in reached if x is not None]
    mean = f"{statistics.mean(got):.1f}" if got else "-"
    worst = str(max(got)) if len(got) == len(reached) else "-"
    at = [statistics.mean(s[min(b, len(s)) - 1] for s in scores) for b in BUDGETS]
    final = statistics.mean(s[-1] for s in scores)
    return (f"| {name} | {peer} | {len(runs)} | {mean} ({worst}) | " + " | ".join(f"{x:.4f}" for x in at)
            + f" | {final:.4f} |")  # fmt: skip


def _reached(r: dict, best: float) -> int | None:
    """The launches a campaign of pivot's had spent when its best configuration first reached TARGET of `best`
    (benchmarks/search_eval.py's trail; a record without one: its final launches, if its final best reached it)."""
    if "trail" not in r:
        return r["launches"] if r["final_tok_s"] / best >= TARGET else None
    return next((n for n, tok in r["trail"] if tok / best >= TARGET), None)


def _score_at(mine: list[dict], budget: int, best: float) -> str:
    """pivot's mean score at a budget from its campaigns' trails: the best it held after its last launch within the
    budget (the baseline's alone below its two runs); blank without trails."""
    if not mine or any("trail" not in r for r in mine):
        return ""
    held = [([tok for n, tok in r["trail"] if n <= budget] or [r["trail"][0][1]])[-1] for r in mine]
    return f"{statistics.mean(tok / best for tok in held):.4f}"


def _pivot_row(name: str, mine: list[dict], best: float) -> str:
    """pivot's row: launches to the target from its unbounded campaigns; its score at each budget from the campaign
    run under that budget (or the unbounded one, where it needed no more)."""
    free = [r for r in mine if r.get("budget") is None]
    ratios = [r["final_tok_s"] / best for r in free]
    reached = [n for r in free if (n := _reached(r, best)) is not None]
    worst = "-" if len(reached) < len(free) else str(max(reached))
    mean = f"{statistics.mean(reached):.1f}" if reached else "-"
    at = []
    for b in BUDGETS:
        scored = [next((x for x in mine if x.get("budget") == b and x["seed"] == r["seed"]), r) for r in free]
        at.append(f"{statistics.mean(x['final_tok_s'] / best for x in scored):.4f}")
    return (f"| {name} | pivot (twin search, through the method) | {len(free)} | {mean} ({worst}) | "
            + " | ".join(at) + f" | {statistics.mean(ratios):.4f} |")  # fmt: skip


def valued_plan(path: Path, peers: dict[str, object], args: argparse.Namespace) -> str:
    """Print a plan's rows with its combinations valued by the twin as the proposers launch them (--large, --plans):
    the reference is every combination's best where there are at most EXHAUSTIVE of them, else the best any proposer
    finds (each peer again with --reference-budget noise-free launches, and pivot's campaigns), hill-climbed one item
    at a time until no switch gains. Returns the note that says which."""
    points = TwinPoints(path)
    grid = {"items": points.items, "points": points}
    mine = pivot_rows_large(path, args.seeds, args.noise, args.jobs)
    runs = {peer: [run(grid, order, seed, args.noise, args.budget) for seed in range(1, args.seeds + 1)]
            for peer, order in peers.items()}  # fmt: skip
    size = 2 ** len(points.items)
    if size <= EXHAUSTIVE:
        for combo in combinations(points.items):
            points.get(key(combo))
    else:
        for peer, order in peers.items():  # the reference: every proposer with a large budget, then a climb
            if peer != "plan-order":
                run(grid, order, 0, 0.0, args.reference_budget)
        for r in mine:
            points.get(r["final_key"])
    found = max(points, key=lambda k: points[k])
    top = found if size <= EXHAUSTIVE else points.climb(found)
    best = points[top]
    print(_pivot_row(points.plan.name, mine, best))
    for peer, values in runs.items():
        print(_peer_row(points.plan.name, peer, values, best))
    if size <= EXHAUSTIVE:
        return f"{points.plan.name}: {len(points.items)} items, every one of {size:,} combinations valued; best {top or '(base)'} {best:,.0f} output tok/s"
    return (f"{points.plan.name}: {len(points.items)} items ({size:,} combinations), {len(points):,} valued; best "
            f"known {top or '(base)'} {best:,.0f} output tok/s"
            + ("" if top == found else f" (hill-climbed from {found}, {points[found]:,.0f})"))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--noise", type=float, default=0.015)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--pivot", type=Path, help="benchmarks/search_eval.py --json output: pivot's own rows.")
    ap.add_argument(
        "--large",
        action="store_true",
        help="The large plans (benchmarks/peers_plans/, 16 items): valued by the twin on demand, scored "
        "against the best any proposer finds (pivot's campaigns run here, through the method).",
    )
    ap.add_argument(
        "--reference-budget",
        type=int,
        default=256,
        help="--large: each peer's launches for the reference (then hill-climbed from the best found).",
    )
    ap.add_argument(
        "--plans",
        nargs="+",
        help="Plan files of your own, run as --large runs its plans: valued by the twin as launched, pivot's "
        f"campaigns run here; the reference every combination's best up to {EXHAUSTIVE:,} of them.",
    )
    ap.add_argument("--jobs", type=int, default=2, help="--large, --plans: processes for pivot's campaigns.")
    args = ap.parse_args(argv)
    peers: dict[str, object] = {"plan-order": plan_order, "random": random_order}
    for kind in ("tpe", "gp"):
        sampler = optuna_sampler(kind)
        if sampler is None:
            print(f"optuna-{kind}: left out (optuna{' and torch' if kind == 'gp' else ''} not installed)",
                  file=sys.stderr)  # fmt: skip
        else:
            peers[f"optuna-{kind}"] = optuna_order(sampler)
    valued = args.large or args.plans
    print(f"| plan | search | runs | launches to {TARGET} of the {'reference best' if valued else 'grid best'}: "
          "mean (worst) | " + " | ".join(f"score at {b}" for b in BUDGETS) + " | final score |")  # fmt: skip
    print("|" + " --- |" * (5 + len(BUDGETS)))
    if valued:
        paths = [Path(p) for p in args.plans] if args.plans else sorted(LARGE.glob("*.toml"))
        notes = [valued_plan(path, peers, args) for path in paths]
        for note in notes:
            print(f"\n{note}")
        return 0
    grids = json.loads(GRID.read_text())
    pivot_rows = json.loads(args.pivot.read_text()) if args.pivot else []
    for name, grid in sorted(grids.items()):
        mine = [r for r in pivot_rows if r.get("plan") == name and r.get("noise") == args.noise
                and r.get("search") in (True, "twin")]  # the twin-guided search's rows, not greedy's  # fmt: skip
        if mine:
            ratios = [r["final_tok_s"] / grid["best_tok_s"] for r in mine]
            reached = [n for r in mine if (n := _reached(r, grid["best_tok_s"])) is not None]
            worst = "-" if len(reached) < len(mine) else str(max(reached))
            mean = f"{statistics.mean(reached):.1f}" if reached else "-"
            at = [_score_at(mine, b, grid["best_tok_s"]) for b in BUDGETS]
            print(f"| {name} | pivot (twin search, through the method) | {len(mine)} | {mean} ({worst}) | "
                  + " | ".join(at) + f" | {statistics.mean(ratios):.4f} |")  # fmt: skip
        for peer, order in peers.items():
            runs = [run(grid, order, seed, args.noise, args.budget) for seed in range(1, args.seeds + 1)]
            print(_peer_row(name, peer, runs, grid["best_tok_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
