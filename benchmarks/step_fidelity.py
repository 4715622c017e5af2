"""The twin's decode step against the one measured on a GPU: `pivot sim step` beside `python -m tools.stepbench`.

For every row of a step-benchmark file (scripts/calibration/h100-step-*.json, recorded on the device's H100; an
H200's as h200-step-*.json once one is lent: a whole decode step of a dense model with random weights in a CUDA
graph, NVML power sampled while it replayed), the twin's
GPU time, whole step and power for the same model profile, hardware profile, TP, batch and context, and their ratios
to the measured step, side by side in one run:

    .venv/bin/python benchmarks/step_fidelity.py --hardware h100-sxm scripts/calibration/h100-step-*.json

The acceptance ([silicon]): GPU time within 10% at batch 1-256 and context 1k and 4k, power within 15% at batch 1,
64 and 256; the `ok` column says which rows hold it. Measured rows that failed (a case that did not fit) are listed
apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.errors import PivotError  # noqa: E402
from tools.engines.sim.step import step_cost  # noqa: E402
from tools.profiles import load_hardware  # noqa: E402
from tools.stepfit import GPU_TOLERANCE, POWER_BATCHES, POWER_TOLERANCE, load_steps, twin_row  # noqa: E402


def rows_of(path: Path, hardware: str) -> list[dict]:
    """Each measured row of one file beside the twin's GPU time, whole step (`pivot sim step`'s) and power (with the
    GPU busy throughout, as the step benchmark replays it); rows that failed on the GPU are listed and left out."""
    data = json.loads(path.read_text())
    for row in data["rows"]:
        if row.get("error") or row.get("step_ms") is None:
            print(f"{path.name}: {row['model']} batch {row['batch']} context {row['context']}: {row.get('error')}")
    hw = load_hardware(hardware)
    out = []
    for row in load_steps([path]):
        gpu, power = twin_row(row, hw)
        step = _whole_step(row, hw)
        measured, measured_w = row["step_ms"], row.get("power_w")
        gpu_ok = abs(gpu / measured - 1) <= GPU_TOLERANCE
        power_ok = (measured_w is None or row["batch"] not in POWER_BATCHES
                    or abs(power / measured_w - 1) <= POWER_TOLERANCE)  # fmt: skip
        out.append({"model": row["model"], "batch": row["batch"], "context": row["context"], "measured_ms": measured,
                    "twin_gpu_ms": gpu, "twin_step_ms": step.decode.total_s * 1e3, "gpu_ratio": gpu / measured,
                    "step_ratio": step.decode.total_s * 1e3 / measured, "measured_w": measured_w, "twin_w": power,
                    "sm_mhz": row.get("sm_clock_mhz"), "ok": gpu_ok and power_ok})  # fmt: skip
    return out


def _whole_step(row: dict, hw) -> object:
    """`pivot sim step`'s whole step for one measured row. The step benchmark shares one KV cache among its layers, so
    a model that fills the card (Llama 3.3 70B FP8 on an 80 GB H100) ran there although an engine at its default
    --mem-fraction-static would not start: the twin is then asked at 0.95."""
    try:
        return step_cost(row["profile"], hw, tp=row["tp"], batch=row["batch"], context=row["context"])
    except PivotError:
        flags = ("--mem-fraction-static", "0.95")
        return step_cost(row["profile"], hw, tp=row["tp"], batch=row["batch"], context=row["context"], flags=flags)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--hardware", default="h200")
    args = ap.parse_args(argv)
    rows = [r for f in args.files for r in rows_of(f, args.hardware)]
    print("| model | batch | context | measured ms | twin GPU ms | ratio | twin step ms | ratio | measured W | twin W | "
          "SM MHz | ok |")  # fmt: skip
    print("|" + " --- |" * 12)
    for r in rows:
        w = f"{r['measured_w']:.0f}" if r["measured_w"] is not None else "-"
        mhz = f"{r['sm_mhz']:.0f}" if r["sm_mhz"] is not None else "-"
        print(f"| {r['model']} | {r['batch']} | {r['context']} | {r['measured_ms']:.2f} | {r['twin_gpu_ms']:.2f} | "
              f"{r['gpu_ratio']:.2f} | {r['twin_step_ms']:.2f} | {r['step_ratio']:.2f} | {w} | {r['twin_w']:.0f} | "
              f"{mhz} | {'yes' if r['ok'] else 'NO'} |")  # fmt: skip
    held = sum(r["ok"] for r in rows)
    print(f"\n{held} of {len(rows)} rows within the bounds (GPU time 10%, power 15% at batch 1, 64, 256)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
