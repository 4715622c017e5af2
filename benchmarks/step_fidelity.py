"""The twin's decode step against the one measured on a GPU: `pivot sim step` beside `python -m tools.stepbench`.

For every row of a step-benchmark file (scripts/calibration/h200-step-*.json, recorded on the device's H200: a whole
decode step of a dense model with random weights in a CUDA graph, NVML power sampled while it replayed), the twin's
GPU time, whole step and power for the same model profile, hardware profile, TP, batch and context, and their ratios
to the measured step, side by side in one run:

    .venv/bin/python benchmarks/step_fidelity.py scripts/calibration/h200-step-*.json

The acceptance ([silicon]): GPU time within 10% at batch 1-256 and context 1k and 4k, power within 15% at batch 1,
64 and 256; the `ok` column says which rows hold it. Measured rows that failed (a case that did not fit) are listed
apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.engines.sim.step import step_cost  # noqa: E402
from tools.stepbench import SHAPES  # noqa: E402

PROFILES = {"llama-3.3-70b-fp8": "llama-3.3-70b-fp8"}  # a shipped profile for a stepbench shape; others: generated


def profile_for(name: str, shapes: list[dict], folder: Path) -> str:
    """The shipped profile of a measured shape, else one generated (as a plan's target) from its config."""
    s = next(x for x in shapes if x["name"] == name)
    if name in PROFILES and s == asdict(SHAPES[name]):  # the whole model (not a `--layers` cut of it)
        return PROFILES[name]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": s["layers"],
              "hidden_size": s["hidden"], "intermediate_size": s["intermediate"],
              "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"], "head_dim": s["head_dim"],
              "vocab_size": s["vocab"], "torch_dtype": "bfloat16", "tie_word_embeddings": False}  # fmt: skip
    if s["dtype"] == "fp8":
        config["quantization_config"] = {"quant_method": "fp8"}
    target = folder / f"{name}-{s['layers']}l"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(config))
    return str(target)


def rows_of(path: Path, hardware: str) -> list[dict]:
    import tempfile

    data = json.loads(path.read_text())
    folder = Path(tempfile.mkdtemp(prefix="step-fidelity-"))
    out = []
    for row in data["rows"]:
        if row.get("error") or row.get("step_ms") is None:
            print(f"{path.name}: {row['model']} batch {row['batch']} context {row['context']}: {row.get('error')}")
            continue
        model = profile_for(row["model"], data.get("shapes", []), folder)
        twin = step_cost(model, hardware, tp=row["tp"], batch=row["batch"], context=row["context"])
        gpu, step = twin.gpu_s * 1e3, twin.decode.total_s * 1e3
        measured = row["step_ms"]
        power = row.get("power_w")
        gpu_ok = abs(gpu / measured - 1) <= 0.10
        power_ok = power is None or row["batch"] not in (1, 64, 256) or abs(twin.power_w / power - 1) <= 0.15
        out.append({"model": row["model"], "batch": row["batch"], "context": row["context"], "measured_ms": measured,
                    "twin_gpu_ms": gpu, "twin_step_ms": step, "gpu_ratio": gpu / measured,
                    "step_ratio": step / measured, "measured_w": power, "twin_w": twin.power_w,
                    "sm_mhz": row.get("sm_clock_mhz"), "ok": gpu_ok and power_ok})  # fmt: skip
    return out


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
