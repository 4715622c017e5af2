"""Roofline and bottleneck analysis of an experiment's sweep; its findings are written to the ledger.

Inputs: the experiment's benchmark levels and telemetry (ledger rows), the target's model and hardware
profiles (tools/profiles), GEMM micro-benchmarks when recorded, and a profile breakdown when one is given.
Output: an `Analysis`, and `Finding` rows that replace the experiment's previous ones, so the reports
(agent/reports.py) render them without importing anything from here.

Formulas, per GPU, named in the findings that use them (B: requests decoding at once, c: the level's
concurrency, k experts per token out of E, tp/pp/ep the parallel sizes read from the experiment's flags):

  running decodes          B = min(output tok/s x mean TPOT, c)                      (Little's law)
  context per request      ctx = mean prompt + mean output / 2
  rows per expert          c x k / E (every request of the level in one decode batch; the seeds' count); the GEMM
                           of an expert that is hit sees m = c x k / E_hit(c) rows, E_hit(c) = E (1 - (1 - k/E)^c)
  expert width on one GPU  n = expert_ffn / tp under TP (every GPU holds every expert at 1/tp of its width),
                           expert_ffn under EP (whole experts, E / ep of them per GPU)
  GEMM arithmetic intensity  AI = 2 m W / (W b_w + m a), W = 3 x hidden x n weights of one expert on one GPU,
                           a = activation bytes per row in and out of the three projections; for a dense model
                           M = c rows through a hidden x hidden/tp GEMM: AI = 2 M K N / (K N b_w + M K b_a + 2 M N)
  ridge point              peak TFLOPS of the weight dtype / memory bandwidth (FLOP/byte); AI below it: memory-bound
  roofline                 min(peak, AI x bandwidth)
  achieved TFLOPS          the nearest recorded micro-benchmark (same device and dtype, FP8 for FP4 weights on a GPU
                           without FP4 units; rows within 2x, width within 4x; `pivot microbench`), else the
                           hardware profile's GEMM-efficiency fit, as the twin models a GEMM: the lower of
                           peak x eff_max x m/(m + m_half) x n/(n + n_half) and 2 m / b_w x BW_gemm(n), the rate its
                           weights stream at (bandwidth x gemm_bandwidth_efficiency x n/(n + gemm_bandwidth_n_half))
  bytes per decode step    expert weights touched (E_hit = E (1 - (1 - k/E)^B) experts per MoE layer) + dense
                           weights + B x ctx x KV bytes per token, per GPU, times pp (the stages run in turn)
  bandwidth floor          bytes per decode step / peak memory bandwidth; each level's TPOT is compared with it
  decode step (measured)   B / peak output tok/s (a stretch of decode-only steps), at most TPOT
  component estimates      expert GEMMs, dense GEMMs: max(bytes / bandwidth, FLOPs / achieved); attention: KV bytes
                           / bandwidth; communication: 2 all-reduces per layer of B x hidden x 2 bytes,
                           latency + 2 (tp-1)/tp x payload / link bandwidth each, plus the EP all-to-all and PP sends
  host overhead            TPOT at concurrency <= 2 minus the GPU estimate there (a fixed cost per step)
  scaling exponent         ln(out_i / out_i-1) / ln(c_i / c_i-1): 1 is linear, below 0.2 throughput has stopped growing
  power share              mean GPU power / the enforced power limit

The dominant bottleneck, decided in this order at the level with the best output tok/s (R):
  1. kv_capacity: throughput stopped scaling (exponent < 0.2) at a level whose KV pool was >= 90% full, or
     requests failed for lack of memory;
  2. host_overhead: the host overhead measured at low concurrency is at least the GPU work of a step at R;
  3. prefill_interference: TPOT at R is at least 2x the decode step and exceeds it by a larger factor than
     the decode step exceeds its bandwidth floor (decode itself is closer to its floor than tokens are to it);
  4. otherwise the largest component of the decode step at R (the profile's when one was given, else the
     estimates): expert GEMMs -> small_batch_expert_gemm when memory-bound or below 25% of peak, else compute;
     dense GEMMs -> compute above the ridge point, memory_bandwidth below; attention/KV -> memory_bandwidth;
     communication -> communication.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agent import models as m
from agent.errors import PivotError
from agent.session import Engine, load_engine
from agent.store import Store
from tools.profiles import DTYPE_BYTES, HardwareProfile, ModelProfile, load_hardware, model_for

GB = 1e9
GIB = float(1 << 30)
STOPPED_EXPONENT = 0.2
SUBLINEAR_EXPONENT = 0.8
KV_FULL = 0.9
LOW_POWER_SHARE = 0.5
SMALL_GEMM_SHARE_OF_PEAK = 0.25
ACTIVATION_BYTES = {"nvfp4": 0.5625, "fp4": 0.5, "fp8": 1.0}  # W4A4 / W8A8 quantize activations too; else bf16


class SessionLike(Protocol):
    """What the analysis needs of a session: its ledger and its id (agent.session.Session has both)."""

    store: Store

    @property
    def id(self) -> str: ...


# --------------------------------------------------------------------------------------------------
# Results.


class LevelRoofline(BaseModel):
    """One concurrency level of one experiment, against the roofline of its GPUs."""

    model_config = ConfigDict(extra="forbid")

    max_concurrency: int
    completed: int
    failed: int
    output_throughput: float
    total_throughput: float
    max_output_tokens_per_s: float
    mean_ttft_ms: float
    mean_tpot_ms: float
    running_decodes: float = Field(description="min(output tok/s x mean TPOT, concurrency).")
    context_tokens: float = Field(description="Mean prompt + half the mean output.")
    rows_per_expert: float | None = Field(default=None, description="running decodes x k / E; None for a dense model.")
    gemm_m: float = Field(
        description="Rows of the analysed GEMM: rows per expert hit (MoE) or running decodes (dense)."
    )
    gemm_n: float = Field(description="Its width on one GPU.")
    gemm_k: float
    arithmetic_intensity_flop_per_byte: float
    ridge_flop_per_byte: float
    gemm_bound: Literal["memory", "compute"]
    peak_tflops: float
    roofline_tflops: float
    achieved_tflops: float = Field(description="The estimate's GEMM FLOPs per GPU per step / its GEMM time.")
    gemm_tflop: float = Field(default=0.0, description="FLOPs of the analysed GEMMs per GPU per decode step, in TFLOP.")
    achieved_source: str
    share_of_peak_pct: float
    share_of_roofline_pct: float
    step_bytes_gb: float = Field(description="Bytes one GPU reads in one decode step at running_decodes.")
    bandwidth_floor_ms: float
    tpot_over_floor: float
    decode_step_ms: float = Field(description="running_decodes / peak output tok/s, at most TPOT.")
    estimate_ms: dict[str, float] = Field(default_factory=dict, description="Decode-step components, estimated.")
    power_w_mean: float | None = None
    power_limit_w: float | None = None
    power_share_pct: float | None = None
    util_pct: float | None = None
    kv_usage_pct: float | None = None
    scaling_exponent: float | None = Field(default=None, description="Versus the previous level.")


class Analysis(BaseModel):
    """What an experiment's sweep shows: the levels against the roofline, the dominant bottleneck and why."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    experiment_id: int
    model_profile: str
    hardware: str
    gpus: int
    tp: int
    pp: int
    ep: int
    dense: bool
    source: str = Field(description="Where the numbers came from: measured, simulated or imported.")
    levels: list[LevelRoofline] = []
    reference_concurrency: int | None = Field(default=None, description="The level with the best output tok/s.")
    stops_scaling_at: int | None = None
    bottleneck: m.BottleneckCategory | None = None
    summary: str = ""
    evidence: list[m.Finding] = Field(default_factory=list, description="The lines that support the verdict.")
    secondary: list[m.Finding] = Field(default_factory=list, description="Other findings worth acting on.")
    findings: list[m.Finding] = Field(default_factory=list, description="Everything written to the ledger.")


