"""Fit the twin's calibration scalars for one hardware profile to a measured table, and check the fit.

    python scripts/calibrate_twin.py                       # fit to the seeds' table, print the scalars
    python scripts/calibrate_twin.py --write               # ... and write them into the hardware profile
    python scripts/calibrate_twin.py --check               # only print the twin's table beside the measured one

The measured table is data (scripts/calibration/*.toml). The fit minimizes the squared log errors of
output tok/s and TPOT at every level plus, with half the weight, the peak output tok/s at the highest
level (and the worst of these errors again, so no level is traded away), over the scalars that describe the host and the kernels (host time per step and per request,
the GEMM efficiency curve's row knee and ceiling, achieved memory bandwidth, collective efficiency,
per-token prefill work). The width knee (gemm_n_half) is not identifiable from a table measured at one
expert width, so it stays at its profile value. Power is then solved in closed form from the measured watts. Nothing
else is fitted: the other lessons (KV limit, TP4+PP2, EP8) must follow from the same scalars.
"""

from __future__ import annotations

import argparse
import math
import sys
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent import models as m  # noqa: E402
from agent.plans import load_plan  # noqa: E402
from tools.calibrate import nelder_mead, write  # noqa: E402
from tools.engines.sim.twin import Twin  # noqa: E402
from tools.profiles import load_hardware  # noqa: E402

FITTED = (
    "host_ms_per_step",
    "host_us_per_request",
    "gemm_m_half",
    "allreduce_efficiency",
    "prefill_us_per_token",
    "gemm_efficiency_max",
    "bandwidth_efficiency",
)
BOUNDS = {
    "host_ms_per_step": (1.0, 200.0),
    "host_us_per_request": (0.0, 200.0),
    "gemm_m_half": (1.0, 2000.0),
    "allreduce_efficiency": (0.05, 1.0),
    "prefill_us_per_token": (0.0, 2000.0),
    "gemm_efficiency_max": (0.05, 0.95),
    "bandwidth_efficiency": (0.3, 0.95),
}


def load_table(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def twin_for(table: dict, calibration: dict[str, float]) -> tuple[Twin, m.BenchSpec]:
    """The twin of the table's setup with these calibration scalars (the profile file is left alone)."""
    hw = load_hardware(table["hardware"])
    fitted = hw.model_copy(update={"calibration": hw.calibration.model_copy(update=calibration)})
    twin = Twin.build(table["model_profile"], fitted, table["gpus"], m.ServerConfig.parse(table["flags"]))
    levels = [lv["concurrency"] for lv in table["levels"]]
    return twin, load_plan(table["plan"]).workload.model_copy(update={"concurrency": levels})


def run(table: dict, calibration: dict[str, float]) -> list[tuple[m.BenchLevel, object]]:
    twin, spec = twin_for(table, calibration)
    return twin.predict(spec)


def loss(table: dict, calibration: dict[str, float]) -> float:
    result = run(table, calibration)
    errors = []
    for (level, _), want in zip(result, table["levels"], strict=True):
        if level.completed == 0:
            return 1e9
        errors.append(math.log(level.output_throughput / want["output_tok_s"]))
        errors.append(math.log(level.mean_tpot_ms / want["tpot_ms"]))
    top, want = result[-1][0], table["levels"][-1]
    errors.append(math.sqrt(0.5) * math.log(max(top.max_output_tokens_per_s, 1) / want["peak_output_tok_s"]))
    # the sum of squares, plus the worst error again, so that no single level is traded away
    return sum(e * e for e in errors) + 4 * max(e * e for e in errors)


def fit(table: dict) -> dict[str, float]:
    hw = load_hardware(table["hardware"])
    start = {k: getattr(hw.calibration, k) for k in FITTED}

    def unpack(x: np.ndarray) -> dict[str, float]:  # fit in log space, inside the bounds
        out = {}
        for key, value in zip(FITTED, x, strict=True):
            lo, hi = BOUNDS[key]
            out[key] = float(min(max(math.exp(value), lo), hi))
        return out

    x0 = np.array([math.log(max(start[k], 1e-3)) for k in FITTED])
    best = unpack(nelder_mead(lambda x: loss(table, unpack(x)), x0, np.full(len(x0), 0.3)))
    result = run(table, best)
    _, sim = result[-1]
    # power: activity = power_activity x (power_compute_weight x tensor use + memory use), fitted at the table's level
    use = hw.calibration.power_compute_weight * sim.tensor_s / sim.wall_s + sim.memory_s / sim.wall_s
    target = table["power_w_per_gpu_at"]["watts"]
    best["power_activity"] = min(max((target - hw.idle_w) / ((hw.tdp_w - hw.idle_w) * use), 0.01), 1.0)
    return best


def report(table: dict, calibration: dict[str, float]) -> None:
    result = run(table, calibration)
    print(f"{'conc':>6} {'out tok/s':>18} {'total tok/s':>18} {'peak out':>18} {'TPOT ms':>16} {'W/GPU':>7}")
    for (level, _), want in zip(result, table["levels"], strict=True):
        print(
            f"{want['concurrency']:>6} {level.output_throughput:>8.0f} ({want['output_tok_s']:>6})"
            f" {level.total_throughput:>8.0f} ({want['total_tok_s']:>6})"
            f" {level.max_output_tokens_per_s:>8.0f} ({want['peak_output_tok_s']:>6})"
            f" {level.mean_tpot_ms:>7.0f} ({want['tpot_ms']:>5}) {level.mean_gpu_power_w:>7.0f}"
        )
    print("(twin, with the seeds' measurement in brackets)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", type=Path, default=ROOT / "scripts/calibration/seeds-glm5-nvfp4-rtxpro6000x8.toml")
    ap.add_argument("--write", action="store_true", help="write the fitted scalars into the hardware profile")
    ap.add_argument("--check", action="store_true", help="only compare the current profile with the table")
    args = ap.parse_args()
    table = load_table(args.table)
    hw = load_hardware(table["hardware"])
    if args.check:
        report(table, {})
        return
    best = fit(table)
    print("fitted:", ", ".join(f"{k} = {v:.4g}" for k, v in best.items()))
    report(table, best)
    if args.write:
        print("wrote", write(hw.name, best))


if __name__ == "__main__":
    main()
