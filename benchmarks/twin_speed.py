"""How many times faster than real time the twin simulates a five-level sweep up to concurrency 2048.

The ratio is the simulated benchmark time (the sum of the levels' durations, which is what the sweep
would take on the GPUs) over the CPU time this process spent simulating it (one core).

    python benchmarks/twin_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.plans import load_plan
from tools.engines.sim.twin import Twin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    plan = load_plan("glm5-nvfp4-rtxpro6000x8")
    spec = plan.workload.model_copy(update={"concurrency": [1, 256, 512, 1024, 2048]})
    twin = Twin.build("glm-5-nvfp4", "rtx-pro-6000-blackwell", 8, plan.target.base_config())
    print(f"{'run':>4} {'simulated s':>12} {'cpu s':>8} {'x real time':>12}")
    ratios = []
    for i in range(args.repeats):
        t0 = time.process_time()
        results = twin.predict(spec)
        cpu = time.process_time() - t0
        simulated = sum(level.duration for level, _ in results)
        ratios.append(simulated / cpu)
        print(f"{i + 1:>4} {simulated:>12.1f} {cpu:>8.2f} {simulated / cpu:>12.0f}")
    print(f"slowest run: {min(ratios):.0f}x real time (target: at least 200x)")
    print(f"levels: {', '.join(f'{lv.max_concurrency}: {lv.output_throughput:.0f} tok/s' for lv, _ in results)}")


if __name__ == "__main__":
    main()