# --------------------------------------------------------------------------------------------------
# Small helpers.


def _n(value: float, decimals: int = 0) -> str:
    """A number as the findings print it (thousands separators, fixed decimals)."""
    return f"{value:,.{decimals}f}"


def _rows(value: float) -> str:
    """Rows per expert: two decimals below 1, one below 10, whole numbers above."""
    return _n(value, 2 if value < 1 else 1 if value < 10 else 0)


def flag_value(config: m.ServerConfig, *names_: str) -> str | None:
    """The value of the last of these spellings set in `config`, as typed."""
    found = None
    for flag in config.flags:
        if flag.name in names_ and flag.value is not None:
            found = flag.value if isinstance(flag.value, str) else flag.value[0]
    return found


def layout(config: m.ServerConfig, server_info: dict | None = None, *, engine: Engine | None) -> dict[str, int]:
    """tp, pp and ep as the engine reads its flags (Engine.parallelism), else the server's own report, else 1.

    Without an engine (its plugin is not installed here) only the server's report is read."""
    degrees = asdict(engine.parallelism(config)) if engine is not None else {}
    out = {}
    for key in ("tp", "pp", "ep"):
        value: object = degrees.get(key, 1)
        if value == 1 and server_info:
            value = server_info.get(f"{key}_size") or (server_info.get("resolved") or {}).get(f"{key}_size") or 1
        try:
            out[key] = max(int(value), 1)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            out[key] = 1
    return out


def session_engine(record: m.Session) -> Engine | None:
    """The session's engine, built from its name and options, for what only the engine knows (how its flags split
    the model); None when it cannot be built here (its plugin is not installed, or its options are refused)."""
    try:
        return load_engine(record.engine, **record.settings.engine_options)
    except PivotError:
        return None


def _plan_engine(target: m.Target) -> Engine | None:
    """The engine a plan names, with default options, for how its flags split the model; None when it cannot be
    built here."""
    try:
        return load_engine(target.engine)
    except PivotError:
        return None


def _model_profile(target: m.Target) -> ModelProfile:
    return model_for(target.model_profile, target.model)


# --------------------------------------------------------------------------------------------------
# The roofline of one model on one GPU type with one layout.


