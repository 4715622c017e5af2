"""The wrong-twin evaluation: pivot's campaign when the engine does not behave as the twin the search ranks by.

The sim engine measures with a *truth* (`-o truth=FILE`, tools/engines/sim/truth.py) while its predictor, what the
search ranks candidates by, stays the plan's own stock twin. (An engine's predictor follows its own options, so a
harness that built the truth as a stock engine would hand the search the truth itself and measure nothing.) For
every plan under benchmarks/search_plans/ (or --plans FILES) the truths are, as benchmarks/wrong_twin/ writes them:

- s1: a flag without effect: the item the twin predicts gains most alone on the base configuration (of those whose
  flags the base does not set) does nothing on the target;
- s2: a flag the twin calls neutral costs 8%: the item predicted inside +-3% alone that gains most (the likeliest to
  ride in a bundle) makes every step 1/0.92 as long when it is set;
- s3: the hardware unlike its profile: host overhead per step x2, GEMM efficiency -30% at small row counts
  (gemm_m_half / 0.7: eff ~ m / m_half for m well below it);
- s4: a flag the twin calls neutral gains 8%: the item predicted inside +-3% alone that gains most, of those outside
  the twin's best combination that the engine runs (no refused or no-op flag): the twin settles it unmeasured;
- s5: a flag that costs where the twin says it gains: s1's item costs 10% on the target;
- s6: two wrongs at once: s1's item has no effect and s2's costs 8%;
- s7: the hardware unlike its profile elsewhere: host overhead per step x0.5, KV and attention reads at 0.8 of their
  bandwidth efficiency, all-reduce efficiency x0.6, prefill work per token x2;
- s8: a flag the twin calls a loss gains 8%: of the items outside the twin's best combination that the engine runs
  and that the twin predicts cost NEUTRAL_PCT or more added to it, the one predicted to cost least (a control or a
  cap, both guesses putting it at a loss) gains 8% there on the target: the twin settles it unmeasured as a loss;
- s9: an interaction the twin does not model: the two flag items the twin's best combination needs most (the best
  without each is NEUTRAL_PCT or more the worse; the engine runs them) do what the twin says alone, but together every
  step runs 1/PAIR_SCALE as long (two features that contend for the same resource);
- s10: s9 harder: together every step runs 1/HARD_PAIR_SCALE as long (the one of the two launched second, on a best
  holding the other, no longer gains);
- exact: no truth (the twin is right), the rows benchmarks/search_eval.py prints for the search;
- r1, r2, ... (`--random N`): the twin wrong everywhere at once, at random (seeded by the plan's name and the
  number, so the same files every run): of the flag items the engine runs (none refused, none a no-op), each that
  the base does not set has no effect with probability RANDOM_DEAD, and every other one's throughput is scaled by
  exp(N(0, RANDOM_SIGMA)) with probability RANDOM_SCALED; the hardware's figures of RANDOM_HARDWARE are each
  multiplied by exp(N(0, sd)), efficiencies kept at or under 1.

`--truth FILE...` runs those truth files instead. Each campaign runs as a user would run it (`pivot run PLAN
--engine sim -o truth=FILE`, the autopilot, `continue` at every pivot), without noise (seed 0) and with --noise over
--seeds seeds, and is scored against the exhaustive grid *of the truth* (every combination of the plan's items,
measured noise-free with the truth; cached in benchmarks/wrong_twin_grid.json):

    .venv/bin/python benchmarks/wrong_twin.py --jobs 2             # the table (about 17 minutes on 2 shared cores)
    .venv/bin/python benchmarks/wrong_twin.py --seeds 3 --scenarios s1,s2
    .venv/bin/python benchmarks/wrong_twin.py --seeds 3 --scenarios s4,exact --no-expectations  # no plan numbers

The acceptance ([learn]): a ratio of at least 0.99 of the truth grid's best on every case, launches within 10% of
the grid's size (15% under 100 points), 0 false adoptions, 0 false regressions, 0 aborts; the `ok` column says
which row holds it (ratio and launches as means over the seeds, the rest over every campaign).

A campaign adopts no change smaller than its least gain (`--min-gain`, the session's `min_gain_pct`, 3% by
default): where the truth's best is less than that above where a campaign ended, the gain left was below what the
user asked for, not missed by the search. The `left` column gives the truth best's gain over the campaign's final
configuration (mean over the campaigns); `ok` reads `floor` for a row that holds everything but the ratio, and
whose every campaign under 0.99 has less than the least gain left. Run with `--min-gain 1` to see whether the
search finds those small gains when it may adopt them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from search_eval import GRID, PLANS, _config, _items, campaign, fresh, grid, true_tok  # noqa: E402

from agent import models as m  # noqa: E402
from agent.plans import load_plan  # noqa: E402

TRUTHS = ROOT / "benchmarks" / "wrong_twin"
TRUTH_GRID = ROOT / "benchmarks" / "wrong_twin_grid.json"
ORIGINALS: dict[Path, Path] = {}  # a plan copy without expected impacts -> its plan (same items, same grid)
SCENARIOS = ("exact", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10")
NEUTRAL_PCT = 3.0  # an item predicted within this of no change alone is "neutral" to the twin (s2)
COST_SCALE = 0.92  # s2: the neutral item costs 8%
GAIN_SCALE = 1.08  # s4: the neutral item gains 8%
HOST_SCALE = 2.0  # s3: host overhead per step
SMALL_ROWS_EFFICIENCY = 0.7  # s3: GEMM efficiency at small row counts
HARM_SCALE = 0.90  # s5: the twin's best item alone costs 10%
PAIR_SCALE = 0.85  # s9: the twin's two best gains cost 15% together
HARD_PAIR_SCALE = 0.70  # s10: 30% (the second of them launched on the first no longer gains)
S7_SCALES = {  # s7: the profile's figures multiplied
    "calibration.host_ms_per_step": 0.5,
    "calibration.bandwidth_efficiency": 0.8,
    "calibration.allreduce_efficiency": 0.6,
    "calibration.prefill_us_per_token": 2.0,
}
RANDOM_DEAD = 0.15  # r: an item's flags ignored by the target
RANDOM_SCALED = 0.6  # r: an item's throughput scaled on the target
RANDOM_SIGMA = 0.05  # r: the log-sd of that scale (0.05: a third of the items off by more than 5%)
RANDOM_HARDWARE = {  # r: a profile figure and the log-sd of its factor
    "calibration.host_ms_per_step": 0.4,
    "calibration.host_us_per_request": 0.4,
    "calibration.gemm_m_half": 0.3,
    "calibration.gemm_efficiency_max": 0.1,
    "calibration.bandwidth_efficiency": 0.1,
    "calibration.allreduce_efficiency": 0.2,
    "calibration.prefill_us_per_token": 0.4,
    "calibration.eager_ms_per_step": 0.4,
}


def _flag_lines(it: m.PlanItem, **effect: object) -> list[str]:
    out = []
    flags = list(it.flags.flags) if it.flags is not None else []
    for flag in flags if "no_effect" in effect else flags[:1]:
        value = flag.value if isinstance(flag.value, str) or flag.value is None else " ".join(flag.value)
        out += ["[[flags]]", f"flag = {json.dumps(flag.name)}"]
        out += [f"value = {json.dumps(value)}"] if value is not None else []
        out += [f"{k} = {json.dumps(v)}" for k, v in effect.items()] + [""]
    return out


def _match(it: m.PlanItem) -> str:
    """The item's first flag as a truth's inline table (an interaction's member)."""
    flag = it.flags.flags[0] if it.flags is not None else None
    assert flag is not None, it.id
    value = flag.value if isinstance(flag.value, str) or flag.value is None else " ".join(flag.value)
    return f"{{ flag = {json.dumps(flag.name)}" + (f", value = {json.dumps(value)}" if value is not None else "") + " }"


def _scaled_truth(
    scenario: str, it: m.PlanItem, predicted_pct: float, scale: float, effect: str = "", where: str = "alone"
) -> str:
    """The truth file's text of an item the twin predicts `predicted_pct` `where` (alone, or on its best) that makes
    every step 1/scale as long on the target (s2: costs, s4: gains; `effect`: what it does, in words, where it is not
    `scale`'s)."""
    effect = effect or (f"costs {100 * (1 - scale):.0f}%" if scale < 1 else f"gains {100 * (scale - 1):.0f}%")
    words = f"{it.title}: the twin predicts {predicted_pct:+.1f}% {where}; on this target it {effect}"
    lines = _flag_lines(it, throughput_scale=scale)
    return "\n".join([f'name = "{scenario}-{it.id}"', f"description = {json.dumps(words)}", "", *lines])


def _alone(plan: m.Plan) -> dict[str, float]:
    """Each flag item's predicted change alone on the base configuration (the stock twin, noise-free), in %."""
    base = true_tok(plan, plan.target.base_config())
    out = {}
    for it in _items(plan):
        if it.flags is None or it.remove_flags or it.power_limit_w is not None or not base:
            continue
        if any(f.name in plan.target.base_config() for f in it.flags.flags):
            continue  # dropping the flag would bring back SGLang's default, not the base's value
        out[it.id] = (true_tok(plan, it.apply(plan.target.base_config())) - base) / base * 100
    return out


def _runs(plan: m.Plan, it: m.PlanItem) -> bool:
    """Whether the engine runs the item's flags on the base configuration: none refused, none a no-op."""
    from tools.engines.catalog import audit, load_catalog

    issues = audit(load_catalog("sglang", "0.5.23"), it.apply(plan.target.base_config()))
    names = set(it.flags.names()) if it.flags is not None else set()
    return not any(i.blocking or (i.flag in names and i.status == "noop") for i in issues)


def grid_of(plan_path: Path) -> dict:
    """The plan's grid under the stock twin (benchmarks/search_grid.json, computed when it is not there)."""
    plan_path = ORIGINALS.get(plan_path, plan_path)
    name = load_plan(str(plan_path)).name
    stock = json.loads(GRID.read_text()) if GRID.exists() else {}
    return stock[name] if fresh(stock.get(name), plan_path) else grid(plan_path)


def truth_texts(plan_path: Path) -> dict[str, str]:
    """The generated truths of one plan (s1 to s10) as the text of their files; a scenario the plan cannot have (no
    item fits it) is left out."""
    plan = load_plan(str(plan_path))
    alone = _alone(plan)
    out: dict[str, str] = {}
    if alone:
        dead = max(alone, key=lambda i: (alone[i], i))
        words = f"{plan.item(dead).title}: the twin predicts {alone[dead]:+.1f}% alone; on this target it has no effect"
        out["s1"] = "\n".join(
            [
                f'name = "s1-{dead}"',
                f"description = {json.dumps(words)}",
                "",
                *_flag_lines(plan.item(dead), no_effect=True),
            ]
        )
    neutral = {i: v for i, v in alone.items() if abs(v) < NEUTRAL_PCT}
    best = tuple(grid_of(plan_path)["best"].split("+")) if grid_of(plan_path)["best"] else ()
    if neutral:
        # the neutral item a search would most likely launch: one in the twin's best combination (the one it
        # needs least there), else the one predicted to gain most alone
        riders = [i for i in neutral if i in best]
        if riders:
            costly = max(riders, key=lambda i: (true_tok(plan, _config(plan, tuple(x for x in best if x != i))), i))
        else:
            costly = max(neutral, key=lambda i: (neutral[i], i))
        out["s2"] = _scaled_truth("s2", plan.item(costly), neutral[costly], COST_SCALE)
    if alone:
        out["s5"] = _scaled_truth("s5", plan.item(dead), alone[dead], HARM_SCALE)
    if alone and neutral and costly != dead:
        words = f"{plan.item(dead).title} has no effect and {plan.item(costly).title} costs 8% (s1 and s2 at once)"
        lines = [
            *_flag_lines(plan.item(dead), no_effect=True),
            *_flag_lines(plan.item(costly), throughput_scale=COST_SCALE),
        ]
        out["s6"] = "\n".join([f'name = "s6-{dead}-{costly}"', f"description = {json.dumps(words)}", "", *lines])
    quiet = {i: v for i, v in neutral.items() if i not in best and _runs(plan, plan.item(i))}
    if quiet:  # the neutral item a search would least likely launch, and the engine runs
        helps = max(quiet, key=lambda i: (quiet[i], i))
        out["s4"] = _scaled_truth("s4", plan.item(helps), quiet[helps], GAIN_SCALE)
    top = true_tok(plan, _config(plan, best))
    on_best = {i: (true_tok(plan, _config(plan, (*best, i))) - top) / top * 100 for i in alone if i not in best}
    losses = {i: v for i, v in on_best.items() if v <= -NEUTRAL_PCT and _runs(plan, plan.item(i))}
    if losses and top:  # of what the twin settles as a loss on its best, the one a user would least expect to be one
        gains = max(losses, key=lambda i: (losses[i], i))
        scale = GAIN_SCALE / (1 + losses[gains] / 100)
        effect = f"gains {100 * (GAIN_SCALE - 1):.0f}% there"
        out["s8"] = _scaled_truth("s8", plan.item(gains), losses[gains], scale, effect, where="on its best")
    need = {i: (top - true_tok(plan, _config(plan, tuple(x for x in best if x != i)))) / top * 100
            for i in best if top and plan.item(i).flags is not None and plan.item(i).flags.flags
            and _runs(plan, plan.item(i))}  # fmt: skip
    pair = sorted((i for i in need if need[i] >= NEUTRAL_PCT), key=lambda i: (-need[i], i))[:2]
    if len(pair) == 2:  # the two the twin's best needs most contend on the target: together they cost 15% more
        a, b = plan.item(pair[0]), plan.item(pair[1])
        for sc, scale in (("s9", PAIR_SCALE), ("s10", HARD_PAIR_SCALE)):
            words = (f"{a.title} and {b.title}, the twin's best {need[pair[0]]:.1f}% and {need[pair[1]]:.1f}% the "
                     f"worse without each, together cost {100 * (1 - scale):.0f}% on this target beyond what each does")  # fmt: skip
            out[sc] = "\n".join([f'name = "{sc}-{pair[0]}-{pair[1]}"', f"description = {json.dumps(words)}", "",
                                  "[[interactions]]", f"throughput_scale = {scale}",
                                  f"flags = [{_match(a)}, {_match(b)}]", ""])  # fmt: skip
    out["s3"] = "\n".join([
        'name = "s3-hardware"',
        f'description = "host overhead per step x{HOST_SCALE:g}, GEMM efficiency -{100 * (1 - SMALL_ROWS_EFFICIENCY):.0f}% '
        'at small row counts"',
        "", "[hardware.scale]", f'"calibration.host_ms_per_step" = {HOST_SCALE}',
        f'"calibration.gemm_m_half" = {1 / SMALL_ROWS_EFFICIENCY:.6f}', "",
    ])  # fmt: skip
    words = ", ".join(f"{k.split('.')[-1]} x{v:g}" for k, v in S7_SCALES.items())
    scales = [f'"{k}" = {v}' for k, v in S7_SCALES.items()]
    out["s7"] = "\n".join(
        ['name = "s7-hardware"', f"description = {json.dumps(words)}", "", "[hardware.scale]", *scales, ""]
    )
    return out


def random_text(plan_path: Path, k: int) -> str:
    """The text of the plan's k-th random truth (r<k>): every item and the hardware a little or much unlike the
    twin, drawn from a generator seeded by the plan's name and k."""
    from tools.profiles import load_hardware

    plan = load_plan(str(plan_path))
    rng = random.Random(f"{plan.name}|r{k}")
    base = plan.target.base_config()
    lines, words = [], []
    for it in _items(plan):
        if it.flags is None or not it.flags.flags or it.remove_flags or it.power_limit_w is not None:
            continue
        if not _runs(plan, it):  # the engine refuses the item or ignores its flags: the target cannot differ there
            continue
        draw, scale = rng.random(), math.exp(rng.gauss(0.0, RANDOM_SIGMA))
        if draw < RANDOM_DEAD and not any(f.name in base for f in it.flags.flags):
            lines += _flag_lines(it, no_effect=True)
            words.append(f"{it.id} no effect")
        elif draw < RANDOM_DEAD + RANDOM_SCALED and round(scale, 3) != 1.0:
            lines += _flag_lines(it, throughput_scale=round(scale, 3))
            words.append(f"{it.id} x{scale:.3f}")
    calibration = load_hardware(plan.target.hardware).calibration.model_dump()
    hardware = []
    for dotted, sd in RANDOM_HARDWARE.items():
        factor = math.exp(rng.gauss(0.0, sd))
        value = calibration.get(dotted.split(".")[-1])
        if not isinstance(value, int | float) or not value:
            continue
        if dotted.endswith("efficiency") or dotted.endswith("efficiency_max"):
            factor = min(factor, 0.99 / value)  # an efficiency stays under 1
        hardware.append(f'"{dotted}" = {factor:.3f}')
        words.append(f"{dotted.split('.')[-1]} x{factor:.3f}")
    head = [f'name = "r{k}"', f"description = {json.dumps('random: ' + ', '.join(words))}", ""]
    return "\n".join([*head, *lines, "[hardware.scale]", *hardware, ""])


def write_truths(paths: list[Path], scenarios: list[str]) -> list[tuple[Path, str, str | None]]:
    """(plan, scenario, truth file or None for exact) for every plan and scenario; the files under
    benchmarks/wrong_twin/<plan>/ are written when their text changed."""
    cases = []
    for p in paths:
        texts = truth_texts(p)
        texts.update({sc: random_text(p, int(sc[1:])) for sc in scenarios if re.fullmatch(r"r[1-9][0-9]*", sc)})
        for sc in scenarios:
            if sc == "exact":
                cases.append((p, sc, None))
            elif sc in texts:
                f = TRUTHS / load_plan(str(p)).name / f"{sc}.toml"
                f.parent.mkdir(parents=True, exist_ok=True)
                if not f.exists() or f.read_text() != texts[sc]:
                    f.write_text(texts[sc])
                cases.append((p, sc, str(f)))
            else:
                print(f"{p.name}: no item fits {sc}: skipped", file=sys.stderr)
    return cases


def _grid_key(plan_path: Path, truth: str | None) -> str:
    text = Path(truth).read_text() if truth else ""
    return f"{load_plan(str(plan_path)).name}|{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _grid_job(args: tuple[Path, str | None]) -> tuple[str, dict]:
    plan_path, truth = args
    return _grid_key(plan_path, truth), grid(plan_path, truth)


def grids(cases: list[tuple[Path, str, str | None]], jobs: int) -> dict[str, dict]:
    """The truth grid of every case (the stock grid for exact), from the caches or computed and cached."""
    stock = json.loads(GRID.read_text()) if GRID.exists() else {}
    cached = json.loads(TRUTH_GRID.read_text()) if TRUTH_GRID.exists() else {}
    out: dict[str, dict] = {}
    missing = []
    for copy, _, truth in cases:
        key, p = _grid_key(copy, truth), ORIGINALS.get(copy, copy)  # a copy's grid is its plan's: cached once
        name = load_plan(str(p)).name
        if truth is None and fresh(stock.get(name), p):
            out[key] = stock[name]
        elif fresh(cached.get(key), p):
            out[key] = cached[key]
        elif (p, truth) not in missing:
            missing.append((p, truth))
    if missing:
        with ProcessPoolExecutor(max(1, jobs)) as pool:
            for key, g in pool.map(_grid_job, missing):
                out[key] = cached[key] = g
                print(
                    f"grid {key}: {g['size']} points, best {g['best'] or 'base'} {g['best_tok_s']:,.0f}",
                    file=sys.stderr,
                )
        TRUTH_GRID.write_text(json.dumps(cached, indent=1, sort_keys=True) + "\n")
    return out


def launch_budget(size: int) -> float:
    """The launches a campaign may take: 10% of the grid's size, 15% under 100 points."""
    return size * (0.15 if size < 100 else 0.10)


TABLE_HEADER = (
    "| plan | truth | noise | campaigns | ratio to truth grid best: mean (min) | launches: mean (max) | budget "
    "| aborts | false adoptions | false regressions | left | ok |"
)


def left_pct(r: dict) -> float:
    """The truth best's gain (%) over the configuration a campaign ended at."""
    return (1 / r["ratio"] - 1) * 100 if r["ratio"] > 0 else float("inf")


def floor_bound(r: dict) -> bool:
    """A campaign under 0.99 of the truth best with less than its least gain left: the user's floor stopped it."""
    return r["ratio"] < 0.99 and left_pct(r) < r["min_gain_pct"]


def row(plan: str, scenario: str, noise: str, rs: list[dict], g: dict | None) -> str:
    """One line of the table: the campaigns of one plan, truth and noise (g: their truth grid; None: several)."""
    ratios = [r["ratio"] for r in rs]
    launches = [r["launches"] for r in rs]
    budget = launch_budget(g["size"]) if g is not None else None
    bad = sum(r["aborted"] + r["false_adoptions"] + r["false_regressions"] for r in rs)
    near = statistics.mean(ratios) >= 0.99 and min(ratios) >= 0.99
    fits = all(r["launches"] <= r["budget"] for r in rs) if budget is None else statistics.mean(launches) <= budget
    short = [r for r in rs if r["ratio"] < 0.99]
    ok = "yes" if near and fits and not bad else (
        "floor" if fits and not bad and all(floor_bound(r) for r in short) else "NO")  # fmt: skip
    return (
        f"| {plan} | {scenario} | {noise} | {len(rs)} | {statistics.mean(ratios):.4f} ({min(ratios):.4f}) | "
        f"{statistics.mean(launches):.1f} ({max(launches)}) | {f'{budget:.1f}' if budget is not None else '-'} | "
        f"{sum(r['aborted'] for r in rs)} | {sum(r['false_adoptions'] for r in rs)} | "
        f"{sum(r['false_regressions'] for r in rs)} | {statistics.mean(left_pct(r) for r in rs):+.2f}% | {ok} |"
    )


def without_expectations(paths: list[Path]) -> list[Path]:
    """Copies of the plans (in a new temporary folder) whose items' expected impacts say no number: the search then
    has only the twin's word for what an item does, and the check of the twin no second opinion (`doubted`)."""
    out = Path(tempfile.mkdtemp(prefix="pivot-no-expectations-"))
    for path in paths:
        text = re.sub(r'^expected_impact = ".*"$', 'expected_impact = "Should help."', path.read_text(), flags=re.M)
        (out / path.name).write_text(text)
        ORIGINALS[out / path.name] = path
    return [out / path.name for path in paths]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", nargs="*", help="Plan files (default: benchmarks/search_plans/*.toml).")
    ap.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help="Of exact, s1 to s10 and rK, the K-th random truth (comma-separated): r4,r5 runs truths --random 3 "
        "does not, a held-out set.",
    )
    ap.add_argument("--random", type=int, default=0, metavar="N", help="Also N random truths per plan (r1 to rN).")
    ap.add_argument("--truth", nargs="*", help="Truth files to run instead of the generated scenarios.")
    ap.add_argument("--seeds", type=int, default=5, help="Seeds of the noisy campaigns.")
    ap.add_argument("--noise", type=float, default=0.015)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", dest="as_json", help="Also write every campaign's scores to this file.")
    ap.add_argument("--steps", action="store_true", help="Print every campaign's experiments (stderr).")
    ap.add_argument("--min-gain", type=float, help="The campaigns' least gain adopted, %% (default: the setting's, 3).")
    ap.add_argument("--no-expectations", action="store_true", help="Run the plans with no number in any item's "
                    "expected impact (the twin's word alone).")  # fmt: skip
    opts = ap.parse_args()
    paths = [Path(p) for p in opts.plans] if opts.plans else sorted(PLANS.glob("*.toml"))
    paths = without_expectations(paths) if opts.no_expectations else paths
    if opts.truth:
        cases = [(p, Path(t).stem, str(Path(t).absolute())) for p in paths for t in opts.truth]
    else:
        scenarios = [s.strip() for s in opts.scenarios.split(",") if s.strip()]
        scenarios += [f"r{k}" for k in range(1, opts.random + 1) if f"r{k}" not in scenarios]
        unknown = sorted(s for s in set(scenarios) - set(SCENARIOS) if not re.fullmatch(r"r[1-9][0-9]*", s))
        if unknown:
            ap.error(f"unknown scenarios {', '.join(unknown)} (of {', '.join(SCENARIOS)})")
        cases = write_truths(paths, scenarios)
    truth_grids = grids(cases, opts.jobs)
    noises = ((0.0, [0]), (opts.noise, list(range(1, opts.seeds + 1))))
    jobs = [(case, (str(case[0]), noise, seed, True, case[2], None, opts.min_gain)) for case in cases
            for noise, seeds in noises for seed in seeds]  # fmt: skip
    with ProcessPoolExecutor(max(1, opts.jobs)) as pool:
        results = list(pool.map(campaign, [args for _, args in jobs]))
    for (case, _), r in zip(jobs, results, strict=True):
        g = truth_grids[_grid_key(case[0], case[2])]
        r["scenario"] = case[1]
        r["ratio"] = r["final_tok_s"] / g["best_tok_s"] if g["best_tok_s"] else 0.0
        r["grid_size"], r["budget"], r["grid_best"] = g["size"], launch_budget(g["size"]), g["best"]
        if opts.steps:
            print(f"{r['plan']} {r['scenario']} noise {r['noise']:g} seed {r['seed']}: ratio {r['ratio']:.4f} "
                  f"(grid best {g['best'] or 'base'})\n  " + "\n  ".join(r["steps"]), file=sys.stderr)  # fmt: skip
    if opts.as_json:
        Path(opts.as_json).write_text(json.dumps(results, indent=1) + "\n")
    print(TABLE_HEADER)
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    groups: dict[tuple, list[dict]] = {}
    for (case, _), r in zip(jobs, results, strict=True):
        groups.setdefault((r["plan"], r["scenario"], r["noise"], _grid_key(case[0], case[2])), []).append(r)
    for (plan, sc, noise, key), rs in groups.items():
        print(row(plan, sc, f"{noise:g}", rs, truth_grids[key]))
    for sc in dict.fromkeys(r["scenario"] for r in results):
        print(row("all", sc, "both", [r for r in results if r["scenario"] == sc], None))
    for r in results:
        if r["aborted"]:
            print(f"aborted: {r['plan']} {r['scenario']} noise {r['noise']:g} seed {r['seed']}: {r['outcome']}: "
                  f"{r['error']}", file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
