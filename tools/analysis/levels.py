"""Per-level evidence: each concurrency level against the roofline, the notes on the layout, the scaling of
output tok/s over the levels, and a profile's split of GPU time."""

from __future__ import annotations

import math

from agent import models as m
from tools.analysis.common import GB, SUBLINEAR_EXPONENT, _finding, _n, _rows
from tools.analysis.ledger import _kv_usage, _power
from tools.analysis.results import LevelRoofline
from tools.analysis.roofline import _PROFILE_COMPONENTS, COMPONENT_TITLES, Roofline
from tools.profiles import HardwareProfile, ModelProfile


def _level_roofline(
    level: m.BenchLevel,
    telemetry: m.Telemetry | None,
    roof: Roofline,
    hw: HardwareProfile,
    previous: list[LevelRoofline],
) -> LevelRoofline:
    c = int(level.max_concurrency or 0)
    tpot_ms = level.mean_tpot_ms if level.mean_tpot_ms > 0 else (level.mean_itl_ms or 0.0)
    batch = min(level.output_throughput * tpot_ms / 1000, float(c)) if tpot_ms > 0 else float(c)
    batch = max(batch, 1.0)
    completed = max(level.completed, 1)
    ctx = level.total_input_tokens / completed + level.total_output_tokens / completed / 2
    model = roof.model
    # one set of numbers: every per-level figure is at the batch that actually decodes (running decodes), the
    # batch the decode-step estimate uses, not at the nominal concurrency
    step = roof.step(batch, ctx)
    if roof.moe:
        rows_pe = roof.rows_per_expert(batch)
        gm, gn, gk = roof.rows_per_hit_expert(batch), roof.expert_width, float(model.hidden_size)
        ai = roof.expert_intensity(gm)
        dtype = roof.expert_dtype
        gemm_flops, gemm_s = step["expert_flops"] * roof.pp, step["expert_gemm_s"]
    else:
        rows_pe = None
        gm, gn, gk = roof.dense_shape(batch)
        ai = roof.dense_intensity(batch)
        dtype = roof.dense_dtype
        gemm_flops, gemm_s = step["dense_flops"] * roof.pp, step["dense_gemm_s"]
    ridge = roof.ridge(dtype)
    peak = hw.peak_tflops(dtype)
    roofline = min(peak, ai * roof.bw / 1e12)
    if not roof.moe and roof.measured_dense():  # each linear layer at the rate measured for its own shape
        names = "/".join(g.name.removesuffix("_proj") for g in model.dense_gemms)
        achieved_source = f"micro-benchmarks of the model's own GEMM shapes ({names} at TP{roof.tp}, rows interpolated)"
    else:
        _, achieved_source = roof.achieved_tflops(dtype, gm, gn)
    achieved = gemm_flops / gemm_s / 1e12 if gemm_s > 0 else 0.0
    floor_ms = step["floor_s"] * 1000
    peak_out = level.max_output_tokens_per_s
    decode_ms = min(batch / peak_out * 1000, tpot_ms) if peak_out > 0 else tpot_ms
    power, limit, util = _power(telemetry, hw)
    kv = _kv_usage(level, telemetry)
    exponent = None
    if previous and previous[-1].output_throughput > 0 and level.output_throughput > 0:
        prev = previous[-1]
        exponent = math.log(level.output_throughput / prev.output_throughput) / math.log(c / prev.max_concurrency)
    return LevelRoofline(
        max_concurrency=c,
        completed=level.completed,
        failed=level.failed,
        output_throughput=level.output_throughput,
        total_throughput=level.total_throughput,
        max_output_tokens_per_s=peak_out,
        mean_ttft_ms=level.mean_ttft_ms,
        mean_tpot_ms=tpot_ms,
        running_decodes=batch,
        context_tokens=ctx,
        rows_per_expert=rows_pe,
        gemm_m=gm,
        gemm_n=gn,
        gemm_k=gk,
        arithmetic_intensity_flop_per_byte=ai,
        ridge_flop_per_byte=ridge,
        gemm_bound="memory" if ai < ridge else "compute",
        peak_tflops=peak,
        roofline_tflops=roofline,
        achieved_tflops=achieved,
        gemm_tflop=gemm_flops / 1e12,
        achieved_source=achieved_source,
        share_of_peak_pct=100 * achieved / peak,
        share_of_roofline_pct=100 * achieved / roofline if roofline > 0 else 0.0,
        step_bytes_gb=step["bytes"] * roof.pp / GB,
        bandwidth_floor_ms=floor_ms,
        tpot_over_floor=tpot_ms / floor_ms if floor_ms > 0 else 0.0,
        decode_step_ms=decode_ms,
        estimate_ms={
            k.removesuffix("_s"): 1000 * step[k]
            for k in ("expert_gemm_s", "dense_gemm_s", "attention_s", "communication_s")
        },
        power_w_mean=power,
        power_limit_w=limit,
        power_share_pct=100 * power / limit if power is not None and limit else None,
        util_pct=util,
        kv_usage_pct=100 * kv if kv is not None else None,
        scaling_exponent=exponent,
    )