class Roofline:
    """Bytes, FLOPs and times of one decode step, per GPU, from the profiles (no measurement in here)."""

    def __init__(
        self,
        model: ModelProfile,
        hw: HardwareProfile,
        tp: int,
        pp: int,
        ep: int,
        kv_dtype: str | None,
        microbench: list[m.MicrobenchResult] | None = None,
    ) -> None:
        self.model, self.hw, self.tp, self.pp, self.ep = model, hw, tp, pp, ep
        self.kv_dtype = kv_dtype or "auto"
        self.bw = hw.memory_bandwidth_gbs * GB
        self.link = hw.interconnect.bandwidth_gbs * GB
        self.lat = hw.interconnect.latency_us * 1e-6
        experts = model.part("experts")
        self.moe = model.kind == "moe" and bool(experts) and model.experts > 0
        self.expert_dtype = experts[0].dtype if experts else "bf16"
        self.expert_bytes_total = sum(p.params * p.bytes_per_param for p in experts)
        self.bytes_per_expert = self.expert_bytes_total / max(model.moe_layers * model.experts, 1)
        self.dense_parts = model.part("dense")
        self.dense_dtype = max(self.dense_parts, key=lambda p: p.params).dtype if self.dense_parts else "bf16"
        self.microbench = microbench or []

    # ---- shapes and intensity

    @property
    def expert_shard(self) -> int:
        return self.ep if self.ep > 1 else self.tp

    @property
    def expert_width(self) -> float:
        return self.model.expert_ffn if self.ep > 1 else self.model.expert_ffn / self.tp

    def rows_per_expert(self, rows: float) -> float:
        return rows * self.model.experts_per_token / self.model.experts

    def rows_per_hit_expert(self, rows: float) -> float:
        """Rows of each expert that gets any: at low concurrency most experts get none and the rest one or two."""
        hit = self.experts_hit(rows)
        return rows * self.model.experts_per_token / hit if hit else 0.0

    def experts_hit(self, rows: float) -> float:
        e, k = self.model.experts, self.model.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** rows) if rows > 0 else 0.0

    def expert_intensity(self, m_rows: float) -> float:
        """FLOP per byte of one expert's three projections on one GPU at m rows (weights plus activations)."""
        h, n = self.model.hidden_size, self.expert_width
        w = 3 * h * n
        b_w = DTYPE_BYTES[self.expert_dtype]
        b_a = ACTIVATION_BYTES.get(self.expert_dtype, 2.0)
        per_row = h * b_a + 2 * n * 2 + n * b_a + h * 2  # gate/up in, gate/up out (bf16), down in, down out (bf16)
        return 2 * m_rows * w / (w * b_w + m_rows * per_row)

    def dense_shape(self, rows: float) -> tuple[float, float, float]:
        k = self.model.hidden_size
        return rows, k / self.tp, k

    def dense_intensity(self, rows: float) -> float:
        m_, n, k = self.dense_shape(rows)
        b_w = DTYPE_BYTES[self.dense_dtype]
        b_a = ACTIVATION_BYTES.get(self.dense_dtype, 2.0)
        return 2 * m_ * k * n / (k * n * b_w + m_ * k * b_a + 2 * m_ * n)

    def ridge(self, dtype: str) -> float:
        return self.hw.peak_tflops(dtype) * 1e12 / self.bw

    # ---- achieved GEMM throughput

    def fit_tflops(self, dtype: str, m_rows: float, n: float) -> float:
        """The twin's GEMM model (tools/engines/sim/costmodel.py) as TFLOPS: the lower of the compute side,
        peak x eff(m, n), and the memory side, 2 m / weight bytes per parameter x BW_gemm(n)."""
        cal = self.hw.calibration
        compute = self.hw.peak_tflops(dtype) * cal.gemm_efficiency(m_rows, n)
        weight_bw = self.hw.memory_bandwidth_gbs * GB * cal.gemm_stream_efficiency(n)
        return min(compute, 2 * m_rows / DTYPE_BYTES.get(dtype, 2.0) * weight_bw / 1e12)

    def achieved_tflops(self, dtype: str, m_rows: float, n: float) -> tuple[float, str]:
        """Achieved TFLOPS of a GEMM with m rows and width n: a micro-benchmark when one is close, else the fit.

        Close: same dtype (FP8 ones stand in for FP4 weights on a GPU without FP4 units, which run them at the FP8
        rate), rows within 2x and width within 4x; the nearest in rows and width wins, the faster on a tie.
        """
        measured = dtype
        if dtype in ("nvfp4", "fp4") and "fp4" not in self.hw.dense_tflops:
            measured = "fp8"
        close = [
            r
            for r in self.microbench
            if r.dtype == measured
            and r.m > 0
            and m_rows > 0
            and 0.5 <= (r.rows_per_expert or r.m) / m_rows <= 2
            and (n <= 0 or 0.25 <= r.n / n <= 4)
        ]
        if close:

            def distance(r: m.MicrobenchResult) -> tuple[float, float]:
                d = abs(math.log((r.rows_per_expert or r.m) / m_rows)) + (abs(math.log(r.n / n)) if n > 0 else 0.0)
                return (round(d, 9), -r.tflops)

            best = min(close, key=distance)
            what = best.backend or best.dtype
            if measured != dtype:
                what += f"; {measured} standing in for {dtype}"
            return best.tflops, f"micro-benchmark #{best.id} ({best.m}x{best.n}x{best.k}, {what})"
        return self.fit_tflops(dtype, m_rows, n), "hardware profile's GEMM-efficiency fit"

    # ---- one decode step at B running requests

    def kv_bytes_per_token(self) -> float:
        shard = 1 if self.model.kv_replicated_across_tp else self.tp
        return self.model.kv_bytes(self.kv_dtype) / (shard * self.pp)

    def step(self, batch: float, ctx: float) -> dict[str, float]:
        """Bytes (per stage), FLOPs and component times (whole step, seconds) of one decode step."""
        model, pp = self.model, self.pp
        out: dict[str, float] = {}
        exp_bytes = exp_flops = t_exp = 0.0
        if self.moe and batch > 0:
            shard = self.expert_shard
            exp_bytes = (model.moe_layers / pp) * self.experts_hit(batch) * self.bytes_per_expert / shard
            exp_flops = batch * model.experts_per_token * 2 * model.expert_params * (model.moe_layers / pp) / shard
            hit = self.experts_hit(batch)
            m_rows = batch * model.experts_per_token / hit if hit else 0.0
            tflops, _ = self.achieved_tflops(self.expert_dtype, m_rows, self.expert_width)
            t_exp = max(exp_bytes / self.bw, exp_flops / (tflops * 1e12)) if tflops > 0 else exp_bytes / self.bw
        dense_bytes = dense_flops = t_dense = 0.0
        for p in self.dense_parts:
            shard = 1 if p.replicated else self.tp
            b = p.params * p.bytes_per_param / (shard * pp)
            f = batch * 2 * p.params / (shard * pp)
            tflops, _ = self.achieved_tflops(p.dtype, max(batch, 1e-9), model.hidden_size / shard)
            dense_bytes += b
            dense_flops += f
            t_dense += max(b / self.bw, f / (tflops * 1e12)) if batch > 0 else 0.0
        kv_bytes = batch * ctx * self.kv_bytes_per_token()
        attn_flops = batch * ctx * model.attention_flops_per_ctx_token / (self.tp * pp)
        t_attn = max(kv_bytes / self.bw, attn_flops / (self.hw.peak_tflops("bf16") * 1e12))
        t_comm = 0.0
        if self.tp > 1:
            payload = batch * model.hidden_size * 2
            t_comm += (model.layers / pp) * 2 * (self.lat + 2 * (self.tp - 1) / self.tp * payload / self.link)
        if self.ep > 1 and self.moe:
            payload = batch * model.experts_per_token * model.hidden_size
            t_comm += (model.moe_layers / pp) * 2 * (self.lat + (self.ep - 1) / self.ep * payload / self.link)
        out["expert_bytes"], out["dense_bytes"], out["kv_bytes"] = exp_bytes, dense_bytes, kv_bytes
        out["bytes"] = exp_bytes + dense_bytes + kv_bytes
        out["expert_flops"], out["dense_flops"], out["attention_flops"] = exp_flops, dense_flops, attn_flops
        out["expert_gemm_s"] = pp * t_exp
        out["dense_gemm_s"] = pp * t_dense
        out["attention_s"] = pp * t_attn
        out["communication_s"] = pp * t_comm + (pp - 1) * (self.lat + batch * model.hidden_size * 2 / self.link)
        out["gpu_s"] = out["expert_gemm_s"] + out["dense_gemm_s"] + out["attention_s"] + out["communication_s"]
        out["floor_s"] = pp * out["bytes"] / self.bw
        return out

    def kv_pool_tokens(self, mem_fraction: float) -> tuple[float, float]:
        """(weights GiB per GPU, KV pool tokens) at a --mem-fraction-static, as SGLang sizes the pool."""
        model, tp, pp = self.model, self.tp, self.pp
        weights = self.expert_bytes_total / (tp * pp) if self.moe else 0.0
        for p in model.parts:
            if p.kind == "experts":
                continue
            weights += p.params * p.bytes_per_param / ((1 if p.replicated else tp) * pp)
        pool = self.hw.memory_gib * mem_fraction * GIB - weights
        return weights / GIB, max(pool, 0.0) / self.kv_bytes_per_token()


