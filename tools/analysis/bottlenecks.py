"""The dominant bottleneck of an experiment: one rule per bottleneck, asked in order (the package docstring).

Every rule reads the same `Facts` (the levels, the reference level R with the best output tok/s, and the lines
several rules share) and returns its category's evidence lines and whether it gives the verdict. All rules run:
the evidence of the rules that do not give the verdict becomes the secondary findings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agent import models as m
from tools.analysis.common import (
    KV_FULL,
    LOW_POWER_SHARE,
    SMALL_GEMM_SHARE_OF_PEAK,
    STOPPED_EXPONENT,
    SUBLINEAR_EXPONENT,
    _finding,
    _n,
    _rows,
)
from tools.analysis.results import LevelRoofline
from tools.analysis.roofline import _PROFILE_COMPONENTS, COMPONENT_TITLES, Roofline
from tools.profiles import HardwareProfile

# The lowest level that can show the host's cost per step: up to 8 concurrent requests a step's GPU work is small and
# batching hides little of the host's (transformers serve on an H100, 2026-12-06: TPOT 56 ms at 4 requests for 7 ms of
# GEMMs; its plan measured at 4 and 32, so a bound of 2 named memory bandwidth for a host-bound engine).
HOST_LEVEL_MAX = 8


@dataclass
class Facts:
    """What the rules read: the sweep, its reference level R, and the numbers and lines several rules share."""

    roof: Roofline
    rows: list[LevelRoofline]
    ref: LevelRoofline
    failed_levels: list[m.BenchLevel]
    hw: HardwareProfile
    est: dict[str, float]  # R's decode-step components, estimated (ms)
    gpu_ms: float  # their sum
    low: LevelRoofline | None  # the lowest level when its concurrency is <= HOST_LEVEL_MAX (where host overhead shows)
    low_gpu_ms: float
    host_ms: float | None  # TPOT at `low` minus its GPU estimate
    inflation: float  # TPOT at R / the decode step
    distance: float  # the decode step / its bandwidth floor
    prefill_line: m.Finding
    largest: str  # the largest component of the decode step (the profile's when one was given)
    comp_line: m.Finding  # the components, with their shares
    power_line: m.Finding | None

    @property
    def c(self) -> int:
        return self.ref.max_concurrency


@dataclass
class Rule:
    """A rule's answer: its category's evidence, whether it gives the verdict, and the lines it adds if it does."""

    category: m.BottleneckCategory
    lines: list[m.Finding] = field(default_factory=list)
    decides: bool = False
    extra: list[m.Finding] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# What the rules share.


def _facts(
    roof: Roofline,
    rows: list[LevelRoofline],
    ref: LevelRoofline,
    failed_levels: list[m.BenchLevel],
    profile: m.ProfileSummary | None,
    hw: HardwareProfile,
) -> Facts:
    est = ref.estimate_ms
    gpu_ms = sum(est.values())
    low = rows[0] if rows[0].max_concurrency <= HOST_LEVEL_MAX else None
    low_gpu_ms = sum(low.estimate_ms.values()) if low is not None else 0.0
    host_ms = max(low.mean_tpot_ms - low_gpu_ms, 0.0) if low is not None else None
    inflation = ref.mean_tpot_ms / ref.decode_step_ms if ref.decode_step_ms > 0 else 1.0
    distance = ref.decode_step_ms / ref.bandwidth_floor_ms if ref.bandwidth_floor_ms > 0 else 0.0
    prefill_line = _prefill_line(ref, inflation, distance)
    if profile is not None and profile.categories:
        largest, comp_line = _profile_components(profile, est, ref.max_concurrency)
    else:
        largest, comp_line = _estimated_components(ref, est, gpu_ms)
    return Facts(
        roof=roof,
        rows=rows,
        ref=ref,
        failed_levels=failed_levels,
        hw=hw,
        est=est,
        gpu_ms=gpu_ms,
        low=low,
        low_gpu_ms=low_gpu_ms,
        host_ms=host_ms,
        inflation=inflation,
        distance=distance,
        prefill_line=prefill_line,
        largest=largest,
        comp_line=comp_line,
        power_line=_power_line(ref, distance, largest),
    )


def _prefill_line(ref: LevelRoofline, inflation: float, distance: float) -> m.Finding:
    c = ref.max_concurrency
    return _finding(
        "evidence",
        f"At concurrency {c}, TPOT ({_n(ref.mean_tpot_ms, 1)} ms) is {_n(inflation, 1)}x the decode step "
        f"({_n(ref.decode_step_ms, 1)} ms = {_n(ref.running_decodes)} running requests / "
        f"{_n(ref.max_output_tokens_per_s)} peak output tok/s): requests spend that time waiting while other "
        f"prompts are prefilled; the decode step itself is {_n(distance, 1)}x its bandwidth floor.",
        {
            "max_concurrency": c,
            "mean_tpot_ms": ref.mean_tpot_ms,
            "tpot_over_decode_step": inflation,
            "decode_step_ms": ref.decode_step_ms,
            "running_decodes": ref.running_decodes,
            "max_output_tokens_per_s": ref.max_output_tokens_per_s,
            "decode_step_over_floor": distance,
        },
        category="prefill_interference",
        max_concurrency=c,
        formula="decode step = running decodes / peak output tok/s; ratios of TPOT, decode step and floor",
    )


def _profile_components(profile: m.ProfileSummary, est: dict[str, float], c: int) -> tuple[str, m.Finding]:
    """The largest component by the profile's shares (else by the estimates), and the line that lists the shares."""
    shares: dict[str, float] = {}
    for key, cat in profile.categories.items():
        comp = _PROFILE_COMPONENTS.get(key, key)
        shares[comp] = shares.get(comp, 0.0) + cat.share
    shares.pop("other", None)
    largest = max(shares, key=shares.get) if shares else max(est, key=est.get)
    parts_text = ", ".join(
        f"{COMPONENT_TITLES[k]} {_n(100 * v)}%" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])
    )
    return largest, _finding(
        "evidence",
        f"The profile splits GPU time into {parts_text}: {COMPONENT_TITLES[largest]} take the largest share.",
        {f"profile_{k}_share_pct": 100 * v for k, v in shares.items()},
        max_concurrency=profile.max_concurrency or c,
        formula="shares of kernel time in the profile window",
    )


