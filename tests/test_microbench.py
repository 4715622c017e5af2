"""GEMM micro-benchmarks: the shapes, the TFLOPS and roofline arithmetic, the ledger import that feeds the analysis,
`pivot microbench` without a GPU, the toolset, the H200 fit of the twin, and (on a CUDA host only) the measuring itself.

The H200 measurements are data (scripts/calibration/h200-gemm-*.json, two runs of scripts/h200_device_run.sh);
everything here but the `gpu`-marked tests runs on a CPU-only machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from agent import models as m
from agent import plugins
from agent.cli import cli
from agent.plans import load_plan
from agent.session import Session
from tests.twin_ledger import llama_campaign
from tools import gemm
from tools import microbench as mb
from tools.analysis import analyze
from tools.analysis.roofline import Roofline
from tools.profiles import load_hardware, load_model
from tools.reports import SessionRef

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION = ROOT / "scripts" / "calibration"
GLM5_RUN = CALIBRATION / "h200-gemm-glm5-run1.json"
LLAMA_RUN = CALIBRATION / "h200-gemm-llama-run1.json"
HAS_GPU, GPU_WHY = gemm.gpu_status()
gpu = pytest.mark.skipif(not HAS_GPU, reason=f"no CUDA GPU: {GPU_WHY}")


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _fit_script():
    import tools.calibrate  # the fit scripts/fit_h200_gemm.py runs (and `pivot calibrate --from-json`)

    return tools.calibrate


# ---------------------------------------------------------------------------------------------- shapes and math


def test_glm5_expert_cases_are_the_tp_sharded_gate_up_and_down_projections_of_the_hit_experts():
    model = gemm.read_profile("models", "glm-5-nvfp4")
    cases = gemm.cases_for(model, [1, 8], [1, 64, 4096], ["bf16", "fp8"])
    assert len(cases) == 2 * 2 * 3 and {c.kind for c in cases} == {"experts"}
    tp8 = next(c for c in cases if c.tp == 8 and c.rows == 1 and c.dtype == "fp8")
    gate_up, down = tp8.gemms
    assert (tp8.n, tp8.k) == (256, 6144)  # 2048 / 8 wide on each GPU, hidden 6144
    assert (gate_up.m, gate_up.n, gate_up.k) == (1, 512, 6144) and (down.m, down.n, down.k) == (1, 6144, 256)
    assert tp8.groups == gate_up.groups == down.groups == 8  # one token hits its 8 experts, one row each
    full = next(c for c in cases if c.tp == 1 and c.rows == 64 and c.dtype == "bf16")
    assert full.n == 2048 and full.experts_hit == pytest.approx(256, abs=0.01)
    assert full.weight_bytes <= gemm.WEIGHT_CAP_BYTES  # capped: the same shape, fewer experts per call
    big = next(c for c in cases if c.tp == 1 and c.rows == 4096 and c.dtype == "bf16")
    assert big.flops <= gemm.FLOP_CAP and big.groups >= 1


def test_rows_per_expert_map_to_the_experts_a_batch_hits():
    assert gemm.experts_for_rows(256, 8, 1) == 8
    hits = [gemm.experts_for_rows(256, 8, r) for r in (2, 4, 8, 16, 64)]
    assert hits == sorted(hits) and hits[0] > 8 and hits[-1] == pytest.approx(256, abs=0.01)
    for rows, hit in zip((2, 4, 8, 16, 64), hits, strict=True):  # batch x k / E_hit(batch) = rows, by construction
        batch = rows * hit / 8
        assert gemm.experts_hit(256, 8, batch) == pytest.approx(hit, rel=1e-6)


def test_dense_cases_split_column_and_row_parallel_layers_over_tp():
    model = load_model("llama-3.3-70b-fp8")
    names = [g.name for g in model.dense_gemms]
    assert names == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    per_layer = sum(g.n * g.k for g in model.dense_gemms) * model.layers
    assert per_layer == pytest.approx(sum(p.params for p in model.parts if p.name in ("attention", "mlp")), rel=1e-3)
    cases = mb.plan_cases(model, [2], [64], ["fp8"])
    shapes = {c.name: (c.n, c.k, c.groups) for c in cases}
    assert shapes == {
        "qkv_proj": (5120, 8192, 1),
        "o_proj": (8192, 4096, 1),
        "gate_up_proj": (28672, 8192, 1),
        "down_proj": (8192, 14336, 1),
    }


def test_bad_inputs_fail_before_anything_runs():
    with pytest.raises(Exception, match="unknown dtype"):
        mb.plan_cases(load_model("glm-5-nvfp4"), [1], [1], ["int4"])
    with pytest.raises(Exception, match="does not split"):
        mb.plan_cases(load_model("glm-5-nvfp4"), [3], [1], ["bf16"])


def test_flops_bytes_and_the_roofline():
    g = gemm.Gemm(m=64, n=512, k=6144, groups=10)
    assert g.flops == 2 * 64 * 512 * 6144 * 10
    assert g.bytes("fp8") == 10 * (512 * 6144 * 1 + 64 * 6144 * 1 + 64 * 512 * 2)
    assert g.bytes("bf16") == 10 * (512 * 6144 * 2 + 64 * 6144 * 2 + 64 * 512 * 2)
    h200 = gemm.read_profile("hardware", "h200")
    assert gemm.peak_tflops(h200, "fp8") == 1979 and gemm.peak_tflops(h200, "bf16") == 989
    assert gemm.peak_tflops(h200, "nvfp4") == 1979  # no FP4 units on Hopper: the FP8 rate
    # memory-bound: AI x bandwidth; compute-bound: the peak
    assert gemm.roofline_tflops(100.0, 1979, 4800) == pytest.approx(480.0)
    assert gemm.roofline_tflops(1000.0, 1979, 4800) == 1979
    fig = gemm.figures(flops=2e12, nbytes=1e10, seconds=0.01, peak=1979, bandwidth_gbs=4800)
    assert fig["tflops"] == pytest.approx(200.0)
    assert fig["roofline_tflops"] == pytest.approx(960.0)  # AI 200 x 4.8 TB/s
    assert fig["share_of_peak"] == pytest.approx(200 / 1979)
    assert fig["share_of_roofline"] == pytest.approx(200 / 960)
    assert fig["achieved_gbs"] == pytest.approx(1000.0)


def test_a_gpu_is_named_by_the_hardware_profile_whose_title_holds_it():
    assert mb.hardware_for_gpu("NVIDIA H200") == "h200"
    assert mb.hardware_for_gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition") == "rtx-pro-6000-blackwell"
    assert mb.hardware_for_gpu("NVIDIA A100-SXM4-80GB") is None


# ---------------------------------------------------------------------------------------------- the ledger and the analysis


def test_a_results_file_becomes_ledger_rows_with_shares_against_the_profile(store):
    run_, stored, errors = mb.import_run(store, GLM5_RUN)
    data = json.loads(GLM5_RUN.read_text())
    timed = [c for c in data["cases"] if c.get("seconds")]
    assert len(stored) == len(timed) and len(errors) == len(data["cases"]) - len(timed)
    assert all("CUBLAS_STATUS_NOT_SUPPORTED" in e for e in errors)  # per-expert _scaled_mm with 1 or 2 rows
    assert [r.id for r in store.microbench_results(device="h200")] == [r.id for r in stored]
    row = next(r for r in stored if r.dtype == "fp8" and r.m == 64 and r.n == 256 and "grouped" in (r.backend or ""))
    case = next(
        c
        for c in timed
        if c["dtype"] == "fp8" and c["rows"] == 64 and c["tp"] == 8 and c["backend"] == "scaled_grouped_mm"
    )
    assert row.rows_per_expert == 64 and row.k == 6144 and row.groups == case["groups"]
    assert row.tflops == pytest.approx(case["flops"] / case["seconds"] / 1e12)
    assert row.share_of_peak == pytest.approx(row.tflops / 1979)
    assert row.share_of_roofline == pytest.approx(case["share_of_roofline"])
    assert row.measured_at.isoformat().startswith(run_["measured_at"][:10])
    assert "glm-5-nvfp4 experts tp8" in row.backend


def test_malformed_results_files_are_refused_with_a_hint(tmp_path, store):
    bad = tmp_path / "x.json"
    bad.write_text('{"format": "something else", "cases": []}')
    with pytest.raises(Exception, match="not a pivot micro-benchmark file"):
        mb.import_run(store, bad)
    bad.write_text("not json")
    with pytest.raises(Exception, match="cannot read"):
        mb.import_run(store, bad)


def test_imported_h200_rows_feed_the_dense_models_analysis(store, paths):
    ref = SessionRef(store, paths, llama_campaign(store, paths, items=[]))
    before = analyze(ref)
    assert all(lv.achieved_source.startswith("hardware profile") for lv in before.levels)
    mb.import_run(store, LLAMA_RUN)
    after = analyze(ref)
    top = after.levels[-1]
    assert top.achieved_source.startswith("micro-benchmarks of the model's own GEMM shapes (qkv/o/gate_up/down at TP1")
    # each FP8 layer runs at the rate measured for its own (n, k) at the level's rows (the BF16 lm_head at its
    # own): the TFLOPS the root cause prints are that estimate's FLOPs over its time, within the rates measured
    rows = [r for r in store.microbench_results(device="h200", dtype="fp8") if 0.5 <= r.m / top.gemm_m <= 2]
    assert rows and min(r.tflops for r in rows) * 0.8 <= top.achieved_tflops <= max(r.tflops for r in rows)


def test_fp8_rows_stand_in_for_nvfp4_experts_on_a_gpu_without_fp4_units(store):
    from tools.analysis import Roofline

    mb.import_run(store, GLM5_RUN)
    bench = store.microbench_results(device="h200")
    roof = Roofline(load_model("glm-5-nvfp4"), load_hardware("h200"), tp=8, pp=1, ep=1, kv_dtype=None, microbench=bench)
    tflops, source = roof.achieved_tflops("nvfp4", 64, 256)
    assert "fp8 standing in for nvfp4" in source and "glm-5-nvfp4 experts tp8" in source
    best = max(r.tflops for r in bench if r.dtype == "fp8" and r.m == 64 and r.n == 256)
    assert tflops == pytest.approx(best)  # the faster path on a tie (grouped, not per-expert launches)
    wide, wide_source = roof.achieved_tflops("nvfp4", 64, 2048)
    assert "tp1" in wide_source and wide > tflops  # the width decides between TP1 and TP8 rows


# ---------------------------------------------------------------------------------------------- the CLI


@pytest.mark.skipif(HAS_GPU, reason="needs a host without a CUDA GPU")
def test_microbench_without_a_gpu_says_so_and_points_at_the_fit_and_from_json():
    result = run("microbench", "--model-profile", "glm-5-nvfp4", "--tp", "1,8")
    assert result.exit_code == 1
    assert "no GPU here" in result.stderr and "nothing was measured" in result.stderr
    assert "--from-json" in result.stderr and "GEMM-efficiency fit" in result.stderr
    assert "Traceback" not in result.output


def test_microbench_shapes_need_no_gpu():
    result = run("microbench", "--model-profile", "glm-5-nvfp4", "--tp", "8", "--rows", "1,64", "--shapes", "--json")
    assert result.exit_code == 0, result.output
    shapes = json.loads(result.stdout)
    assert [(s["tp"], s["dtype"], s["rows"], s["n"]) for s in shapes] == [
        (8, "bf16", 1, 256), (8, "bf16", 64, 256), (8, "fp8", 1, 256), (8, "fp8", 64, 256),
    ]  # fmt: skip


def test_microbench_from_json_records_rows_for_a_session(store, paths):
    plan = load_plan("llama70b-fp8-h200x1")
    with Session.create(store, paths, plan, name="mb") as s:
        sid = s.id
    result = run("microbench", "--from-json", str(LLAMA_RUN), "--session", "mb", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 104 and {r["session_id"] for r in rows} == {sid}
    assert {r["device"] for r in rows} == {"h200"} and {r["dtype"] for r in rows} == {"bf16", "fp8"}
    assert len(store.microbench_results(device="h200")) == 104
    again = run("microbench", "--from-json", str(LLAMA_RUN), "--no-record")
    assert again.exit_code == 0 and "parsed (not recorded)" in again.stdout
    assert len(store.microbench_results(device="h200")) == 104


def test_the_standalone_entry_needs_only_the_standard_library_without_a_gpu(tmp_path):
    code = (
        "import sys; sys.modules['pydantic'] = None; sys.modules['torch'] = None; "
        "from tools.gemm import main; sys.exit(main(sys.argv[1:]))"
    )
    out = tmp_path / "x.json"
    proc = subprocess.run(
        [sys.executable, "-c", code, "--model-profile", "glm-5-nvfp4", "--json-out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "no GPU: PyTorch is not installed" in proc.stderr and not out.exists()


# ---------------------------------------------------------------------------------------------- the toolset


def test_the_toolset_is_a_registered_plugin_with_one_tool():
    toolset = plugins.load(plugins.TOOLS_GROUP, "microbench")
    assert toolset is mb.toolset and list(toolset.tools) == ["microbench"]
    assert "rows per expert" in toolset.tools["microbench"].description


@pytest.mark.skipif(HAS_GPU, reason="needs a host without a CUDA GPU")
def test_the_tool_without_a_gpu_reports_why_and_what_the_analysis_uses(store, paths):
    plan = load_plan("glm5-nvfp4-rtxpro6000x8")
    events: list[m.Event] = []
    with Session.create(store, paths, plan, name="t", events=events.append) as session:
        report = mb.microbench(SimpleNamespace(deps=session), rows=[1, 64], dtypes=["fp8"])
    assert not report.available and "PyTorch" in report.reason
    assert report.model_profile == "glm-5-nvfp4" and report.tp == [1, 8] and report.hardware == "rtx-pro-6000-blackwell"
    assert "GEMM-efficiency fit" in report.analysis_uses and not report.results
    assert any(e.kind == "warning" and "not run" in e.message for e in events)
    assert store.microbench_results() == []


def test_the_tool_asks_the_model_to_retry_on_bad_arguments(store, paths):
    from pydantic_ai import ModelRetry

    with Session.create(store, paths, load_plan("glm5-nvfp4-rtxpro6000x8"), name="t") as session:
        with pytest.raises(ModelRetry, match="bf16 and/or fp8"):
            mb.microbench(SimpleNamespace(deps=session), dtypes=["fp4"])
        with pytest.raises(ModelRetry, match="rows"):
            mb.microbench(SimpleNamespace(deps=session), rows=[0])


# ---------------------------------------------------------------------------------------------- the H200 fit


def test_the_h200_profile_holds_the_fit_of_glm5s_measured_expert_gemms():
    fit = _fit_script()
    cases = fit.load_cases()
    hw = load_hardware("h200")
    assert fit.fit(cases, hw) == {k: getattr(hw.calibration, k) for k in fit.FITTED}
    rows = fit.fit_rows(cases, hw)
    assert len(rows) == 26  # both widths, 13 row counts, fp8
    errors = sorted(abs(t / m - 1) for _, m, t in rows)
    assert errors[len(errors) // 2] < 0.05  # the median GLM-5 shape within 5%
    # left out of the least-squares step: one row per expert (launch-bound calls) and TP1's dip at 256 rows
    left_out = fit.outliers(cases, hw)
    assert left_out == {(1, 1), (8, 1), (1, 256)}
    assert max(abs(t / m - 1) for c, m, t in rows if (c["tp"], c["rows"]) not in left_out) < 0.10
    unset = {"gemm_bandwidth_efficiency": None, "gemm_bandwidth_n_half": 0.0}  # weights read at bandwidth_efficiency
    estimates = fit.with_calibration(
        hw, {"gemm_efficiency_max": 0.75, "gemm_m_half": 200.0, "gemm_n_half": 64.0, **unset}
    )
    compute_only = fit.with_calibration(  # the earlier fit of the compute side alone
        hw, {"gemm_efficiency_max": 0.889, "gemm_m_half": 264.0, "gemm_n_half": 222.0, **unset}
    )
    assert fit.loss(cases, hw) < fit.loss(cases, compute_only) / 2 < fit.loss(cases, estimates) / 2


def test_narrow_gemms_stream_their_weights_slower_and_kv_reads_keep_the_serving_bandwidth():
    from tools.engines.sim.costmodel import CostModel, Parallel

    hw = load_hardware("h200")
    cal = hw.calibration
    cost = CostModel(load_model("llama-3.3-70b-fp8"), hw, Parallel(tp=1))
    assert cost.bw == pytest.approx(4800e9 * cal.bandwidth_efficiency)
    tp8, tp1, dense = (cost.gemm_bw(n) / 4800e9 for n in (256, 2048, 8192))
    assert tp8 < tp1 < dense < cal.gemm_bandwidth_efficiency < cal.bandwidth_efficiency
    assert (tp8, tp1, dense) == pytest.approx((0.35, 0.62, 0.68), abs=0.02)  # measured: 0.35, 0.62, ~0.70
    # a profile without the streaming scalars reads GEMM weights at bandwidth_efficiency, whatever the width
    rtx = load_hardware("rtx-pro-6000-blackwell")
    assert rtx.calibration.gemm_bandwidth_efficiency is None and rtx.calibration.gemm_bandwidth_n_half == 0
    plain = CostModel(load_model("glm-5-nvfp4"), rtx, Parallel(tp=8))
    assert all(plain.gemm_bw(n) == plain.bw for n in (1, 256, 2048, 6144))


def test_the_analysis_reads_a_gemm_as_the_twin_times_it():
    from tools.analysis import Roofline

    fit = _fit_script()
    hw = load_hardware("h200")
    roof = Roofline(load_model("llama-3.3-70b-fp8"), hw, tp=1, pp=1, ep=1, kv_dtype=None)
    for case in (c for c in fit.load_cases() if c["model"] == fit.CHECK_MODEL and c["name"] == "o_proj"):
        twin = case["flops"] / fit.twin_seconds(case, hw) / 1e12  # o_proj: n = hidden, as the twin reads it
        assert roof.fit_tflops(case["dtype"], case["rows"], 8192) == pytest.approx(twin, rel=1e-9)


def test_the_glm5_fit_predicts_the_dense_models_gemms_within_15_percent_from_64_rows():
    fit = _fit_script()
    check = fit.dense_check(fit.load_cases(), load_hardware("h200"))
    assert [rows for rows, *_ in check if rows >= 64] == [64, 128, 256, 512, 1024, 2048, 4096]
    off = {rows: round(100 * err, 1) for rows, _, _, err in check if rows >= 64 and abs(err) > 0.15}
    assert not off, off


# ---------------------------------------------------------------------------------------------- the real path


def test_launch_bench_writes_each_levels_gpu_readings(tmp_path):
    telemetry = tmp_path / "t.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "launch-bench", "--engine", "sim-http", "-o", "time_scale=50",
         "-o", "startup_s=0.1", "--concurrency", "1,4", "--num-prompts", "8", "--input-len", "8", "--output-len", "16",
         "--telemetry-file", str(telemetry), "--json", "--", "--tp-size", "8"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    levels = [json.loads(line) for line in telemetry.read_text().splitlines()]
    assert [t["max_concurrency"] for t in levels] == [1, 4]
    assert all(t["source"] == "simulated" and len(t["gpus"]) == 8 for t in levels)
    assert all(g["power_w_mean"] > 0 for t in levels for g in t["gpus"])
    assert "concurrency 1 (simulated): gpu0" in proc.stderr
    assert [lv["max_concurrency"] for lv in json.loads(proc.stdout)] == [1, 4]


def test_the_tiny_models_tokenizer_covers_the_load_generators_random_ids(tmp_path):
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    pytest.importorskip("jinja2")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(tmp_path), "--tokenizer-only"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "tokenizer: 32000 ids" in proc.stdout and (tmp_path / "tokenizer.json").exists()


# ---------------------------------------------------------------------------------------------- on a GPU only


@gpu
def test_measuring_on_the_gpu_gives_sane_figures(store):
    model = load_model("glm-5-nvfp4")
    run_ = mb.measure(model, load_hardware(mb.hardware_for_gpu(GPU_WHY) or "h200"), tps=[8], rows=[1, 64],
                      dtypes=["bf16"])  # fmt: skip
    timed = [c for c in run_["cases"] if c.get("seconds")]
    assert timed and all(0 < c["share_of_roofline"] <= 1.1 for c in timed)
    assert all(run_["checks"][k] < 0.02 for k in run_["checks"] if k.startswith("experts/bf16"))
    results, _ = mb.results_of_run(run_, load_hardware("h200"))
    assert mb.record(store, results) and store.microbench_results()


@gpu
def test_the_real_path_a_transformers_server_through_the_command_engine(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("fastapi")
    model_dir = tmp_path / "tiny"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(model_dir), "--layers", "2",
                    "--hidden", "256"], check=True, timeout=300)  # fmt: skip
    (tmp_path / "hf").mkdir()
    telemetry = tmp_path / "t.jsonl"
    command = f"command=transformers serve --continuous-batching --host 127.0.0.1 --port {{port}} {model_dir}"
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "launch-bench", "--engine", "command", "-o", command, "--endpoint", "chat",
         "--disable-ignore-eos", "--concurrency", "1,4", "--input-len", "32", "--output-len", "16",
         "--telemetry-file", str(telemetry), "--json", "--plan", "llama70b-fp8-h200x1"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "hf")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    levels = json.loads(proc.stdout)
    assert [lv["completed"] for lv in levels] == [8, 8] and all(lv["failed"] == 0 for lv in levels)
    readings = [json.loads(line) for line in telemetry.read_text().splitlines()]
    assert all(t["source"] == "measured" and t["gpus"][0]["power_w_mean"] > 0 for t in readings)


def _llama_rows():
    from tools.microbench import load_run, results_of_run

    hw = load_hardware("h200")
    rows = []
    for run in ("run1", "run2"):
        found, _ = results_of_run(load_run(ROOT / "scripts" / "calibration" / f"h200-gemm-llama-{run}.json"), hw)
        rows += found
    for i, r in enumerate(rows, 1):
        r.id = i
    return rows


def test_measured_dense_gemms_match_their_own_shape_and_tp_and_beat_the_fit_at_batch_1():
    """The roofline with the recorded H200 GEMMs of Llama 3.3 70B FP8: each linear layer at its own (n, k, dtype) rate,
    never a row of another shape or TP; at concurrency 1 its GPU step is nearer the 24.7 ms the whole step measured
    on the H200 (issue [silicon]) than the profile's fit, where matching on m and n alone gave 30.6 ms."""
    model, hw = load_model("llama-3.3-70b-fp8"), load_hardware("h200")
    rows = _llama_rows()
    fit = Roofline(model, hw, tp=1, pp=1, ep=1, kv_dtype=None).step(1, 1024)["gpu_s"] * 1e3
    measured = Roofline(model, hw, tp=1, pp=1, ep=1, kv_dtype=None, microbench=rows).step(1, 1024)["gpu_s"] * 1e3
    assert abs(measured - 24.7) < abs(fit - 24.7) and abs(measured - 24.7) / 24.7 < 0.05, (fit, measured)
    roof = Roofline(model, hw, tp=2, pp=1, ep=1, kv_dtype=None, microbench=rows)  # TP2 shapes: none measured
    assert roof.achieved_tflops("fp8", 1, 5120, 8192)[1] == "hardware profile's GEMM-efficiency fit"
    tp1 = Roofline(model, hw, tp=1, pp=1, ep=1, kv_dtype=None, microbench=rows)
    at = {r.m: r.tflops for r in rows if (r.n, r.k, r.dtype) == (57344, 8192, "fp8")}
    lo, hi = sorted(m_ for m_ in at if m_ < 48)[-1], sorted(m_ for m_ in at if m_ > 48)[0]
    between, source = tp1.achieved_tflops("fp8", 48, 57344, 8192)
    assert min(at[lo], at[hi]) * 0.9 <= between <= max(at[lo], at[hi]) * 1.1 and "micro-benchmark" in source
