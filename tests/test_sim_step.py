"""`pivot sim step`: the twin's cost of one engine step, broken down (tools/engines/sim/step.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import cli
from tools.engines.sim.step import step_cost
from tools.profiles import load_hardware


def test_the_step_json_has_its_parts_and_they_add_up():
    result = CliRunner().invoke(cli, ["sim", "step", "--model-profile", "llama-3.3-70b-fp8", "--hardware", "h200",
                                      "--batch", "64", "--context", "1024", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["source"] == "simulated" and {"gpu_ms", "step_ms", "power_w", "host_ms"} <= set(data)
    parts = data["breakdown_ms"]
    assert data["gpu_ms"] == pytest.approx(
        parts["dense_gemm"] + parts["expert_gemm"] + parts["attention"] + parts["communication"], rel=1e-3
    )
    assert data["step_ms"] >= max(data["gpu_ms"], data["host_ms"]) - 1e-6  # the overlap scheduler: the longer one
    hw = load_hardware("h200")
    assert hw.idle_w < data["power_w"] <= hw.tdp_w and data["clock_share"] == 1.0
    assert parts["elementwise"] is None and any("elementwise" in n for n in data["notes"])  # said, not invented


def test_more_rows_and_more_context_cost_more_and_tp_splits_the_weights():
    small = step_cost("llama-3.3-70b-fp8", "h200", batch=1, context=1024)
    wide = step_cost("llama-3.3-70b-fp8", "h200", batch=256, context=1024)
    deep = step_cost("llama-3.3-70b-fp8", "h200", batch=1, context=65536)
    assert wide.gpu_s > small.gpu_s and deep.decode.attention_s > small.decode.attention_s
    split = step_cost("llama-3.3-70b-fp8", "h200", tp=2, batch=1, context=1024)
    assert split.decode.dense_gemm_s < small.decode.dense_gemm_s * 0.6 and split.decode.communication_s > 0
    with_prefill = step_cost("llama-3.3-70b-fp8", "h200", batch=8, context=1024, prefill_tokens=2048).as_json()
    assert with_prefill["prefill"]["tokens"] == 2048 and with_prefill["prefill"]["step_ms"] > 0


def test_a_model_folder_with_a_config_json_is_a_model_profile(tmp_path):
    from tests.test_generated_profiles import LLAMA, write_model

    folder = write_model(tmp_path / "tiny", LLAMA)
    result = CliRunner().invoke(cli, ["sim", "step", "--model-profile", str(folder), "--hardware", "h200",
                                      "--batch", "4", "--context", "128"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "decode step of 4 requests x 128 tokens (simulated)" in result.stdout
    bad = CliRunner().invoke(cli, ["sim", "step", "--model-profile", str(tmp_path), "--hardware", "h200",
                                   "--batch", "4", "--context", "128"])  # fmt: skip
    assert bad.exit_code == 1 and "has no config.json" in bad.stderr
    as_file = CliRunner().invoke(cli, ["sim", "step", "--model-profile", str(folder / "config.json"), "--hardware",
                                       "h200", "--batch", "4", "--context", "128", "--json"])  # fmt: skip
    assert as_file.exit_code == 0, as_file.output
    by_folder = CliRunner().invoke(cli, ["sim", "step", "--model-profile", str(folder), "--hardware", "h200",
                                         "--batch", "4", "--context", "128", "--json"])  # fmt: skip
    assert json.loads(as_file.stdout)["gpu_ms"] == json.loads(by_folder.stdout)["gpu_ms"]


def test_the_step_benchmark_reads_a_config_and_says_so_without_a_gpu(tmp_path):
    """tools/stepbench.py runs on a GPU host with PyTorch only; here, its shapes and its refusal without CUDA."""
    import importlib.util

    from tests.test_generated_profiles import LLAMA
    from tools.stepbench import SHAPES, Shape, main

    shape = Shape.from_config("tiny", LLAMA)
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim) == (3, 384, 6, 2, 64)
    assert SHAPES["llama-3.3-70b-fp8"].dtype == "fp8" and SHAPES["llama-3.1-8b"].intermediate == 14336
    if importlib.util.find_spec("torch") is None:
        with pytest.raises(ModuleNotFoundError):
            main(["--model", "llama-3.1-8b", "--out", str(tmp_path / "x.json")])


def test_the_twin_against_the_steps_measured_on_an_h100():
    """benchmarks/step_fidelity.py on the recorded H100 fixtures (scripts/calibration/h100-step-*.json, the device's
    H100, 2026-12-05: four models, and the 70B FP8 whole, 80 layers, measured later on another H100 and held out of the
    shipped fit) with the shipped h100-sxm profile, whose step terms were fitted to the first four: every measured
    row is compared, and the twin's GPU time is within 10% of the measured step on all but the 70B FP8 at batch
    256 and 1k context, where the card at its power cap runs its SM clock at 1,645-1,823 MHz: the twin slows the clock
    only under a user's power limit."""
    import sys

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "benchmarks"))
    from step_fidelity import rows_of

    rows = [
        r for f in sorted((root / "scripts" / "calibration").glob("h100-step-*.json")) for r in rows_of(f, "h100-sxm")
    ]
    assert len(rows) == 60
    off = [(r["model"], r["batch"], r["context"]) for r in rows if abs(r["gpu_ratio"] - 1) > 0.10]
    assert off == [("llama-3.3-70b-fp8", 256, 1024)] * 2, off


