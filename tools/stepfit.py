"""The twin's GPU step fitted to whole decode steps measured on a GPU (`pivot calibrate --from-json` given the files
`python -m tools.stepbench` writes): what the GEMM micro-benchmarks cannot show, because it lies between the GEMMs.

    pivot calibrate --hardware h100-sxm --from-json scripts/calibration/h100-step-*.json --out my-h100.toml
    python benchmarks/step_fidelity.py --hardware my-h100.toml scripts/calibration/h100-step-*.json

Three things are fitted, each entering tools/engines/sim/costmodel.py where its docstring says:

- `gemm_stream_by_dtype`: for each weight dtype measured, a factor on the rate the GEMMs stream their weights (an FP8
  W8A8 GEMM through torch._scaled_mm, with its activations quantized per row, reads its weights more slowly than a
  bf16 one; the GEMM micro-benchmarks fit one rate for all);
- `layer_us_per_step`: GPU time per layer and step outside the GEMM and attention roofline (norms, RoPE, the
  activation, the gaps between kernels in a CUDA graph), whatever the batch, and `layer_us_by_dtype`: the extra per
  layer when the linear layers are of another dtype than bf16 (FP8 W8A8: the activations quantized before each
  GEMM, the scaled GEMMs' own overhead);
- `power_activity`: the power per unit of activity, from NVML's readings while the step replayed (the GPU busy all
  the time: the twin's power over its GPU time, not over a step with host gaps).

The time terms are fitted together by least squares of the log errors of the GPU time over every row (Nelder-Mead,
numpy only: tools/calibrate.py), the power alone afterwards. The model is the profile's; only these values move, so a
profile fitted here keeps its GEMM fit and the twin's structure. Rows that failed on the GPU are left out.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from tools.engines.sim.costmodel import CostModel, Parallel
from tools.minimize import nelder_mead
from tools.profiles import HardwareProfile
from tools.stepbench import FORMAT, SHAPES

PROFILES = {"llama-3.3-70b-fp8": "llama-3.3-70b-fp8"}  # a shipped profile for a stepbench shape; others: generated
GPU_TOLERANCE, POWER_TOLERANCE, POWER_BATCHES = 0.10, 0.15, (1, 64, 256)  # [silicon]'s bounds
MAX_STREAM_FACTOR = 2.0  # a dtype's factor on the streaming rate stays within [1/this, this]


def is_step_file(path: Path) -> bool:
    """Whether `path` is a results file of tools.stepbench (format pivot-stepbench/1)."""
    try:
        return json.loads(Path(path).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


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


def load_steps(paths: list[Path]) -> list[dict[str, Any]]:
    """The measured rows of step-benchmark files, each with its model profile (a name or a generated folder) and
    its file's device; rows that failed are left out."""
    from tools.engines.sim.step import resolve_model

    folder = Path(tempfile.mkdtemp(prefix="pivot-stepfit-"))
    rows = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{Path(path).name} is not a tools.stepbench results file")
        for row in data["rows"]:
            if row.get("error") or not row.get("step_ms"):
                continue
            model = resolve_model(profile_for(row["model"], data.get("shapes", []), folder))
            rows.append({**row, "profile": model, "device": data.get("device"), "date": data.get("date"),
                         "file": Path(path).name})  # fmt: skip
    if not rows:
        raise ValueError("no measured step in the files")
    return rows


def twin_row(row: dict[str, Any], hw: HardwareProfile) -> tuple[float, float]:
    """(the twin's GPU time in ms, its power in W with the GPU busy throughout) for a measured row."""
    cost = CostModel(row["profile"], hw, Parallel(tp=row["tp"]))
    d = cost.decode(row["batch"], float(row["batch"] * row["context"]))
    gpu = d.expert_gemm_s + d.dense_gemm_s + d.attention_s + d.communication_s + d.elementwise_s
    return gpu * 1e3, cost.power_w(d.tensor_s / gpu, d.memory_s / gpu)


def with_values(hw: HardwareProfile, values: dict[str, Any]) -> HardwareProfile:
    return hw.model_copy(update={"calibration": hw.calibration.model_copy(update=values)})