COMPONENT_TITLES = {
    "expert_gemm": "expert GEMMs",
    "dense_gemm": "dense GEMMs",
    "attention": "attention and KV reads",
    "communication": "communication",
    "other": "other kernels",
}
# ProfileSummary categories (tools/profile.py) onto the estimate's components.
_PROFILE_COMPONENTS = {
    "expert_gemm": "expert_gemm",
    "other_gemm": "dense_gemm",
    "attention": "attention",
    "communication": "communication",
    "other": "other",
}


# --------------------------------------------------------------------------------------------------
# Reading the ledger.


def _kv_usage(level: m.BenchLevel, telemetry: m.Telemetry | None) -> float | None:
    extra = level.model_extra or {}
    for key in ("max_token_usage", "token_usage"):
        if isinstance(extra.get(key), int | float):
            return float(extra[key])
    if telemetry is not None:
        for key in ("token_usage_max", "sglang:token_usage", "token_usage", "token_usage_mean"):
            if key in telemetry.server_metrics:
                return float(telemetry.server_metrics[key])
    return None


def _power(telemetry: m.Telemetry | None, hw: HardwareProfile) -> tuple[float | None, float | None, float | None]:
    """(mean power per GPU, the power limit, mean utilization) over the level's GPUs."""
    if telemetry is None:
        return None, None, None
    watts = [g.power_w_mean for g in telemetry.gpus if g.power_w_mean is not None]
    limits = [g.power_limit_w for g in telemetry.gpus if g.power_limit_w]
    utils = [g.util_gpu_pct_mean for g in telemetry.gpus if g.util_gpu_pct_mean is not None]
    power = sum(watts) / len(watts) if watts else None
    limit = sum(limits) / len(limits) if limits else (hw.tdp_w if power is not None else None)
    util = sum(utils) / len(utils) if utils else None
    return power, limit, util


def _server_info(levels: list[m.BenchLevel]) -> dict | None:
    for level in levels:
        info = (level.model_extra or {}).get("server_info")
        if isinstance(info, dict):
            return info
    return None


def _levels(store: Store, experiment_id: int) -> tuple[list[m.BenchLevel], str]:
    """The experiment's levels (each concurrency's mean over the runs, as the reports show it) and their source."""
    by_c: dict[int, list[m.BenchLevel]] = {}
    source = "measured"
    for result in store.bench_results(experiment_id):
        source = result.source
        for level in result.levels:
            if level.max_concurrency is not None:
                by_c.setdefault(level.max_concurrency, []).append(level)
    return [m.BenchLevel.mean(by_c[c]) for c in sorted(by_c)], source


def _telemetry_by_level(store: Store, experiment_id: int) -> dict[int, m.Telemetry]:
    out = {}
    for t in store.telemetry(experiment_id):
        if t.max_concurrency is not None and t.gpus:
            out[t.max_concurrency] = t
    return out


# --------------------------------------------------------------------------------------------------
# The analysis.


def _finding(kind: str, text: str, values: dict[str, float], **kw) -> m.Finding:
    return m.Finding(kind=kind, text=text, values={k: float(v) for k, v in values.items()}, **kw)


def analyze(
    session: SessionLike,
    experiment_id: int | None = None,
    *,
    profile: m.ProfileSummary | None = None,
) -> Analysis:
    """Analyse one experiment (default: the one with the best output tok/s) and record its findings.

    The experiment's previous findings are replaced. `profile` (from tools/profile.py) gives the measured
    split of GPU time; without it, a profile recorded by an earlier analysis of the same experiment is reused.
    """
    store, session_id = session.store, session.id
    record = store.get_session(session_id)
    if experiment_id is None:
        experiment_id = best_experiment(store, session_id)
        if experiment_id is None:
            raise PivotError(f"session {session_id} has no benchmark results to analyse")
    experiment = store.get_experiment(experiment_id)
    if experiment.session_id != session_id:
        raise PivotError(f"experiment {experiment_id} belongs to session {experiment.session_id}, not {session_id}")
    target = record.plan.target
    model = _model_profile(target)
    hw = load_hardware(target.hardware)
    levels, source = _levels(store, experiment_id)
    lay = layout(experiment.config, _server_info(levels), engine=session_engine(record))
    kv_dtype = flag_value(experiment.config, "--kv-cache-dtype")
    bench = [r for r in store.microbench_results() if r.device in (hw.name, hw.title)]
    roof = Roofline(model, hw, lay["tp"], lay["pp"], lay["ep"], kv_dtype, bench)
    telemetry = _telemetry_by_level(store, experiment_id)
    if profile is None:
        profile, profiled_on = _recorded_profile(store, session_id, experiment_id)
    else:
        profiled_on = experiment_id

    analysis = Analysis(
        session_id=session_id,
        experiment_id=experiment_id,
        model_profile=model.name,
        hardware=hw.name,
        gpus=target.gpus,
        tp=lay["tp"],
        pp=lay["pp"],
        ep=lay["ep"],
        dense=not roof.moe,
        source=source,
    )
    rows: list[LevelRoofline] = []
    for level in levels:
        if level.completed <= 0:
            continue
        rows.append(_level_roofline(level, telemetry.get(level.max_concurrency or 0), roof, hw, rows))
    analysis.levels = rows
    findings: list[m.Finding] = []
    findings += _notes(roof, model, lay)
    findings += [_level_finding(r, roof) for r in rows]
    failed_levels = [lv for lv in levels if lv.failed > 0]
    if not rows:
        text = "No level completed a request, so there is nothing to analyse."
        if failed_levels:
            errors = sorted({e for lv in failed_levels for e in lv.errors})
            text += " Errors: " + "; ".join(errors[:3]) + "."
        findings.append(_finding("note", text, {}, severity="warning"))
        analysis.findings = store.replace_findings(session_id, experiment_id, findings)
        analysis.summary = text
        return analysis

    ref = max(rows, key=lambda r: (r.output_throughput, -r.max_concurrency))
    analysis.reference_concurrency = ref.max_concurrency
    stops = next(
        (r for r in rows[1:] if (r.scaling_exponent is not None and r.scaling_exponent < STOPPED_EXPONENT)), None
    )
    analysis.stops_scaling_at = stops.max_concurrency if stops else None
    findings.append(_scaling_finding(rows, stops))
    if profile is not None:
        findings.append(_profile_finding(profile, ref, None if profiled_on == experiment_id else profiled_on))
    category, evidence, secondary = _decide(roof, rows, ref, stops, failed_levels, profile, hw)
    analysis.bottleneck = category
    title = m.BOTTLENECK_TITLES[category]
    where = f"at concurrency {ref.max_concurrency}"
    analysis.summary = f"The dominant bottleneck {where} is {title}: " + evidence[0].text
    verdict = _finding(
        "bottleneck",
        f"Dominant bottleneck: {title} ({where}, the level with the best output tok/s, "
        f"{_n(ref.output_throughput)} tok/s).",
        {"max_concurrency": ref.max_concurrency, "output_throughput": ref.output_throughput},
        category=category,
        max_concurrency=ref.max_concurrency,
        formula="decided in order: KV capacity, host overhead, prefill interference, then the largest part of "
        "the decode step (tools/analysis.py)",
    )
    findings += [verdict, *evidence, *secondary]
    analysis.findings = store.replace_findings(session_id, experiment_id, findings)
    saved = {id(f): s for f, s in zip(findings, analysis.findings, strict=True)}
    analysis.evidence = [saved[id(f)] for f in evidence]
    analysis.secondary = [saved[id(f)] for f in secondary]
    return analysis


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