def _estimated_components(ref: LevelRoofline, est: dict[str, float], gpu_ms: float) -> tuple[str, m.Finding]:
    """The largest estimated component of R's decode step, and the line that lists the estimates."""
    c = ref.max_concurrency
    largest = max(est, key=est.get)
    parts_text = ", ".join(
        f"{COMPONENT_TITLES[k]} {_n(v)} ms ({_n(100 * v / gpu_ms)}%)"
        for k, v in sorted(est.items(), key=lambda kv: -kv[1])
        if v >= 0.5 and gpu_ms > 0
    )
    return largest, _finding(
        "evidence",
        f"Estimated decode step at concurrency {c} ({_n(ref.running_decodes)} running requests): {parts_text} "
        f"(sum {_n(gpu_ms)} ms against {_n(ref.decode_step_ms)} ms measured): {COMPONENT_TITLES[largest]} are the "
        "largest part.",
        {
            **{f"estimate_{k}_ms": v for k, v in est.items()},
            "gpu_estimate_ms": gpu_ms,
            "decode_step_ms": ref.decode_step_ms,
            "running_decodes": ref.running_decodes,
            "max_concurrency": c,
        },
        max_concurrency=c,
        formula="component = max(bytes / peak bandwidth, FLOPs / achieved TFLOPS); share = component / their sum; "
        "all-reduce = latency + 2 (tp-1)/tp x payload / link bandwidth",
    )