def _time_values(x: np.ndarray, dtypes: list[str], base: dict[str, float]) -> dict[str, Any]:
    """The time terms from the fit's vector: a log streaming factor per dtype, the per-layer time (in 100 us), and an
    extra per-layer time (in 100 us) for each dtype other than bf16."""
    lim = math.log(MAX_STREAM_FACTOR)
    factors = {d: base.get(d, 1.0) * math.exp(float(np.clip(x[i], -lim, lim))) for i, d in enumerate(dtypes)}
    extra = [d for d in dtypes if d != "bf16"]
    by_dtype = {d: max(float(x[len(dtypes) + 1 + i]) * 100.0, 0.0) for i, d in enumerate(extra)}
    return {"gemm_stream_by_dtype": factors, "layer_us_per_step": max(float(x[len(dtypes)]) * 100.0, 0.0),
            "layer_us_by_dtype": by_dtype}  # fmt: skip


def fit_steps(rows: list[dict[str, Any]], hw: HardwareProfile) -> dict[str, Any]:
    """The values fitted to the rows (see the module): the streaming factor of each weight dtype measured, the
    per-layer time (and its extra for each dtype but bf16), and the power activity."""
    dtypes = sorted({r["dtype"] for r in rows})
    cal = hw.calibration
    base = dict(cal.gemm_stream_by_dtype)

    def loss(x: np.ndarray) -> float:
        fitted = with_values(hw, _time_values(x, dtypes, base))
        return sum(math.log(twin_row(r, fitted)[0] / r["step_ms"]) ** 2 for r in rows) / len(rows)

    extra = [cal.layer_us_by_dtype.get(d, 0.0) / 100.0 for d in dtypes if d != "bf16"]
    x0 = np.array([0.0] * len(dtypes) + [cal.layer_us_per_step / 100.0] + extra)
    x = nelder_mead(loss, x0, np.array([0.2] * len(dtypes) + [0.3] * (1 + len(extra))), iters=400, tol=1e-8)
    values = _time_values(x, dtypes, base)
    timed = with_values(hw, values)
    powered = [r for r in rows if r.get("power_w")]
    if powered:

        def power_loss(y: np.ndarray) -> float:
            fitted = with_values(timed, {"power_activity": min(max(math.exp(float(y[0])), 1e-3), 1.0)})
            return sum(math.log(twin_row(r, fitted)[1] / r["power_w"]) ** 2 for r in powered) / len(powered)

        y = nelder_mead(power_loss, np.array([math.log(cal.power_activity)]), np.array([0.3]), iters=80)
        values["power_activity"] = min(max(math.exp(float(y[0])), 1e-3), 1.0)
    return values


def residuals(rows: list[dict[str, Any]], hw: HardwareProfile) -> dict[str, Any]:
    """Each row's twin/measured ratios with `hw`, and how many hold [silicon]'s bounds."""
    out = []
    for r in rows:
        gpu, power = twin_row(r, hw)
        out.append({"model": r["model"], "batch": r["batch"], "context": r["context"], "measured_ms": r["step_ms"],
                    "twin_gpu_ms": round(gpu, 4), "gpu_ratio": round(gpu / r["step_ms"], 4),
                    "measured_w": r.get("power_w"), "twin_w": round(power, 1),
                    "power_ratio": round(power / r["power_w"], 4) if r.get("power_w") else None})  # fmt: skip
    in_power = [x for x in out if x["power_ratio"] is not None and x["batch"] in POWER_BATCHES]
    return {
        "rows": out,
        "steps": len(out),
        "gpu_within_10pct": sum(abs(x["gpu_ratio"] - 1) <= GPU_TOLERANCE for x in out),
        "power_rows": len(in_power),
        "power_within_15pct": sum(abs(x["power_ratio"] - 1) <= POWER_TOLERANCE for x in in_power),
        "median_abs_gpu_error": sorted(abs(x["gpu_ratio"] - 1) for x in out)[len(out) // 2],
    }