def _profile_finding(profile: m.ProfileSummary, ref: LevelRoofline, elsewhere: int | None = None) -> m.Finding:
    parts = sorted(profile.categories.items(), key=lambda kv: -kv[1].share)
    text = (
        f"Profile ({profile.source}"
        + (f", on experiment {elsewhere}: the same configuration" if elsewhere is not None else "")
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


def _recorded_profile(store: Store, session_id: str, experiment_id: int) -> tuple[m.ProfileSummary | None, int | None]:
    """A profile an earlier analysis of this experiment recorded (its shares survive re-analysis); else the latest
    profile of another experiment with the same configuration and workload (a profile item measures the best
    configuration on a server of its own: that measurement is what the best configuration's root cause uses)."""
    found, on = _profile_of(store, session_id, experiment_id)
    if found is not None:
        return found, on or experiment_id
    this = store.get_experiment(experiment_id)
    for other in reversed(store.experiments(session_id)):
        if other.id != experiment_id and other.config == this.config and other.workload == this.workload:
            found, on = _profile_of(store, session_id, other.id or 0)
            if found is not None:
                return found, on or other.id
    return None, None


def same_config_analysed(store: Store, session_id: str, experiment_id: int) -> list[int]:
    """Other analysed experiments with the configuration and workload of `experiment_id` (their root cause should
    use a profile measured on it)."""
    this = store.get_experiment(experiment_id)
    analysed = {f.experiment_id for f in store.findings(session_id, kind="bottleneck")}
    return [
        e.id
        for e in store.experiments(session_id)
        if e.id is not None
        and e.id != experiment_id
        and e.id in analysed
        and e.config == this.config
        and e.workload == this.workload
    ]


def _profile_of(store: Store, session_id: str, experiment_id: int) -> tuple[m.ProfileSummary | None, int | None]:
    """The profile recorded with an experiment's analysis, and the experiment it was measured on."""
    for f in store.findings(session_id, experiment_id=experiment_id, kind="evidence"):
        shares = {
            k[len("profile_") : -len("_share_pct")]: v
            for k, v in f.values.items()
            if k.startswith("profile_") and k.endswith("_share_pct")
        }
        if shares:
            cats = {
                k: m.ProfileCategory(seconds=f.values.get(f"profile_{k}_s", 0.0), share=min(max(v / 100, 0.0), 1.0))
                for k, v in shares.items()
            }
            source = "simulated" if "(simulated" in f.text else "measured"
            on = f.values.get("profiled_experiment_id")
            summary = m.ProfileSummary(source=source, categories=cats, max_concurrency=f.max_concurrency)
            return summary, int(on) if on is not None else None
    return None, None


def _decide(
    roof: Roofline,
    rows: list[LevelRoofline],
    ref: LevelRoofline,
    stops: LevelRoofline | None,
    failed_levels: list[m.BenchLevel],
    profile: m.ProfileSummary | None,
    hw: HardwareProfile,
) -> tuple[m.BottleneckCategory, list[m.Finding], list[m.Finding]]:
    """The dominant bottleneck with its evidence lines, and secondary findings (see the module docstring)."""
    model = roof.model
    c = ref.max_concurrency
    evidence: dict[str, list[m.Finding]] = {k: [] for k in m.BOTTLENECK_TITLES}
    est = ref.estimate_ms
    gpu_ms = sum(est.values())

    # -- KV capacity
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
    oom = [lv for lv in failed_levels if any("memory" in e.lower() or "oom" in e.lower() for e in lv.errors)]
    if kv_stop is not None:
        prev = rows[rows.index(kv_stop) - 1]
        evidence["kv_capacity"].append(
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
            )
        )
        evidence["kv_capacity"].append(
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
            )
        )
    for lv in oom:
        evidence["kv_capacity"].append(
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

    # -- host overhead, from the lowest level
    low = rows[0] if rows[0].max_concurrency <= 2 else None
    host_ms = None
    if low is not None:
        low_gpu = sum(low.estimate_ms.values())
        host_ms = max(low.mean_tpot_ms - low_gpu, 0.0)
        line = _finding(
            "evidence",
            f"At concurrency {low.max_concurrency}, TPOT is {_n(low.mean_tpot_ms, 1)} ms, "
            f"{_n(low.tpot_over_floor, 1)}x the {_n(low.bandwidth_floor_ms, 1)} ms bandwidth floor and "
            f"{_n(host_ms, 1)} ms more than the {_n(low_gpu, 1)} ms of GPU work estimated for it: that much of "
            "every step is host overhead (scheduling, kernel launches), which larger batches hide behind GPU work.",
            {
                "max_concurrency": low.max_concurrency,
                "mean_tpot_ms": low.mean_tpot_ms,
                "tpot_over_floor": low.tpot_over_floor,
                "bandwidth_floor_ms": low.bandwidth_floor_ms,
                "host_overhead_ms": host_ms,
                "gpu_estimate_ms": low_gpu,
            },
            category="host_overhead",
            max_concurrency=low.max_concurrency,
            formula="host overhead = TPOT - the sum of the estimated GPU components at that level",
        )
        if host_ms >= 0.5 * low.mean_tpot_ms:
            evidence["host_overhead"].append(line)
        elif low.tpot_over_floor <= 2.0:
            evidence["memory_bandwidth"].append(
                _finding(
                    "evidence",
                    f"At concurrency {low.max_concurrency}, TPOT is {_n(low.mean_tpot_ms, 1)} ms, only "
                    f"{_n(low.tpot_over_floor, 2)}x the {_n(low.bandwidth_floor_ms, 1)} ms it takes to read "
                    f"{_n(low.step_bytes_gb, 1)} GB per GPU at {_n(hw.memory_bandwidth_gbs)} GB/s: "
                    "low-concurrency decode is bound by memory bandwidth.",
                    {
                        "max_concurrency": low.max_concurrency,
                        "mean_tpot_ms": low.mean_tpot_ms,
                        "tpot_over_floor": low.tpot_over_floor,
                        "bandwidth_floor_ms": low.bandwidth_floor_ms,
                        "step_bytes_gb": low.step_bytes_gb,
                        "memory_bandwidth_gbs": hw.memory_bandwidth_gbs,
                    },
                    category="memory_bandwidth",
                    max_concurrency=low.max_concurrency,
                    formula="floor = bytes per decode step / peak bandwidth",
                )
            )

    # -- prefill interference at R
    inflation = ref.mean_tpot_ms / ref.decode_step_ms if ref.decode_step_ms > 0 else 1.0
    distance = ref.decode_step_ms / ref.bandwidth_floor_ms if ref.bandwidth_floor_ms > 0 else 0.0
    prefill_line = _finding(
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
    if inflation >= 2.0:
        evidence["prefill_interference"].append(prefill_line)

    # -- the decode step's components at R
    if profile is not None and profile.categories:
        shares = {}
        for key, cat in profile.categories.items():
            comp = _PROFILE_COMPONENTS.get(key, key)
            shares[comp] = shares.get(comp, 0.0) + cat.share
        shares.pop("other", None)
        largest = max(shares, key=shares.get) if shares else max(est, key=est.get)
        parts_text = ", ".join(
            f"{COMPONENT_TITLES[k]} {_n(100 * v)}%" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])
        )
        comp_line = _finding(
            "evidence",
            f"The profile splits GPU time into {parts_text}: {COMPONENT_TITLES[largest]} take the largest share.",
            {f"profile_{k}_share_pct": 100 * v for k, v in shares.items()},
            max_concurrency=profile.max_concurrency or c,
            formula="shares of kernel time in the profile window",
        )
    else:
        largest = max(est, key=est.get)
        parts_text = ", ".join(
            f"{COMPONENT_TITLES[k]} {_n(v)} ms ({_n(100 * v / gpu_ms)}%)"
            for k, v in sorted(est.items(), key=lambda kv: -kv[1])
            if v >= 0.5 and gpu_ms > 0
        )
        comp_line = _finding(
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

    power_line = None
    if ref.power_share_pct is not None and ref.power_w_mean is not None:
        exp = ref.scaling_exponent
        growth = (
            "while output tok/s grows sublinearly"
            if exp is not None and exp < SUBLINEAR_EXPONENT
            else "at the best level"
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
        power_line = _finding(
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

    if largest == "expert_gemm":
        memory_bound = ref.gemm_bound == "memory"
        small = memory_bound or ref.share_of_peak_pct < 100 * SMALL_GEMM_SHARE_OF_PEAK
        component_category: m.BottleneckCategory = "small_batch_expert_gemm" if small else "compute"
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
                category=component_category,
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
                category=component_category,
                max_concurrency=c,
                formula="AI = 2 m W / (W b_w + m a); ridge = peak / bandwidth; roofline = min(peak, AI x bandwidth)",
            ),
        ]
        step = roof.step(ref.running_decodes, ref.context_tokens)
        if ref.decode_step_ms > 0 and step["expert_flops"] > 0:
            bound = step["expert_flops"] * roof.pp / (ref.decode_step_ms / 1000) / 1e12
            lines.append(
                _finding(
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
                    category=component_category,
                    max_concurrency=c,
                    formula="upper bound = expert FLOPs per GPU per step / measured decode step",
                )
            )
        lines.append(comp_line)
        if power_line is not None:
            lines.insert(2, power_line)
        evidence[component_category] = lines + evidence[component_category]
    elif largest == "dense_gemm":
        ai = roof.dense_intensity(ref.running_decodes)
        ridge = roof.ridge(roof.dense_dtype)
        component_category = "compute" if ai >= ridge else "memory_bandwidth"
        lines = [
            _finding(
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
                category=component_category,
                max_concurrency=c,
                formula="dense AI = 2 M K N / (K N b_w + M K b_a + 2 M N), M = running decodes",
            ),
            comp_line,
        ]
        if power_line is not None:
            lines.append(power_line)
        evidence[component_category] = lines + evidence[component_category]
    elif largest == "attention":
        component_category = "memory_bandwidth"
        evidence[component_category] = [comp_line, *([power_line] if power_line else [])] + evidence[component_category]
    elif largest == "communication":
        component_category = "communication"
        lines = [comp_line]
        if roof.tp > 1:
            payload_mb = ref.running_decodes * model.hidden_size * 2 / 1e6
            lines.insert(
                0,
                _finding(
                    "evidence",
                    f"TP{roof.tp} runs {2 * model.layers // roof.pp} all-reduces per decode step of {_n(payload_mb, 1)} MB "
                    f"each at concurrency {c}, over {hw.interconnect.kind} at {_n(hw.interconnect.bandwidth_gbs)} GB/s "
                    f"per direction: about {_n(est['communication'])} ms per step.",
                    {
                        "all_reduces": 2 * model.layers // roof.pp,
                        "payload_mb": payload_mb,
                        "link_gbs": hw.interconnect.bandwidth_gbs,
                        "estimate_communication_ms": est["communication"],
                        "max_concurrency": c,
                    },
                    category="communication",
                    max_concurrency=c,
                    formula="payload = running decodes x hidden x 2 bytes",
                ),
            )
        evidence[component_category] = lines + evidence[component_category]
    else:  # "other" from a profile: no category of its own; the estimates decide
        largest = max(est, key=est.get)
        component_category = "memory_bandwidth" if largest in ("attention", "dense_gemm") else "compute"
        evidence[component_category] = [comp_line] + evidence[component_category]

    # -- the verdict, in order
    if evidence["kv_capacity"]:
        category: m.BottleneckCategory = "kv_capacity"
    elif host_ms is not None and host_ms >= gpu_ms and evidence["host_overhead"]:
        category = "host_overhead"
    elif inflation >= 2.0 and inflation > distance:
        category = "prefill_interference"
        if power_line is not None:
            evidence["prefill_interference"].append(power_line)
        evidence["prefill_interference"].append(comp_line)
    else:
        category = component_category
    chosen = evidence[category]
    if not chosen:  # nothing specific: the component line carries it
        chosen = [comp_line]
    chosen = [f.model_copy(update={"category": category}) for f in chosen]
    seen = {f.text for f in chosen}
    secondary: list[m.Finding] = []
    for key, lines in evidence.items():
        if key == category:
            continue
        for f in lines:
            if f.text not in seen:
                seen.add(f.text)
                secondary.append(f.model_copy(update={"kind": "evidence", "severity": "info"}))
    if prefill_line.text not in seen and inflation >= 1.5:
        secondary.append(prefill_line)
    if comp_line.text not in seen:
        secondary.append(comp_line.model_copy(update={"category": None}))
    if power_line is not None and power_line.text not in seen and all(power_line.text != f.text for f in secondary):
        secondary.append(power_line)
    return category, chosen, secondary


# --------------------------------------------------------------------------------------------------
# Choosing what to analyse, and the plan's claims.


KEPT_VERDICTS = (None, "baseline", "adopted")  # configurations that stand; no_gain and worse were set aside


def best_experiment(store: Store, session_id: str) -> int | None:
    """The kept experiment (baseline, adopted or not yet judged) with the highest output tok/s at a level without
    failures; when none is kept, any experiment. Ties go to the earlier one."""
    best: dict[bool, tuple[float, int]] = {}
    for e in store.experiments(session_id):
        if e.id is None or e.kind == "prior":
            continue
        kept = e.verdict in KEPT_VERDICTS
        for result in store.bench_results(e.id):
            for level in result.levels:
                if level.completed <= 0 or level.failed > 0:
                    continue
                key = (level.output_throughput, -e.id)
                if kept not in best or key > best[kept]:
                    best[kept] = key
    chosen = best.get(True) or best.get(False)
    return -chosen[1] if chosen else None


_MORE_KV = re.compile(r"more kv|kv headroom|allow more kv|bigger kv|larger kv|kv cache capacity", re.IGNORECASE)
_ROWS = re.compile(r"(\d[\d,]*)\s+rows", re.IGNORECASE)
_CONC = re.compile(r"(?:at\s+)?(\d[\d,]*)\s+concurrency|concurrency\s+(\d[\d,]*)", re.IGNORECASE)
_EP_ROWS = re.compile(r"(\d+)\s*x\s+the\s+rows|more rows", re.IGNORECASE)
_AR_COUNT = re.compile(r"(\d+)\s+per step", re.IGNORECASE)


def check_plan(session: SessionLike) -> list[m.Finding]:
    """Check the plan's items for physics and direction errors (and flags the audit found inert); record them.

    Replaces the session's previous plan-level findings. Uses the profiles, the audits of the experiments
    run so far, and the KV usage the analyses recorded.
    """
    store, session_id = session.store, session.id
    record = store.get_session(session_id)
    plan = record.plan
    kv_levels = [
        f
        for f in store.findings(session_id, kind="level")
        if f.experiment_id is not None and "kv_usage_pct" in f.values
    ]
    out = plan_claims(plan, store.experiments(session_id), kv_levels, engine=session_engine(record))
    return store.replace_findings(session_id, None, out)


def plan_claims(
    plan: m.Plan,
    experiments: Sequence[m.Experiment] = (),
    kv_levels: Sequence[m.Finding] = (),
    *,
    engine: Engine | None = None,
) -> list[m.Finding]:
    """The plan checks of `check_plan`, on a plan alone (`pivot plan check`) or with a session's experiments (their
    audits) and the KV usage its analyses measured; nothing is recorded. `engine` says how the flags split the
    model (default: the plan's engine, when its plugin loads here)."""
    target = plan.target
    model = _model_profile(target)
    hw = load_hardware(target.hardware)
    base = target.base_config()
    if engine is None:
        engine = _plan_engine(target)
    lay = layout(base, engine=engine)
    roof = Roofline(model, hw, lay["tp"], lay["pp"], lay["ep"], flag_value(base, "--kv-cache-dtype"))
    top_c = max(plan.workload.concurrency)
    out: list[m.Finding] = []

    for item in plan.items:
        text = " ".join([item.title, item.hypothesis, item.expected_impact])
        config = item.apply(base)

        # --mem-fraction-static: a higher fraction gives SGLang a bigger KV pool, not a smaller one
        new = flag_value(config, "--mem-fraction-static")
        if new is not None:
            old_text = flag_value(base, "--mem-fraction-static")
            old = float(old_text) if old_text else hw.auto_mem_fraction_static
            weights, old_pool = roof.kv_pool_tokens(old)
            _, new_pool = roof.kv_pool_tokens(float(new))
            where = "set in the base flags" if old_text else "SGLang's automatic value on this GPU"
            values = {
                "mem_fraction_old": old,
                "mem_fraction_new": float(new),
                "kv_pool_tokens_old": old_pool,
                "kv_pool_tokens_new": new_pool,
                "weights_gib_per_gpu": weights,
                "memory_gib": hw.memory_gib,
            }
            formula = "KV pool = (GPU memory x mem-fraction-static - weights per GPU) / KV bytes per token per GPU"
            if new_pool <= 0:
                out.append(
                    _finding(
                        "claim",
                        f"Item {item.id} sets --mem-fraction-static {new}: {_n(hw.memory_gib, 1)} GiB x {new} leaves no "
                        f"room beside {_n(weights, 1)} GiB of weights per GPU, so SGLang stops at startup (out of memory).",
                        values,
                        plan_item=item.id,
                        severity="error",
                        formula=formula,
                    )
                )
            elif float(new) < old and _MORE_KV.search(text):
                out.append(
                    _finding(
                        "claim",
                        f"Item {item.id} lowers --mem-fraction-static from {_n(old, 2)} ({where}) to {new} to get more KV "
                        f"cache, but in SGLang a higher fraction gives more KV cache, not a lower one: the KV pool shrinks "
                        f"from {_n(old_pool)} to {_n(new_pool)} tokens per GPU. To gain KV headroom, raise it above "
                        f"{_n(old, 2)}.",
                        values,
                        plan_item=item.id,
                        severity="error",
                        formula=formula,
                    )
                )
            else:
                change = "grows" if new_pool > old_pool else "shrinks"
                out.append(
                    _finding(
                        "claim",
                        f"Item {item.id}: --mem-fraction-static {old_text or _n(old, 2)} -> {new} {change} the KV pool from "
                        f"{_n(old_pool)} to {_n(new_pool)} tokens per GPU, in the direction the item expects.",
                        values,
                        plan_item=item.id,
                        formula=formula,
                    )
                )

        # rows per expert quoted in the text
        if roof.moe:
            rows_m = _ROWS.search(text)
            conc_m = _CONC.search(text)
            if rows_m and conc_m and "expert" in text.lower():
                quoted = float(rows_m.group(1).replace(",", ""))
                conc = int((conc_m.group(1) or conc_m.group(2)).replace(",", ""))
                expect = roof.rows_per_expert(conc)
                ok = 0.75 <= quoted / expect <= 1.33 if expect else False
                out.append(
                    _finding(
                        "claim",
                        f"Item {item.id} quotes {_n(quoted)} rows per expert at concurrency {conc}: "
                        f"{conc} x {model.experts_per_token} / {model.experts} = {_n(expect)} if all {conc} requests "
                        "decode at once" + (", consistent." if ok else ", which does not match."),
                        {
                            "rows_quoted": quoted,
                            "max_concurrency": conc,
                            "rows_per_expert": expect,
                            "experts_per_token": model.experts_per_token,
                            "experts": model.experts,
                        },
                        plan_item=item.id,
                        severity="info" if ok else "warning",
                        formula="rows per expert = concurrency x experts per token / experts",
                    )
                )

            ep = layout(config, engine=engine)["ep"]
            if ep > 1 and _EP_ROWS.search(item.hypothesis):
                rows_c = roof.rows_per_expert(top_c)
                out.append(
                    _finding(
                        "claim",
                        f"Item {item.id} expects EP{ep} to give each expert more rows, but routing decides the rows: at "
                        f"concurrency {top_c} each expert sees {_n(rows_c)} rows under TP and under EP alike. EP changes the "
                        f"width one GPU computes ({_n(model.expert_ffn / lay['tp'])} -> {_n(model.expert_ffn)} columns), and "
                        f"each GPU then handles 1/{ep} of the routed rows, not {ep}x.",
                        {
                            "ep_size": ep,
                            "max_concurrency": top_c,
                            "rows_per_expert": rows_c,
                            "width_tp": model.expert_ffn / lay["tp"],
                            "width_ep": model.expert_ffn,
                        },
                        plan_item=item.id,
                        severity="error",
                        formula="rows per expert = concurrency x experts per token / experts, whatever the layout",
                    )
                )

        # all-reduce count quoted in the text
        if "all-reduce" in text.lower() and lay["tp"] > 1:
            count = _AR_COUNT.search(text)
            if count:
                quoted = int(count.group(1))
                expect = 2 * model.layers // lay["pp"]
                out.append(
                    _finding(
                        "claim",
                        f"Item {item.id} counts {quoted} all-reduces per step: 2 per layer x {model.layers} layers = {expect}"
                        + (", consistent." if quoted == expect else ", which does not match."),
                        {"all_reduces_quoted": quoted, "all_reduces": expect, "layers": model.layers},
                        plan_item=item.id,
                        severity="info" if quoted == expect else "warning",
                        formula="all-reduces per decode step = 2 x layers / pp (after attention and after the MLP)",
                    )
                )

        # KV-limited expectations against what the analyses measured
        if "kv" in text.lower() and "limit" in text.lower() and kv_levels:
            top = max(kv_levels, key=lambda f: (f.values.get("max_concurrency", 0), f.values["kv_usage_pct"]))
            usage = top.values["kv_usage_pct"]
            if usage < 100 * KV_FULL:
                out.append(
                    _finding(
                        "claim",
                        f"Item {item.id} expects a gain if KV capacity is the limit; the KV pool peaked at {_n(usage)}% at "
                        f"concurrency {int(top.values['max_concurrency'])} (experiment {top.experiment_id}), so it is not "
                        "the limit at the levels measured.",
                        {
                            "kv_usage_pct": usage,
                            "max_concurrency": top.values["max_concurrency"],
                            "experiment_id": top.experiment_id or 0,
                        },
                        plan_item=item.id,
                        severity="warning",
                    )
                )

        # flags the audit found inert or refused, from the experiments run for this item
        for e in experiments:
            if e.plan_item != item.id:
                continue
            for issue in e.audit:
                if (
                    issue.status in ("noop", "unknown", "ambiguous")
                    and item.flags is not None
                    and issue.flag in item.flags
                ):
                    what = {
                        "noop": "is accepted but read nowhere",
                        "unknown": "is not accepted",
                        "ambiguous": "is ambiguous",
                    }[issue.status]
                    out.append(
                        _finding(
                            "claim",
                            f"Item {item.id}: {issue.flag} {what} in SGLang {target.engine_version or ''} (audit of "
                            f"experiment {e.id}), so the expected impact cannot come from it. {issue.message}".strip(),
                            {"experiment_id": e.id or 0},
                            plan_item=item.id,
                            severity="warning",
                        )
                    )
            break
    return out
