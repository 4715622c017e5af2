#!/usr/bin/env python3
"""Check pivot's NVML sampler on a real GPU: an idle level, then a bf16 matmul loop as a level, summarized per level.

The sampler is tools/telemetry's TelemetryRecorder (background thread, 0.2 s). Level "idle" runs before
any CUDA context exists; level "load" runs N x N bf16 matrix products back to back. The tokens of
tokens-per-joule are a pretend count: one per matrix product. The energy from the GPU's counter is set beside
mean power x duration, as a cross-check of the two readings.

    python3 scripts/nvml_check.py --out $OUT            # on a GPU host (needs torch and nvidia-ml-py)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.telemetry import TelemetryRecorder, read_gpus


def _line(label: str, t, seconds: float) -> list[str]:
    out = [f"== {label}: {seconds:.2f} s, source {t.source}" + (f", error: {t.error}" if t.error else "")]
    for g in t.gpus:
        share = g.power_share_of_limit
        mean_x_s = g.power_w_mean * seconds if g.power_w_mean is not None else None
        out.append(
            f"GPU {g.gpu} {g.name}: samples {g.samples}; power mean {g.power_w_mean} W, p95 {g.power_w_p95} W, "
            f"max {g.power_w_max} W; limit {g.power_limit_w} W ({100 * share:.1f}% of limit); "
            f"util gpu {g.util_gpu_pct_mean}% mem {g.util_mem_pct_mean}%; SM {g.sm_clock_mhz_mean} MHz, "
            f"mem {g.mem_clock_mhz_mean} MHz; mem used max {g.mem_used_mib_max} MiB; temp max {g.temperature_c_max} C"
        )
        out.append(
            f"GPU {g.gpu} energy from the counter {g.energy_j} J; mean power x duration {mean_x_s:.1f} J"
            if mean_x_s is not None
            else f"GPU {g.gpu} energy {g.energy_j} J"
        )
    out.append(f"output_tokens {t.output_tokens}, output_tokens_per_j {t.output_tokens_per_j}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--load-s", type=float, default=20.0)
    ap.add_argument("--n", type=int, default=8192, help="matrix size")
    ap.add_argument("--interval-s", type=float, default=0.2)
    ap.add_argument("--out", type=Path, help="directory for nvml_check.json")
    args = ap.parse_args()

    snap = read_gpus()
    print(f"snapshot before: source {snap.source}, error {snap.error}, gpus {[g.name for g in snap.gpus]}")
    if snap.source == "unavailable":
        print("no NVML here: nothing to check")
        return 1
    lines: list[str] = []
    with TelemetryRecorder(interval_s=args.interval_s) as rec:
        rec.mark_level(0)
        t0 = time.perf_counter()
        time.sleep(args.idle_s)
        idle = rec.end_level(output_tokens=0)
        idle_s = time.perf_counter() - t0

        import torch

        a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()

        rec.mark_level(1)
        t0 = time.perf_counter()
        done = 0
        while time.perf_counter() - t0 < args.load_s:
            for _ in range(10):
                a @ b
            torch.cuda.synchronize()
            done += 10
        load_s = time.perf_counter() - t0
        load = rec.end_level(output_tokens=done)

    lines += _line("idle (no CUDA context)", idle, idle_s)
    lines += _line(f"load ({done} bf16 {args.n}^3 matmuls)", load, load_s)
    tflops = done * 2 * args.n**3 / load_s / 1e12
    lines.append(f"matmul rate {tflops:.0f} TFLOP/s; {done / load_s:.1f} matmuls/s")
    if load.energy_j:
        lines.append(
            f"joules per matmul {load.energy_j / done:.3f}; pretend tokens per joule {load.output_tokens_per_j}"
        )
    i0, l0 = idle.gpus[0], load.gpus[0]
    lines.append(
        f"power idle {i0.power_w_mean} W -> load {l0.power_w_mean} W (x{l0.power_w_mean / i0.power_w_mean:.2f})"
    )
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        data = {"idle": json.loads(idle.model_dump_json()), "load": json.loads(load.model_dump_json()),
                "idle_s": idle_s, "load_s": load_s, "matmuls": done, "tflops": tflops, "summary": lines}  # fmt: skip
        (args.out / "nvml_check.json").write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