def _power_line(ref: LevelRoofline, distance: float, largest: str) -> m.Finding | None:
    """What the GPUs' power draw at R implies, when telemetry measured it."""
    if ref.power_share_pct is None or ref.power_w_mean is None:
        return None
    c = ref.max_concurrency
    exp = ref.scaling_exponent
    growth = (
        "while output tok/s grows sublinearly" if exp is not None and exp < SUBLINEAR_EXPONENT else "at the best level"
    )
    if ref.power_share_pct >= 80:
        implies = "the GPUs run near their limit"
    elif ref.power_share_pct >= 100 * LOW_POWER_SHARE:
        implies = "the GPUs are busy but not at their limit"
    elif distance >= 2.0:  # the step is far from its bandwidth floor: memory is not what they wait on
        implies = (
            f"neither the memory (the decode step is {_n(distance, 1)}x its bandwidth floor) nor the tensor cores "
            f"({_n(ref.share_of_peak_pct, 1)}% of peak in the GEMMs) are saturated"
        )
    elif largest in ("expert_gemm", "attention") or (largest == "dense_gemm" and ref.gemm_bound == "memory"):
        implies = "the SMs are waiting on memory, not computing"
    else:
        implies = "the SMs are waiting more than they compute"
    return _finding(
        "evidence",
        f"GPUs at {_n(ref.power_share_pct)}% of their power limit ({_n(ref.power_w_mean)} W of "
        f"{_n(ref.power_limit_w or 0)} W) at concurrency {c} {growth}"
        + (f" (scaling exponent {_n(exp, 2)})" if exp is not None else "")
        + f": {implies}.",
        {
            "power_share_pct": ref.power_share_pct,
            "power_w_mean": ref.power_w_mean,
            "power_limit_w": ref.power_limit_w or 0,
            "max_concurrency": c,
            "decode_step_over_floor": distance,
            "share_of_peak_pct": ref.share_of_peak_pct,
            **({"scaling_exponent": exp} if exp is not None else {}),
        },
        max_concurrency=c,
        formula="power share = mean GPU power / power limit",
    )


def _component_category(f: Facts) -> m.BottleneckCategory:
    """The bottleneck the largest component of the decode step points to."""
    if f.largest == "expert_gemm":
        small = f.ref.gemm_bound == "memory" or f.ref.share_of_peak_pct < 100 * SMALL_GEMM_SHARE_OF_PEAK
        return "small_batch_expert_gemm" if small else "compute"
    if f.largest == "dense_gemm":
        compute_bound = f.roof.dense_intensity(f.ref.running_decodes) >= f.roof.ridge(f.roof.dense_dtype)
        return "compute" if compute_bound else "memory_bandwidth"
    if f.largest == "attention":
        return "memory_bandwidth"
    if f.largest == "communication":
        return "communication"
    # "other" from a profile: no category of its own; the estimates decide
    return "memory_bandwidth" if max(f.est, key=f.est.get) in ("attention", "dense_gemm") else "compute"


def _component_lines(f: Facts, category: m.BottleneckCategory) -> list[m.Finding]:
    """The evidence of the largest component of the decode step, for the category it points to."""
    power = [f.power_line] if f.power_line is not None else []
    if f.largest == "expert_gemm":
        return _expert_gemm_lines(f, category)
    if f.largest == "dense_gemm":
        return [_dense_gemm_line(f, category), f.comp_line, *power]
    if f.largest == "attention":
        return [f.comp_line, *power]
    if f.largest == "communication":
        return [*_all_reduce_lines(f), f.comp_line]
    return [f.comp_line]