def _notes(roof: Roofline, model: ModelProfile, lay: dict[str, int]) -> list[m.Finding]:
    if roof.moe:
        shard = "EP" if roof.ep > 1 else "TP"
        where = (
            f"under EP{roof.ep} whole experts live on fewer GPUs ({model.experts // roof.ep} of {model.experts} per GPU), "
            f"each at its full width of {_n(roof.expert_width)} columns"
            if roof.ep > 1
            else f"under TP{roof.tp} every GPU holds each of the {model.experts} experts at 1/{roof.tp} of its width "
            f"({_n(roof.expert_width)} of {_n(model.expert_ffn)} columns)"
        )
        return [
            _finding(
                "note",
                f"{model.title}: {model.experts} routed experts, {model.experts_per_token} per token; {where}.",
                {
                    "experts": model.experts,
                    "experts_per_token": model.experts_per_token,
                    "expert_width": roof.expert_width,
                    "expert_ffn": model.expert_ffn,
                    f"{shard.lower()}_size": roof.ep if roof.ep > 1 else roof.tp,
                },
                formula="expert width on one GPU = expert_ffn / tp under TP, expert_ffn under EP",
            )
        ]
    return [
        _finding(
            "note",
            f"{model.title} is a dense model: rows per expert do not apply; its GEMMs see M = the batch, "
            f"through {_n(model.hidden_size)} x {_n(model.hidden_size / roof.tp)} weights per GPU at TP{roof.tp}.",
            {"hidden_size": model.hidden_size, "gemm_n": model.hidden_size / roof.tp, "tp_size": roof.tp},
            formula="dense GEMM: M = concurrency rows, K = hidden, N = hidden / tp",
        )
    ]


def _level_finding(r: LevelRoofline, roof: Roofline) -> m.Finding:
    c = r.max_concurrency
    if r.rows_per_expert is not None:
        shape = f"{_rows(r.rows_per_expert)} rows per expert"
        if abs(r.gemm_m - r.rows_per_expert) > 0.05 * r.gemm_m:
            shape += f" on average, {_rows(r.gemm_m)} per expert hit"
        shape += f", x {_n(r.gemm_n)} columns"
    else:
        shape = f"a {_n(r.gemm_m)}-row GEMM"
    power = (
        f"; {_n(r.power_w_mean)} W per GPU, {_n(r.power_share_pct)}% of the {_n(r.power_limit_w)} W limit"
        if r.power_w_mean is not None and r.power_share_pct is not None and r.power_limit_w
        else ""
    )
    kv = f"; KV pool {_n(r.kv_usage_pct)}% used" if r.kv_usage_pct is not None else ""
    text = (
        f"Concurrency {c} (about {_n(r.running_decodes)} requests decoding at once): {shape}, "
        f"{_n(r.arithmetic_intensity_flop_per_byte)} FLOP/byte "
        f"({r.gemm_bound}-bound, ridge {_n(r.ridge_flop_per_byte)}), about {_n(r.achieved_tflops)} TFLOPS "
        f"({_n(r.share_of_peak_pct, 1)}% of peak); TPOT {_n(r.mean_tpot_ms, 1)} ms is "
        f"{_n(r.tpot_over_floor, 1)}x the {_n(r.bandwidth_floor_ms, 1)} ms bandwidth floor{power}{kv}."
    )
    values: dict[str, float] = {
        "max_concurrency": c,
        "output_throughput": r.output_throughput,
        "running_decodes": r.running_decodes,
        "context_tokens": r.context_tokens,
        "gemm_m": r.gemm_m,
        "gemm_n": r.gemm_n,
        "gemm_k": r.gemm_k,
        "arithmetic_intensity_flop_per_byte": r.arithmetic_intensity_flop_per_byte,
        "ridge_flop_per_byte": r.ridge_flop_per_byte,
        "peak_tflops": r.peak_tflops,
        "roofline_tflops": r.roofline_tflops,
        "achieved_tflops": r.achieved_tflops,
        "gemm_tflop": r.gemm_tflop,
        "share_of_peak_pct": r.share_of_peak_pct,
        "share_of_roofline_pct": r.share_of_roofline_pct,
        "step_bytes_gb": r.step_bytes_gb,
        "bandwidth_gbs": roof.bw / GB,
        **({"experts_per_token": roof.model.experts_per_token, "experts": roof.model.experts} if roof.moe else {}),
        "bandwidth_floor_ms": r.bandwidth_floor_ms,
        "mean_tpot_ms": r.mean_tpot_ms,
        "tpot_over_floor": r.tpot_over_floor,
        "decode_step_ms": r.decode_step_ms,
        "memory_bound": 1.0 if r.gemm_bound == "memory" else 0.0,
        **{f"estimate_{k}_ms": v for k, v in r.estimate_ms.items()},
    }
    for key in (
        "rows_per_expert",
        "power_w_mean",
        "power_limit_w",
        "power_share_pct",
        "util_pct",
        "kv_usage_pct",
        "scaling_exponent",
    ):
        value = getattr(r, key)
        if value is not None:
            values[key] = value
    return _finding(
        "level",
        text,
        values,
        max_concurrency=c,
        formula=f"{'rows per expert hit = running decodes x k / E_hit; ' if roof.moe else 'M = running decodes; '}"
        f"AI = 2 x FLOPs per weight byte with activations; TFLOPS = the step estimate's GEMM FLOPs / its GEMM time "
        f"(GEMM efficiency from {r.achieved_source}); floor = GB per decode step / the {_n(roof.bw / GB)} GB/s peak bandwidth",
    )


