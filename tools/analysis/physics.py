"""Measurements against physics: a level that no hardware of the profile could serve means the profile does not
describe what was served, so nothing is concluded from it; without a roofline (a CPU, a GPU whose peaks pivot does
not know) the analysis is the measurements alone, and it names what is not known.

Three contradictions are checked, each with slack for what the floor and roofs leave out:
- TPOT under the bandwidth floor: a decode step cannot read its weights and KV faster than the peak bandwidth, so a
  mean TPOT below FLOOR_SLACK x the floor says the bytes per step (the model profile) or the bandwidth (the hardware
  profile) are not those of the server;
- throughput over the compute roof: every token costs at least 2 FLOP per active parameter, so more tokens per
  second (input and output) than ROOF_SLACK x what the target's GPUs can do at peak says the same;
- more KV tokens held than memory holds: the running requests' contexts in KV bytes against every GPU's memory less
  the weights.
"""

from __future__ import annotations

from agent import models as m
from tools.analysis.common import GIB, _finding, _n
from tools.analysis.results import LevelRoofline
from tools.analysis.roofline import Roofline
from tools.profiles import HardwareProfile, ModelProfile

FLOOR_SLACK = 0.8  # the floor is a bound at peak bandwidth; measurement jitter gets 20%
ROOF_SLACK = 1.2
KV_SLACK = 1.2


def contradictions(
    rows: list[LevelRoofline], roof: Roofline, model: ModelProfile, hw: HardwareProfile, gpus: int
) -> list[m.Finding]:
    """The levels the profiles cannot explain, one finding per kind of contradiction (its worst level)."""
    out: list[m.Finding] = []
    names = f"model profile {model.name} on {gpus}x {hw.name}"
    under = [r for r in rows if r.bandwidth_floor_ms > 0 and 0 < r.mean_tpot_ms < FLOOR_SLACK * r.bandwidth_floor_ms]
    if under:
        r = min(under, key=lambda x: x.mean_tpot_ms / x.bandwidth_floor_ms)
        out.append(
            _finding(
                "note",
                f"The profiles do not describe what was served: at concurrency {r.max_concurrency} TPOT was "
                f"{_n(r.mean_tpot_ms, 2)} ms, faster than any decode step of {names} can be (reading "
                f"{_n(r.step_bytes_gb, 2)} GB per GPU at {_n(roof.bw / 1e9)} GB/s takes "
                f"{_n(r.bandwidth_floor_ms, 2)} ms). No bottleneck is concluded from them.",
                {
                    "max_concurrency": r.max_concurrency,
                    "mean_tpot_ms": r.mean_tpot_ms,
                    "bandwidth_floor_ms": r.bandwidth_floor_ms,
                    "step_bytes_gb": r.step_bytes_gb,
                },
                max_concurrency=r.max_concurrency,
                severity="warning",
                formula=f"contradiction: TPOT < {FLOOR_SLACK} x (bytes per decode step / peak bandwidth)",
            )
        )
    flop_per_token = 2 * model.active_params
    dtype = roof.expert_dtype if roof.moe else roof.dense_dtype
    roof_tok_s = gpus * hw.peak_tflops(dtype) * 1e12 / flop_per_token if flop_per_token > 0 else 0.0
    over = [r for r in rows if roof_tok_s > 0 and r.total_throughput > ROOF_SLACK * roof_tok_s]
    if over:
        r = max(over, key=lambda x: x.total_throughput)
        out.append(
            _finding(
                "note",
                f"The profiles do not describe what was served: at concurrency {r.max_concurrency} the server "
                f"processed {_n(r.total_throughput)} tok/s, more than the {_n(roof_tok_s)} tok/s {names} can compute "
                f"at peak ({_n(flop_per_token / 1e9, 2)} GFLOP per token, {_n(hw.peak_tflops(dtype))} TFLOPS per "
                "GPU). No bottleneck is concluded from them.",
                {
                    "max_concurrency": r.max_concurrency,
                    "total_throughput": r.total_throughput,
                    "compute_roof_tok_s": roof_tok_s,
                },
                max_concurrency=r.max_concurrency,
                severity="warning",
                formula=f"contradiction: (input + output) tok/s > {ROOF_SLACK} x GPUs x peak / (2 x active params)",
            )
        )
    weights_gib, _ = roof.kv_pool_tokens(1.0)
    room = max(gpus * hw.memory_gib - weights_gib * roof.tp * roof.pp, 0.0) * GIB
    kv_per_token = model.kv_bytes(roof.kv_dtype)
    held = [(r, r.running_decodes * r.context_tokens) for r in rows]
    full = [(r, t) for r, t in held if kv_per_token > 0 and t * kv_per_token > KV_SLACK * room]
    if full:
        r, tokens = max(full, key=lambda x: x[1])
        out.append(
            _finding(
                "note",
                f"The profiles do not describe what was served: at concurrency {r.max_concurrency} about "
                f"{_n(r.running_decodes)} requests of {_n(r.context_tokens)} tokens decoded at once, "
                f"{_n(tokens * kv_per_token / GIB, 1)} GiB of KV cache, more than the {_n(room / GIB, 1)} GiB "
                f"{names} has beside the weights. No bottleneck is concluded from them.",
                {"max_concurrency": r.max_concurrency, "kv_tokens": tokens, "kv_room_gib": room / GIB},
                max_concurrency=r.max_concurrency,
                severity="warning",
                formula="contradiction: running decodes x context x KV bytes per token > GPUs x memory - weights",
            )
        )
    return out