def _expert_gemm_lines(f: Facts, category: m.BottleneckCategory) -> list[m.Finding]:
    """Rows per expert, the expert GEMM against its roofline, the power draw, and the measured upper bound."""
    roof, ref, model, c = f.roof, f.ref, f.roof.model, f.c
    memory_bound = ref.gemm_bound == "memory"
    rows_pe = ref.rows_per_expert or 0.0
    width = (
        f"under TP{roof.tp} each GPU runs every expert at 1/{roof.tp} of its width ({_n(roof.expert_width)} columns)"
        if roof.ep <= 1
        else f"under EP{roof.ep} each GPU runs {model.experts // roof.ep} whole experts ({_n(roof.expert_width)} columns)"
    )
    lines = [
        _finding(
            "evidence",
            f"At concurrency {c} about {_n(ref.running_decodes)} requests decode at once, so each expert sees "
            f"{_rows(rows_pe)} rows per decode step ({_n(ref.running_decodes)} x {model.experts_per_token} / "
            f"{model.experts}); {width}.",
            {
                "max_concurrency": c,
                "running_decodes": ref.running_decodes,
                "rows_per_expert": rows_pe,
                "experts_per_token": model.experts_per_token,
                "experts": model.experts,
                "expert_width": roof.expert_width,
            },
            category=category,
            max_concurrency=c,
            formula="rows per expert = running decodes x experts per token / experts",
        ),
        _finding(
            "evidence",
            f"That GEMM ({_rows(rows_pe)} x {_n(ref.gemm_n)} x {_n(ref.gemm_k)}, {roof.expert_dtype}) does "
            f"{_n(ref.arithmetic_intensity_flop_per_byte)} FLOP per byte, "
            + (
                f"below the ridge point of {_n(ref.ridge_flop_per_byte)}: memory-bound, capped at "
                f"{_n(ref.roofline_tflops)} TFLOPS by the roofline"
                if memory_bound
                else f"above the ridge point of {_n(ref.ridge_flop_per_byte)}: compute-bound"
            )
            + f"; the estimate runs the expert GEMMs at about {_n(ref.achieved_tflops)} TFLOPS "
            f"({_n(ref.gemm_tflop, 2)} TFLOP per GPU in {_n(ref.estimate_ms.get('expert_gemm', 0.0))} ms), "
            f"{_n(ref.share_of_peak_pct, 1)}% of the {_n(ref.peak_tflops)} TFLOPS peak ({ref.achieved_source}).",
            {
                "gemm_tflop": ref.gemm_tflop,
                "estimate_expert_gemm_ms": ref.estimate_ms.get("expert_gemm", 0.0),
                "rows_per_expert": rows_pe,
                "gemm_n": ref.gemm_n,
                "gemm_k": ref.gemm_k,
                "arithmetic_intensity_flop_per_byte": ref.arithmetic_intensity_flop_per_byte,
                "ridge_flop_per_byte": ref.ridge_flop_per_byte,
                "roofline_tflops": ref.roofline_tflops,
                "achieved_tflops": ref.achieved_tflops,
                "share_of_peak_pct": ref.share_of_peak_pct,
                "peak_tflops": ref.peak_tflops,
            },
            category=category,
            max_concurrency=c,
            formula="AI = 2 m W / (W b_w + m a); ridge = peak / bandwidth; roofline = min(peak, AI x bandwidth)",
        ),
    ]
    if f.power_line is not None:
        lines.append(f.power_line)
    upper = _expert_upper_bound_line(f, category)
    return [*lines, *([upper] if upper is not None else []), f.comp_line]


def _expert_upper_bound_line(f: Facts, category: m.BottleneckCategory) -> m.Finding | None:
    """The TFLOPS the expert GEMMs would reach if the whole measured decode step were theirs."""
    roof, ref, c = f.roof, f.ref, f.c
    step = roof.step(ref.running_decodes, ref.context_tokens)
    if not (ref.decode_step_ms > 0 and step["expert_flops"] > 0):
        return None
    bound = step["expert_flops"] * roof.pp / (ref.decode_step_ms / 1000) / 1e12
    return _finding(
        "evidence",
        f"Measured: a decode step at concurrency {c} takes about {_n(ref.decode_step_ms)} ms; even if all of it "
        f"were expert GEMMs ({_n(step['expert_flops'] * roof.pp / 1e12, 2)} TFLOP per GPU), they would run at "
        f"{_n(bound)} TFLOPS, {_n(100 * bound / ref.peak_tflops, 1)}% of peak.",
        {
            "decode_step_ms": ref.decode_step_ms,
            "expert_tflop": step["expert_flops"] * roof.pp / 1e12,
            "expert_tflops_upper_bound": bound,
            "share_of_peak_pct": 100 * bound / ref.peak_tflops,
        },
        category=category,
        max_concurrency=c,
        formula="upper bound = expert FLOPs per GPU per step / measured decode step",
    )


