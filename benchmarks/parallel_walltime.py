"""The wall time of a campaign's tiers on the simulated engine: serial against `--ray local --parallel N`.

Each mode runs the same plan from a fresh home with `pivot run` and the same answers (`continue` at each pivot, then
`stop`), on `sim-http` (real server processes and HTTP streams, the twin's clock sped up `--time-scale` times, each
server taking `--startup-s` seconds to start as a model load would). Printed side by side: the wall time of each
tier (to its pivot), the launches and runs, the steps that ran several at once, and the best configuration found.

    .venv/bin/python benchmarks/parallel_walltime.py                 # serial, --parallel 2 and 4 on 8 fake GPUs
    .venv/bin/python benchmarks/parallel_walltime.py --parallel 1 2 4 --startup-s 30

Needs the ray extra (`pip install -e '.[ray]'`). The plan (benchmarks/parallel_plans/) is TP2 on an 8-GPU host, so
four of its configurations fit at once. On a 2-core machine the HTTP clients of several servers share the cores:
the levels say when the host fell behind the twin's clock (its numbers are then slower than the twin's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.session import Paths  # noqa: E402
from agent.store import Store  # noqa: E402

PLAN = ROOT / "benchmarks" / "parallel_plans" / "llama70b-h200-tp2.toml"
PIVOT = [sys.executable, "-m", "agent.cli"]


def _pivot(home: Path, *args: str) -> tuple[dict, float]:
    start = time.monotonic()
    proc = subprocess.run([*PIVOT, *args, "-q", "--json"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PIVOT_HOME": str(home)}, timeout=3600)  # fmt: skip
    wall = time.monotonic() - start
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        raise SystemExit(f"pivot {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout), wall


def campaign(mode: str, args: argparse.Namespace) -> dict:
    """One campaign from a fresh home; `mode` is serial or parallel-N."""
    home = Path(tempfile.mkdtemp(prefix=f"pivot-walltime-{mode}-"))
    opts = ["--engine", "sim-http", "-o", f"time_scale={args.time_scale}", "-o", f"startup_s={args.startup_s}",
            "--noise", "0.015", "--seed", "0"]  # fmt: skip
    if mode != "serial":
        opts += ["--ray", "local", "--ray-gpus", str(args.gpus), "--parallel", mode.split("-")[1]]
    out, wall = _pivot(home, "run", str(args.plan), *opts)
    tiers = [wall]
    session = out["session"]
    while out["status"] == "pivot" and len(tiers) < args.tiers:
        extra = ["--ray", "local", "--ray-gpus", str(args.gpus)] if mode != "serial" else []
        out, wall = _pivot(home, "resume", session, "--answer", "continue", *extra)
        tiers.append(wall)
    with Store(Paths(home).db_path) as store:
        experiments = store.experiments(session)
        runs = {e.id: store.bench_results(e.id or 0) for e in experiments}
        adopted = [e for e in experiments if e.verdict == "adopted"] or [e for e in experiments if e.kind == "baseline"]
        best = adopted[-1] if adopted else None
        top = None
        if best is not None:
            level = max(best.workload.concurrency)
            values = [lv.output_throughput for r in runs[best.id] for lv in r.levels if lv.max_concurrency == level]
            top = sum(values) / len(values) if values else None
        lagging = sum(1 for rs in runs.values() for r in rs for lv in r.levels
                      if any("behind the twin" in w for w in lv.warnings))  # fmt: skip
    return {
        "mode": mode,
        "tiers_s": tiers,
        "launches": sum(1 for rs in runs.values() if rs),
        "runs": sum(len(rs) for rs in runs.values()),
        "verdicts": [e.verdict for e in experiments],
        "best": f"#{best.id} {'+'.join(best.plan_items) or 'baseline'}" if best is not None else "none",
        "best_tok_s": top,
        "lagging_levels": lagging,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", type=Path, default=PLAN)
    parser.add_argument("--parallel", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--gpus", type=int, default=8, help="GPUs the local Ray instance declares")
    parser.add_argument("--time-scale", type=float, default=1.0, help="higher falls behind on a 2-core host")
    parser.add_argument("--startup-s", type=float, default=10.0, help="a server's start (a model load)")
    parser.add_argument("--tiers", type=int, default=2, help="tiers to run (one pivot each)")
    args = parser.parse_args()
    results = [campaign("serial", args)] + [campaign(f"parallel-{n}", args) for n in args.parallel]
    serial = results[0]
    print(f"plan {args.plan.name}, sim-http x{args.time_scale:g}, startup {args.startup_s:g} s, {args.gpus} GPUs, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'mode':<12} {'tier walls (s)':<22} {'total':>7} {'x serial':>9} {'launches':>9} {'runs':>5} "
          f"{'best':<18} {'tok/s':>7} {'lagging':>8}")  # fmt: skip
    for r in results:
        total = sum(r["tiers_s"])
        ratio = total / sum(serial["tiers_s"])
        walls = " + ".join(f"{t:.1f}" for t in r["tiers_s"])
        tok = f"{r['best_tok_s']:,.0f}" if r["best_tok_s"] else "-"
        print(f"{r['mode']:<12} {walls:<22} {total:>7.1f} {ratio:>9.2f} {r['launches']:>9} {r['runs']:>5} "
              f"{r['best']:<18} {tok:>7} {r['lagging_levels']:>8}")  # fmt: skip
    print("verdicts:")
    for r in results:
        print(f"  {r['mode']:<12} {', '.join(str(v) for v in r['verdicts'])}")


if __name__ == "__main__":
    main()
