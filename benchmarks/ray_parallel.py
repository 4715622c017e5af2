"""The wall time of a tier of independent experiments: one at a time (the local executor) against a local Ray
instance running up to 1, 2 and 4 at once (the Ray executor, `pivot run --ray local --parallel N`).

Every experiment is a sim-http server (the twin served over HTTP as a real process) with `--tp-size 2`, launched,
swept and stopped as pivot does; the instance declares 8 GPUs, so 4 such experiments fit at once. `--startup-s`
stands for a real engine's launch (minutes for a large model), during which the host does nothing: that is the
time parallel runs overlap. The numbers are simulated, the wall times are measured on this host (on a host with
few cores, parallel sweeps also compete for CPU, which real GPU hosts do not).

    python benchmarks/ray_parallel.py [--experiments 4] [--startup-s 10] [--time-scale 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent import models as m
from agent.contracts import ExperimentTask
from tools.executors.local import LocalExecutor


def tasks(n: int, startup_s: float, time_scale: float, folder: Path) -> list[ExperimentTask]:
    options = {"model_profile": "llama-3.3-70b-fp8", "hardware": "h200", "gpus": 8, "time_scale": time_scale,
               "startup_s": startup_s}  # fmt: skip
    spec = m.BenchSpec(random_input_len=256, random_output_len=128, concurrency=[1, 8, 32])
    common = {"session_id": "bench", "run": 1, "engine": "sim-http", "engine_options": options, "workload": spec,
              "config": m.ServerConfig.parse("--tp-size 2"), "gpus": 2, "ready_timeout_s": startup_s + 120}  # fmt: skip
    return [
        ExperimentTask(
            experiment_id=i,
            seed=i,
            log_path=str(folder / f"{i}.log"),
            raw_path=str(folder / f"{i}.jsonl"),
            mark=f"bench-ray-parallel-{i}",
            **common,
        )
        for i in range(1, n + 1)
    ]


def timed(executor: object, batch: list[ExperimentTask]) -> tuple[float, list[str]]:
    started = time.monotonic()
    statuses = [o.status for o in executor.run(batch, lambda e: None)]  # type: ignore[attr-defined]
    return time.monotonic() - started, statuses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiments", type=int, default=4)
    ap.add_argument("--startup-s", type=float, default=10.0)
    ap.add_argument("--time-scale", type=float, default=20.0)
    args = ap.parse_args()
    from tools.executors.ray_cluster import RayExecutor

    folder = Path(tempfile.mkdtemp(prefix="pivot-ray-parallel-"))
    batch = tasks(args.experiments, args.startup_s, args.time_scale, folder)
    rows = [("local (serial)", *timed(LocalExecutor(), batch))]
    ray = RayExecutor("local", 1, num_gpus=8)
    try:
        for parallel in (1, 2, 4):
            ray.parallel = parallel
            rows.append((f"ray --parallel {parallel}", *timed(ray, batch)))
    finally:
        ray.close()
    serial = rows[0][1]
    print(f"{args.experiments} experiments (sim-http, --tp-size 2, startup {args.startup_s:g} s, "
          f"time scale {args.time_scale:g})")  # fmt: skip
    print(f"{'executor':<18} {'wall s':>8} {'vs serial':>10}  outcomes")
    for name, wall, statuses in rows:
        print(f"{name:<18} {wall:8.1f} {serial / wall:9.2f}x  {','.join(sorted(set(statuses)))}")


if __name__ == "__main__":
    main()