def _dense_gemm_line(f: Facts, category: m.BottleneckCategory) -> m.Finding:
    roof, ref, c = f.roof, f.ref, f.c
    ai = roof.dense_intensity(ref.running_decodes)
    ridge = roof.ridge(roof.dense_dtype)
    return _finding(
        "evidence",
        f"Dense GEMMs at concurrency {c} see M = {_n(ref.running_decodes)} rows: {_n(ai)} FLOP per byte "
        f"against a ridge point of {_n(ridge)} ({roof.dense_dtype}), so they are "
        f"{'compute' if ai >= ridge else 'memory'}-bound.",
        {
            "max_concurrency": c,
            "running_decodes": ref.running_decodes,
            "arithmetic_intensity_flop_per_byte": ai,
            "ridge_flop_per_byte": ridge,
        },
        category=category,
        max_concurrency=c,
        formula="dense AI = 2 M K N / (K N b_w + M K b_a + 2 M N), M = running decodes",
    )


def _all_reduce_lines(f: Facts) -> list[m.Finding]:
    """Under TP: the all-reduces of one decode step, their payload and the link they cross."""
    roof, ref, model, hw, c = f.roof, f.ref, f.roof.model, f.hw, f.c
    if roof.tp <= 1:
        return []
    payload_mb = ref.running_decodes * model.hidden_size * 2 / 1e6
    return [
        _finding(
            "evidence",
            f"TP{roof.tp} runs {2 * model.layers // roof.pp} all-reduces per decode step of {_n(payload_mb, 1)} MB "
            f"each at concurrency {c}, over {hw.interconnect.kind} at {_n(hw.interconnect.bandwidth_gbs)} GB/s "
            f"per direction: about {_n(f.est['communication'])} ms per step.",
            {
                "all_reduces": 2 * model.layers // roof.pp,
                "payload_mb": payload_mb,
                "link_gbs": hw.interconnect.bandwidth_gbs,
                "estimate_communication_ms": f.est["communication"],
                "max_concurrency": c,
            },
            category="communication",
            max_concurrency=c,
            formula="payload = running decodes x hidden x 2 bytes",
        )
    ]


def _component_rule(f: Facts, category: m.BottleneckCategory) -> Rule:
    """A component rule: `category` gives the verdict, with the component's evidence, when the largest part of
    the decode step points to it."""
    if _component_category(f) != category:
        return Rule(category)
    return Rule(category, _component_lines(f, category), decides=True)


# --------------------------------------------------------------------------------------------------
# The rules, one per bottleneck.


def kv_capacity(f: Facts) -> Rule:
    """Throughput stopped scaling at a level whose KV pool was >= 90% full, or requests failed for lack of memory."""
    rows = f.rows
    kv_stop = next(
        (
            r
            for r in rows[1:]
            if r.kv_usage_pct is not None
            and r.kv_usage_pct >= 100 * KV_FULL
            and r.scaling_exponent is not None
            and r.scaling_exponent < STOPPED_EXPONENT
        ),
        None,
    )
    lines = _kv_stop_lines(kv_stop, rows[rows.index(kv_stop) - 1]) if kv_stop is not None else []
    oom = [lv for lv in f.failed_levels if any("memory" in e.lower() or "oom" in e.lower() for e in lv.errors)]
    for lv in oom:
        lines.append(
            _finding(
                "evidence",
                f"At concurrency {lv.max_concurrency}, {lv.failed} requests failed for lack of memory: "
                + "; ".join(sorted(lv.errors)[:2])
                + ".",
                {"max_concurrency": lv.max_concurrency or 0, "failed": lv.failed},
                category="kv_capacity",
                max_concurrency=lv.max_concurrency,
                severity="warning",
            )
        )
    return Rule("kv_capacity", lines, decides=bool(lines))


