#!/usr/bin/env python3
"""Check pivot's energy and power-limit code on a real GPU: the energy counter against the power integral under a
bf16 matmul load, J per matmul from each, and whether the driver lets this process set a power limit.

The power limit is never changed: `set_power_limits` is called with the GPU's current limit (the same value, so the
GPU's setting stays as it was) to see whether NVML takes a set here (root, a driver that allows it) or refuses it,
and in which words; the limit is read back after `restore()`. The load runs for --seconds while pivot's NVML reader
samples every 0.2 s, as a benchmark level does.

    python3 scripts/nvml_power_check.py --out $OUT      # on a GPU host (torch and nvidia-ml-py)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.telemetry import NvmlReader, PeriodicSampler
from tools.telemetry.power import PowerLimitRefused, set_power_limits
from tools.telemetry.summary import _power_integral_j, summarize_gpus


def _constraints(nvml, handle) -> dict[str, float]:
    lo, hi = nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    return {
        "min_w": lo / 1000,
        "max_w": hi / 1000,
        "limit_w": nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
        "enforced_w": nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
        "default_w": nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000,
    }


def _load(seconds: float, n: int = 8192) -> tuple[int, float]:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        done += 10
    return done, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    report: dict[str, object] = {}
    import pynvml as nvml

    reader = NvmlReader(nvml, [0])
    handle = reader.handles[0]
    report["gpu"] = reader.names.get(0)
    report["before"] = _constraints(nvml, handle)
    current = float(report["before"]["limit_w"])  # type: ignore[index]
    try:  # the same value: the setting stays as it is
        limits = set_power_limits(["0"], current, pending_path=args.out / "pending.json")
        report["set_same_limit"] = "accepted"
        report["restore_failures"] = limits.restore()
    except PowerLimitRefused as e:
        report["set_same_limit"] = f"refused: {e.message} (hint: {e.hint})"
    report["after"] = _constraints(nvml, handle)
    sampler = PeriodicSampler("gpu", reader.read, 0.2)
    sampler.start()
    for label, seconds in (("idle", 3.0), ("load", args.seconds)):
        sampler.begin()
        sampler.sample()
        done, wall = _load(seconds) if label == "load" else (0, time.sleep(seconds) or seconds)
        sampler.sample()
        frames = sampler.finish()
        (g,) = summarize_gpus(frames)
        integral = _power_integral_j([(f.t_s, f.gpus[0].power_w) for f in frames])
        counter = g.energy_j
        report[label] = {
            "seconds": wall,
            "samples": g.samples,
            "power_w_mean": g.power_w_mean,
            "power_w_max": g.power_w_max,
            "sm_clock_mhz_mean": g.sm_clock_mhz_mean,
            "energy_counter_j": counter,
            "energy_power_integral_j": integral,
            "integral_over_counter": (integral / counter) if integral and counter else None,
            "matmuls": done,
            "tflops": done * 2 * 8192**3 / wall / 1e12 if done else None,
            "j_per_matmul_counter": counter / done if done and counter else None,
            "j_per_matmul_integral": integral / done if done and integral else None,
        }
    sampler.stop()
    reader.close()
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2)
    (args.out / "nvml_power_check.json").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
