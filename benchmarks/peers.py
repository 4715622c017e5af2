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
"-" when the budget ran out first), and its score at budgets of 8, 16 and 32 launches. pivot's own rows come from
benchmarks/search_eval.py's --json (its campaigns as a user runs them, through the method, the baseline's two runs
included):

    .venv/bin/python benchmarks/search_eval.py --modes search --seeds 3 --json /tmp/pivot.json
    .venv/bin/python benchmarks/peers.py --pivot /tmp/pivot.json --seeds 10

Optuna's GPSampler needs torch and is left out where torch is not installed (it says so). Here the peers run on the
grid, with no method (no noise band, no reruns): what a plain tuner does. The same peers *inside* pivot's method
(`pivot run --search optuna-tpe|random`, tools/peers.py) are scored by benchmarks/search_eval.py:

    .venv/bin/python benchmarks/search_eval.py --modes search,optuna-tpe,random --seeds 2 --max-launches 16
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "benchmarks" / "search_grid.json"
BUDGETS = (8, 16, 32)
TARGET = 0.99
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


def random_order(items: list[str], measure: Measure, rng: random.Random) -> Iterator[tuple[str, ...]]:
    combos = [tuple(i for i, bit in zip(items, f"{n:0{len(items)}b}", strict=True) if bit == "1")
              for n in range(1, 2 ** len(items))]  # fmt: skip
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
    """The incumbent's true score after each launch (up to `budget` launches)."""
    rng = random.Random(seed)
    points, best = grid["points"], grid["best_tok_s"]
    measured: dict[tuple[str, ...], list[float]] = {}

    def measure(combo: tuple[str, ...]) -> float:
        true = points.get(key(combo)) or 0.0  # a combination that crashes measures nothing
        value = true * (1 + noise * rng.gauss(0, 1))
        measured.setdefault(combo, []).append(value)
        return value

    scores = []
    for _ in order(list(grid["items"]), measure, rng):
        incumbent = max(measured, key=lambda c: statistics.mean(measured[c]))
        scores.append((points.get(key(incumbent)) or 0.0) / best)
        if len(scores) >= budget:
            break
    return scores


def launches_to(scores: list[float]) -> int | None:
    return next((i + 1 for i, s in enumerate(scores) if s >= TARGET), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--noise", type=float, default=0.015)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--pivot", type=Path, help="benchmarks/search_eval.py --json output: pivot's own rows.")
    args = ap.parse_args(argv)
    grids = json.loads(GRID.read_text())
    peers: dict[str, object] = {"plan-order": plan_order, "random": random_order}
    for kind in ("tpe", "gp"):
        sampler = optuna_sampler(kind)
        if sampler is None:
            print(f"optuna-{kind}: left out (optuna{' and torch' if kind == 'gp' else ''} not installed)",
                  file=sys.stderr)  # fmt: skip
        else:
            peers[f"optuna-{kind}"] = optuna_order(sampler)
    pivot_rows = json.loads(args.pivot.read_text()) if args.pivot else []
    print(f"| plan | search | runs | launches to {TARGET} of the grid best: mean (worst) | "
          + " | ".join(f"score at {b}" for b in BUDGETS) + " | final score |")  # fmt: skip
    print("|" + " --- |" * (5 + len(BUDGETS)))
    for name, grid in sorted(grids.items()):
        mine = [r for r in pivot_rows if r.get("plan") == name and r.get("noise") == args.noise]
        if mine:
            ratios = [r["final_tok_s"] / grid["best_tok_s"] for r in mine]
            reached = [r["launches"] for r in mine if r["final_tok_s"] / grid["best_tok_s"] >= TARGET]
            worst = "-" if len(reached) < len(mine) else str(max(reached))
            mean = f"{statistics.mean(reached):.1f}" if reached else "-"
            print(f"| {name} | pivot (twin search, through the method) | {len(mine)} | {mean} ({worst}) | "
                  + " | ".join("" for _ in BUDGETS) + f" | {statistics.mean(ratios):.4f} |")  # fmt: skip
        for peer, order in peers.items():
            runs = [run(grid, order, seed, args.noise, args.budget) for seed in range(1, args.seeds + 1)]
            reached = [launches_to(s) for s in runs]
            got = [x for x in reached if x is not None]
            mean = f"{statistics.mean(got):.1f}" if got else "-"
            worst = str(max(got)) if len(got) == len(reached) else "-"
            at = [statistics.mean(s[min(b, len(s)) - 1] for s in runs) for b in BUDGETS]
            final = statistics.mean(s[-1] for s in runs)
            print(f"| {name} | {peer} | {len(runs)} | {mean} ({worst}) | "
                  + " | ".join(f"{x:.4f}" for x in at) + f" | {final:.4f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