def _kv_stop_lines(kv_stop: LevelRoofline, prev: LevelRoofline) -> list[m.Finding]:
    return [
        _finding(
            "evidence",
            f"KV pool {_n(kv_stop.kv_usage_pct or 0)}% full at concurrency {kv_stop.max_concurrency} while output "
            f"tok/s went from {_n(prev.output_throughput)} to {_n(kv_stop.output_throughput)} for "
            f"{_n(kv_stop.max_concurrency / prev.max_concurrency, 0)}x the concurrency: new requests wait for KV "
            "space, so the batch cannot grow.",
            {
                "kv_usage_pct": kv_stop.kv_usage_pct or 0,
                "max_concurrency": kv_stop.max_concurrency,
                "previous_output_throughput": prev.output_throughput,
                "output_throughput": kv_stop.output_throughput,
                "concurrency_ratio": kv_stop.max_concurrency / prev.max_concurrency,
            },
            category="kv_capacity",
            max_concurrency=kv_stop.max_concurrency,
            formula="concurrency ratio = c_i / c_i-1",
        ),
        _finding(
            "evidence",
            f"At concurrency {kv_stop.max_concurrency} only about {_n(kv_stop.running_decodes)} requests decode at "
            f"once (Little's law) and TTFT is {_n(kv_stop.mean_ttft_ms)} ms: the rest queue for KV cache.",
            {
                "max_concurrency": kv_stop.max_concurrency,
                "running_decodes": kv_stop.running_decodes,
                "mean_ttft_ms": kv_stop.mean_ttft_ms,
            },
            category="kv_capacity",
            max_concurrency=kv_stop.max_concurrency,
            formula="running decodes = min(output tok/s x mean TPOT, concurrency)",
        ),
    ]


def host_overhead(f: Facts) -> Rule:
    """The host overhead at the lowest level (concurrency <= HOST_LEVEL_MAX) is at least half its TPOT (evidence), and at least the GPU work of a
    step at R (the verdict)."""
    low, host_ms = f.low, f.host_ms
    if low is None or host_ms is None or not host_ms >= 0.5 * low.mean_tpot_ms:
        return Rule("host_overhead")
    line = _finding(
        "evidence",
        f"At concurrency {low.max_concurrency}, TPOT is {_n(low.mean_tpot_ms, 1)} ms, "
        f"{_n(low.tpot_over_floor, 1)}x the {_n(low.bandwidth_floor_ms, 1)} ms bandwidth floor and "
        f"{_n(host_ms, 1)} ms more than the {_n(f.low_gpu_ms, 1)} ms of GPU work estimated for it: that much of "
        "every step is host overhead (scheduling, kernel launches), which larger batches hide behind GPU work.",
        {
            "max_concurrency": low.max_concurrency,
            "mean_tpot_ms": low.mean_tpot_ms,
            "tpot_over_floor": low.tpot_over_floor,
            "bandwidth_floor_ms": low.bandwidth_floor_ms,
            "host_overhead_ms": host_ms,
            "gpu_estimate_ms": f.low_gpu_ms,
        },
        category="host_overhead",
        max_concurrency=low.max_concurrency,
        formula="host overhead = TPOT - the sum of the estimated GPU components at that level",
    )
    return Rule("host_overhead", [line], decides=host_ms >= f.gpu_ms)


def prefill_interference(f: Facts) -> Rule:
    """TPOT at R is at least 2x the decode step, and exceeds it by more than the step exceeds its bandwidth floor."""
    if not f.inflation >= 2.0:
        return Rule("prefill_interference")
    extra = [*([f.power_line] if f.power_line is not None else []), f.comp_line]
    return Rule("prefill_interference", [f.prefill_line], decides=f.inflation > f.distance, extra=extra)


def small_batch_expert_gemm(f: Facts) -> Rule:
    """Expert GEMMs are the largest part of the decode step and memory-bound or below 25% of peak."""
    return _component_rule(f, "small_batch_expert_gemm")


def compute(f: Facts) -> Rule:
    """The largest part of the decode step is compute-bound: expert GEMMs at >= 25% of peak above the ridge point,
    or dense GEMMs above it."""
    return _component_rule(f, "compute")