def measured_level(level: m.BenchLevel, telemetry: m.Telemetry | None, kv: float | None) -> m.Finding:
    """One level as measured, with no roofline figure: throughput, the requests decoding at once, TTFT, TPOT, KV
    use and power where they were read."""
    c = int(level.max_concurrency or 0)
    tpot = level.mean_tpot_ms if level.mean_tpot_ms > 0 else (level.mean_itl_ms or 0.0)
    batch = min(level.output_throughput * tpot / 1000, float(c)) if tpot > 0 else float(c)
    values: dict[str, float] = {
        "max_concurrency": c,
        "output_throughput": level.output_throughput,
        "total_throughput": level.total_throughput,
        "running_decodes": max(batch, 1.0),
        "mean_ttft_ms": level.mean_ttft_ms,
        "mean_tpot_ms": tpot,
    }
    extra = ""
    if kv is not None:
        values["kv_usage_pct"] = 100 * kv
        extra += f"; KV cache {_n(100 * kv)}% used"
    watts = [g.power_w_mean for g in (telemetry.gpus if telemetry else []) if g.power_w_mean is not None]
    if watts:
        values["power_w_mean"] = sum(watts) / len(watts)
        extra += f"; {_n(values['power_w_mean'])} W per GPU"
    return _finding(
        "level",
        f"Concurrency {c}: {_n(level.output_throughput)} output tok/s with about {_n(values['running_decodes'])} "
        f"requests decoding at once, TTFT {_n(level.mean_ttft_ms, 1)} ms, TPOT {_n(tpot, 2)} ms{extra} (measured).",
        values,
        max_concurrency=c,
        formula="running decodes = min(output tok/s x TPOT, concurrency) (Little's law)",
    )


def no_roofline_note(hw: HardwareProfile, model: ModelProfile) -> m.Finding:
    """What the analysis cannot do for this hardware, and why."""
    unknown = ", ".join(x for x in hw.unknown() if x != "the twin's calibration") or "its peaks"
    return _finding(
        "note",
        f"No roofline for {hw.title}: {unknown} {'is' if ',' not in unknown else 'are'} not known, so no bandwidth "
        f"floor, compute roof or bottleneck category is drawn for {model.title}; the levels are measurements only.",
        {"memory_gib": hw.memory_gib},
        severity="info",
    )


def no_verdict(text: str) -> m.Finding:
    """The analysis's verdict line when it names no bottleneck (no roofline, or profiles contradicted)."""
    return _finding("bottleneck", text, {}, formula="no bottleneck named: see the notes")