def test_calibrate_fits_the_step_terms_to_measured_steps(tmp_path):
    """`pivot calibrate --from-json` given the step benchmark's files, from a profile without the step terms (the
    H100's as it was before its fit): the per-dtype streaming, the per-layer time and the power are fitted, written
    with their provenance, and the profile it writes reproduces the measured steps (GPU time within 10% on at least
    58 of 60 rows, against under 30 before; power within 15% on at least 20 of the 30 rows at batch 1, 64 and 256,
    against 1). FP8 streams as bf16 does and pays its own time per layer (quantizing, the scaled GEMMs' overhead)."""
    import re

    from tools import stepfit
    from tools.profiles import load_hardware

    root = Path(__file__).resolve().parent.parent
    shipped = (root / "tools" / "profiles" / "hardware" / "h100-sxm.toml").read_text()
    stripped = re.sub(r"(?m)^(gemm_stream_by_dtype|layer_us_per_step|layer_us_by_dtype) = .*\n", "", shipped)
    stripped = re.sub(r"(?m)^power_activity = .*$", "power_activity = 0.4", stripped)
    start = tmp_path / "unfitted.toml"
    start.write_text(stripped.replace('name = "h100-sxm"', 'name = "unfitted"'))
    files = [str(p) for p in sorted((root / "scripts" / "calibration").glob("h100-step-*.json"))]
    out = tmp_path / "fitted.toml"
    result = CliRunner().invoke(cli, ["calibrate", "--hardware", str(start), "--from-json", *files, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "fitted on 60 decode steps" in result.stdout
    fitted = load_hardware(str(out))
    cal = fitted.calibration
    assert abs(cal.gemm_stream_by_dtype["fp8"] / cal.gemm_stream_by_dtype["bf16"] - 1) < 0.1
    assert cal.layer_us_per_step > 0 and cal.layer_us_by_dtype["fp8"] > cal.layer_us_per_step
    assert cal.provenance["layer_us_by_dtype"].startswith("fitted: h100-step-")
    rows = stepfit.load_steps([Path(f) for f in files])
    before, after = stepfit.residuals(rows, load_hardware(str(start))), stepfit.residuals(rows, fitted)
    assert after["gpu_within_10pct"] >= 58 and before["gpu_within_10pct"] < 30
    assert after["power_within_15pct"] >= 20 > before["power_within_15pct"]


def test_host_work_is_the_engines_and_sets_no_floor_from_another_gpu(tmp_path):
    """The H100 and H200 profiles give no host overhead of their own (it was the RTX PRO 6000 fit's 8 ms, which set
    every small-batch step): the engine's estimate stands in, its provenance says so (`plan check`), and the 8B's
    whole step at batch 1 is its GPU time. A profile that gives host work (fitted on a serving table) keeps it."""
    from tools.profiles import ENGINE_HOST_MS_PER_STEP, ENGINE_HOST_SOURCE

    root = Path(__file__).resolve().parent.parent
    model = tmp_path / "llama-8b"
    model.mkdir()
    (model / "config.json").write_text((root / "scripts" / "calibration" / "configs" / "llama-3.1-8b.json").read_text())
    for name in ("h200", "h100-sxm"):
        cal = load_hardware(name).calibration
        assert cal.host_ms_per_step == ENGINE_HOST_MS_PER_STEP
        assert cal.provenance["host_ms_per_step"] == cal.provenance["host_us_per_request"] == ENGINE_HOST_SOURCE
        assert "the engine's, not this GPU's: host_ms_per_step, host_us_per_request" in cal.provenance_note()
        step = step_cost(str(model), name, batch=1, context=1024).as_json()
        assert step["step_ms"] == pytest.approx(step["gpu_ms"]) and step["breakdown_ms"]["host_wait"] == 0
    rtx = load_hardware("rtx-pro-6000-blackwell").calibration
    assert rtx.host_ms_per_step != ENGINE_HOST_MS_PER_STEP and rtx.provenance["host_ms_per_step"].startswith("fitted")