def memory_bandwidth(f: Facts) -> Rule:
    """The largest part of the decode step reads memory (attention and KV, dense GEMMs below the ridge point); its
    evidence adds low-concurrency decode within 2x of its bandwidth floor."""
    rule = _component_rule(f, "memory_bandwidth")
    low, host_ms = f.low, f.host_ms
    if low is None or host_ms is None or host_ms >= 0.5 * low.mean_tpot_ms or not low.tpot_over_floor <= 2.0:
        return rule
    rule.lines.append(
        _finding(
            "evidence",
            f"At concurrency {low.max_concurrency}, TPOT is {_n(low.mean_tpot_ms, 1)} ms, only "
            f"{_n(low.tpot_over_floor, 2)}x the {_n(low.bandwidth_floor_ms, 1)} ms it takes to read "
            f"{_n(low.step_bytes_gb, 1)} GB per GPU at {_n(f.hw.memory_bandwidth_gbs)} GB/s: "
            "low-concurrency decode is bound by memory bandwidth.",
            {
                "max_concurrency": low.max_concurrency,
                "mean_tpot_ms": low.mean_tpot_ms,
                "tpot_over_floor": low.tpot_over_floor,
                "bandwidth_floor_ms": low.bandwidth_floor_ms,
                "step_bytes_gb": low.step_bytes_gb,
                "memory_bandwidth_gbs": f.hw.memory_bandwidth_gbs,
            },
            category="memory_bandwidth",
            max_concurrency=low.max_concurrency,
            formula="floor = bytes per decode step / peak bandwidth",
        )
    )
    return rule


def communication(f: Facts) -> Rule:
    """Communication (all-reduces, the EP all-to-all, PP sends) is the largest part of the decode step."""
    return _component_rule(f, "communication")


# The order the verdict is decided in: the first rule that decides gives it (exactly one component rule does).
RULES: tuple[Callable[[Facts], Rule], ...] = (
    kv_capacity,
    host_overhead,
    prefill_interference,
    small_batch_expert_gemm,
    compute,
    memory_bandwidth,
    communication,
)


def _decide(
    roof: Roofline,
    rows: list[LevelRoofline],
    ref: LevelRoofline,
    stops: LevelRoofline | None,
    failed_levels: list[m.BenchLevel],
    profile: m.ProfileSummary | None,
    hw: HardwareProfile,
) -> tuple[m.BottleneckCategory, list[m.Finding], list[m.Finding]]:
    """The dominant bottleneck with its evidence lines, and secondary findings (see the package docstring)."""
    f = _facts(roof, rows, ref, failed_levels, profile, hw)
    evidence: dict[str, list[m.Finding]] = {k: [] for k in m.BOTTLENECK_TITLES}
    category: m.BottleneckCategory | None = None
    for rule in RULES:
        answer = rule(f)
        evidence[answer.category] = answer.lines
        if category is None and answer.decides:
            category = answer.category
            evidence[category] = answer.lines + answer.extra
    if category is None:  # not reached: one component rule always decides
        category = _component_category(f)
    return category, *_verdict_lines(f, evidence, category)


def _verdict_lines(
    f: Facts, evidence: dict[str, list[m.Finding]], category: m.BottleneckCategory
) -> tuple[list[m.Finding], list[m.Finding]]:
    """The chosen category's evidence, and every other line once, as secondary findings."""
    chosen = evidence[category]
    if not chosen:  # nothing specific: the component line carries it
        chosen = [f.comp_line]
    chosen = [line.model_copy(update={"category": category}) for line in chosen]
    seen = {line.text for line in chosen}
    secondary: list[m.Finding] = []
    for key, lines in evidence.items():
        if key == category:
            continue
        for line in lines:
            if line.text not in seen:
                seen.add(line.text)
                secondary.append(line.model_copy(update={"kind": "evidence", "severity": "info"}))
    if f.prefill_line.text not in seen and f.inflation >= 1.5:
        secondary.append(f.prefill_line)
    if f.comp_line.text not in seen:
        secondary.append(f.comp_line.model_copy(update={"category": None}))
    power = f.power_line
    if power is not None and power.text not in seen and all(power.text != line.text for line in secondary):
        secondary.append(power)
    return chosen, secondary
