"""The profile summarizer: kernel names into categories, and a synthetic torch-profiler trace summed by hand."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from agent.cli import cli
from agent.errors import PivotError
from agent.models import ProfileSummary
from tools.profile import CATEGORIES, kernel_category, summarize_traces, summarize_twin, trace_files


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("fused_moe_kernel", "expert_gemm"),
        ("void cutlass::device_kernel<flashinfer::cutlass_kernels::MoeFCGemm<...>>", "expert_gemm"),
        ("grouped_gemm_nt_masked_kernel", "expert_gemm"),
        ("moe_align_block_size_kernel", "expert_gemm"),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN", "other_gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "other_gemm"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "other_gemm"),
        ("ampere_bf16_s1688gemm_bf16_128x128_ldg8_f2f_tn", "other_gemm"),
        ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<...>", "attention"),
        ("void flash::flash_fwd_splitkv_kernel<...>", "attention"),
        ("void cutlass::fmha::kernel::Sm100FmhaFwdKernelTmaWarpspecialized<...>", "attention"),
        ("flashmla_decode_kernel", "attention"),
        ("void flashinfer::norm::RMSNormKernel<...>", "other"),
        ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<...>", "other"),
        ("void flashinfer::SomeNewKernel<...>", "attention"),  # the generic "flashinfer" fallback
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>", "communication"),
        ("void trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<...>", "communication"),
        ("void at::native::vectorized_elementwise_kernel<4, ...>", "other"),
        ("silu_and_mul_kernel", "other"),
    ],
)
def test_kernel_names_fall_into_categories(name, category):
    assert kernel_category(name) == category


def kernel(name: str, ts: float, dur: float, device: int = 0) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": 7, "ts": ts, "dur": dur,
            "args": {"device": device, "stream": 7}}  # fmt: skip


def write_trace(path, events, gz=True):
    data = json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_a_synthetic_trace_summed_by_hand(tmp_path):
    rank0 = [
        kernel("fused_moe_kernel", 0, 400),
        kernel("fused_moe_kernel", 1000, 400),
        kernel("nvjet_tst_128x256", 400, 200),
        kernel("void flashinfer::BatchDecodeWithPagedKVCacheKernel", 600, 100),
        kernel("ncclDevKernel_AllReduce_Sum_bf16", 700, 250),
        kernel("silu_and_mul_kernel", 950, 50),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5000},  # not GPU
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 0, "dur": 9},
        {"ph": "i", "cat": "kernel", "name": "instant", "pid": 0, "tid": 7, "ts": 0},
    ]
    rank1 = [
        kernel("fused_moe_kernel", 0, 600, device=1),
        kernel("nvjet_tst_128x256", 500, 200, device=1),  # overlaps the MoE kernel by 100 us
        kernel("ncclDevKernel_AllReduce_Sum_bf16", 1000, 250, device=1),
        kernel("void flash::flash_fwd_kernel", 1300, 100, device=1),
    ]
    files = [write_trace(tmp_path / "p-TP-0.trace.json.gz", rank0),
             write_trace(tmp_path / "p-TP-1.trace.json", rank1, gz=False)]  # fmt: skip
    s = summarize_traces(files)
    assert s.source == "measured" and s.ranks == 2
    # totals over both ranks (us): expert 1400, gemm 400, attention 200, comm 500, other 50 -> 2550
    expected_us = {"expert_gemm": 1400, "other_gemm": 400, "attention": 200, "communication": 500, "other": 50}
    assert list(s.categories) == list(CATEGORIES)
    for name, us in expected_us.items():
        assert s.categories[name].seconds == pytest.approx(us / 2 / 1e6)  # per GPU: the mean of the two ranks
        assert s.categories[name].share == pytest.approx(us / 2550)
    assert s.categories["expert_gemm"].kernels == 3
    assert s.total_s == pytest.approx(2550 / 2 / 1e6)
    assert sum(c.share for c in s.categories.values()) == pytest.approx(1.0)
    # windows: rank 0 from 0 to 1400 us, rank 1 from 0 to 1400 us; busy: rank 0 1400, rank 1 1400 - 100 gap + ...
    assert s.window_s == pytest.approx(1400e-6)
    # rank 1 busy: [0,700) + [1000,1250) + [1300,1400) = 700 + 250 + 100 = 1050 us; rank 0: all 1400 us
    assert s.busy_s == pytest.approx((1400 + 1050) / 2 / 1e6)
    assert s.top_kernels[0].name == "fused_moe_kernel" and s.top_kernels[0].count == 3
    assert s.top_kernels[0].seconds == pytest.approx(1400 / 2 / 1e6)
    assert ProfileSummary.model_validate_json(s.model_dump_json()) == s


def test_the_twin_breakdown_maps_onto_the_same_categories():
    answer = {
        "simulated": True, "window_s": 2.0, "step_time_s": 1.6, "busy_s": 1.6, "prefill_steps": 3, "decode_steps": 40,
        "breakdown": {
            "expert_gemm": {"seconds": 0.8, "share": 0.5},
            "dense_gemm": {"seconds": 0.2, "share": 0.125},
            "attention": {"seconds": 0.2, "share": 0.125},
            "communication": {"seconds": 0.3, "share": 0.1875},
            "host_overhead": {"seconds": 0.1, "share": 0.0625},
        },
    }  # fmt: skip
    s = summarize_twin(answer)
    assert s.source == "simulated" and s.total_s == pytest.approx(1.6) and s.window_s == 2.0
    assert {k: round(c.seconds, 6) for k, c in s.categories.items()} == {
        "expert_gemm": 0.8, "other_gemm": 0.2, "attention": 0.2, "communication": 0.3, "other": 0.1,
    }  # fmt: skip
    assert s.categories["expert_gemm"].share == pytest.approx(0.5)
    assert s.notes == ["simulated: the twin's step-time breakdown over 3 prefill and 40 decode steps"]
    with pytest.raises(PivotError, match="no breakdown"):
        summarize_twin({"simulated": True})


def test_bad_traces_are_clear_errors(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(PivotError, match="cannot read the trace"):
        summarize_traces([tmp_path / "x.json"])
    (tmp_path / "y.json").write_text('{"a": 1}')
    with pytest.raises(PivotError, match="not a Chrome trace"):
        summarize_traces([tmp_path / "y.json"])
    with pytest.raises(PivotError, match="no trace at"):
        trace_files(tmp_path / "missing")
    s = summarize_traces([write_trace(tmp_path / "empty.json.gz", [])])
    assert s.total_s == 0 and "no GPU kernel events" in s.notes[0]


def test_pivot_profile_summarizes_a_trace_directory(tmp_path):
    write_trace(tmp_path / "pivot-1-TP-0.trace.json.gz", [kernel("fused_moe_kernel", 0, 750), kernel("gemm", 750, 250)])
    result = CliRunner().invoke(cli, ["profile", "--trace", str(tmp_path), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    s = ProfileSummary.model_validate_json(result.stdout)
    assert s.categories["expert_gemm"].share == 0.75 and s.categories["other_gemm"].share == 0.25
    result = CliRunner().invoke(cli, ["profile", "--trace", str(tmp_path)], catch_exceptions=False)
    assert "expert_gemm" in result.stdout and "75.0%" in result.stdout
    result = CliRunner().invoke(cli, ["profile"], catch_exceptions=False)
    assert result.exit_code == 1 and "give either --base-url or --trace" in result.stderr