def _scaling_finding(rows: list[LevelRoofline], stops: LevelRoofline | None) -> m.Finding:
    top = rows[-1]
    if len(rows) < 2:
        return _finding(
            "scaling",
            f"Only concurrency {top.max_concurrency} was measured: no scaling to read.",
            {"max_concurrency": top.max_concurrency},
        )
    if stops is not None:
        i = rows.index(stops)
        prev = rows[i - 1]
        text = (
            f"Output tok/s stops scaling at concurrency {stops.max_concurrency}: {_n(prev.output_throughput)} -> "
            f"{_n(stops.output_throughput)} tok/s from concurrency {prev.max_concurrency} "
            f"(scaling exponent {_n(stops.scaling_exponent or 0, 2)}; 1 is linear)."
        )
        values = {
            "max_concurrency": stops.max_concurrency,
            "previous_concurrency": prev.max_concurrency,
            "previous_output_throughput": prev.output_throughput,
            "output_throughput": stops.output_throughput,
            "scaling_exponent": stops.scaling_exponent or 0,
        }
        return _finding(
            "scaling",
            text,
            values,
            max_concurrency=stops.max_concurrency,
            formula="scaling exponent = ln(out_i / out_i-1) / ln(c_i / c_i-1)",
        )
    prev = rows[-2]
    ratio = top.output_throughput / prev.output_throughput if prev.output_throughput else 0.0
    kind = "sublinearly" if (top.scaling_exponent or 0) < SUBLINEAR_EXPONENT else "almost linearly"
    text = (
        f"Output tok/s still grows at the highest level, {kind}: x{_n(ratio, 2)} from concurrency "
        f"{prev.max_concurrency} to {top.max_concurrency} (scaling exponent {_n(top.scaling_exponent or 0, 2)})."
    )
    return _finding(
        "scaling",
        text,
        {
            "max_concurrency": top.max_concurrency,
            "previous_concurrency": prev.max_concurrency,
            "throughput_ratio": ratio,
            "scaling_exponent": top.scaling_exponent or 0,
        },
        max_concurrency=top.max_concurrency,
        formula="ratio = out_i / out_i-1; scaling exponent = ln(ratio) / ln(c_i / c_i-1)",
    )


def _profile_finding(
    profile: m.ProfileSummary, ref: LevelRoofline, elsewhere: int | None = None, elsewhere_number: int | None = None
) -> m.Finding:
    """The profile's breakdown; `elsewhere` (a ledger id, with its number in the session) when it was measured on
    another experiment of the same configuration."""
    parts = sorted(profile.categories.items(), key=lambda kv: -kv[1].share)
    text = (
        f"Profile ({profile.source}"
        + (f", on experiment {elsewhere_number or elsewhere}: the same configuration" if elsewhere is not None else "")
        + (f", concurrency {profile.max_concurrency}" if profile.max_concurrency else "")
        + "): "
        + ", ".join(f"{COMPONENT_TITLES.get(_PROFILE_COMPONENTS.get(k, k), k)} {_n(100 * c.share)}%" for k, c in parts)
        + " of GPU time."
    )
    values = {f"profile_{k}_share_pct": 100 * c.share for k, c in profile.categories.items()}
    values.update({f"profile_{k}_s": c.seconds for k, c in profile.categories.items()})
    if elsewhere is not None:
        values["profiled_experiment_id"] = elsewhere
    return _finding(
        "evidence",
        text,
        values,
        max_concurrency=profile.max_concurrency or ref.max_concurrency,
        formula="share = a category's kernel time / all kernel time in the profile window",
    )
