"""The roofline of one model on one GPU type with one layout: bytes, FLOPs and times of one decode step."""

from __future__ import annotations

import math

from agent import models as m
from tools.analysis.common import ACTIVATION_BYTES, GB, GIB
from tools.profiles import DTYPE_BYTES, HardwareProfile, ModelProfile


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
        # unknown figures (a generated profile) are 0: only what needs no bandwidth (shapes, KV pool) is read then
        self.bw = (hw.memory_bandwidth_gbs or 0.0) * GB
        self.link = (hw.interconnect.bandwidth_gbs if hw.interconnect else 0.0) * GB
        self.lat = (hw.interconnect.latency_us if hw.interconnect else 0.0) * 1e-6
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

    def achieved_tflops(self, dtype: str, m_rows: float, n: float, k: float = 0.0) -> tuple[float, str]:
        """Achieved TFLOPS of a GEMM with m rows, width n (and depth k, when given): micro-benchmarks of that shape
        when there are, else the fit.

        With k: rows of the same dtype and the same (n, k) within 15% (so the TP they ran at is the GEMM's: a TP2
        row never stands in for a TP1 GEMM), interpolated in log(m) between the two measured row counts around m
        (the nearest within 2x when m is outside them). Without k (expert GEMMs): rows within 2x and width within
        4x, the nearest in rows and width, the faster on a tie. FP8 rows stand in for FP4 weights on a GPU without
        FP4 units, which run them at the FP8 rate."""
        measured = dtype
        if dtype in ("nvfp4", "fp4") and "fp4" not in self.hw.dense_tflops:
            measured = "fp8"
        if m_rows <= 0:
            return self.fit_tflops(dtype, m_rows, n), "hardware profile's GEMM-efficiency fit"
        note = f"; {measured} standing in for {dtype}" if measured != dtype else ""
        if k > 0 and n > 0:
            same = [r for r in self.microbench if r.dtype == measured and r.m > 0 and r.groups == 1
                    and abs(math.log(r.n / n)) <= math.log(1.15) and abs(math.log(r.k / k)) <= math.log(1.15)]  # fmt: skip
            found = _interpolated(same, m_rows)
            if found is not None:
                tflops, rows = found
                ids = ", ".join(f"#{r.id}" for r in rows)
                return (
                    tflops,
                    f"micro-benchmark {ids} ({'..'.join(str(r.m) for r in rows)}x{rows[0].n}x{rows[0].k}{note})",
                )
            return self.fit_tflops(dtype, m_rows, n), "hardware profile's GEMM-efficiency fit"
        close = [
            r
            for r in self.microbench
            if r.dtype == measured
            and r.m > 0
            and 0.5 <= (r.rows_per_expert or r.m) / m_rows <= 2
            and (n <= 0 or 0.25 <= r.n / n <= 4)
        ]
        if close:

            def distance(r: m.MicrobenchResult) -> tuple[float, float]:
                d = abs(math.log((r.rows_per_expert or r.m) / m_rows)) + (abs(math.log(r.n / n)) if n > 0 else 0.0)
                return (round(d, 9), -r.tflops)

            best = min(close, key=distance)
            what = (best.backend or best.dtype) + note
            return best.tflops, f"micro-benchmark #{best.id} ({best.m}x{best.n}x{best.k}, {what})"
        return self.fit_tflops(dtype, m_rows, n), "hardware profile's GEMM-efficiency fit"

    def measured_dense(self) -> bool:
        """Whether micro-benchmarks of this dense model's own linear-layer shapes (at its TP) were recorded."""
        if self.model.kind != "dense" or not self.model.dense_gemms:
            return False
        shapes = set()
        for g in self.model.dense_gemms:
            shapes.add(
                (round(g.n / self.tp) if g.split == "n" else g.n, round(g.k / self.tp) if g.split == "k" else g.k)
            )
        return any((r.n, r.k) in shapes and r.dtype == self.dense_dtype for r in self.microbench)

    def dense_gemm_time(self, batch: float) -> float | None:
        """Seconds of one decode step's dense linear layers (all layers of one stage), GEMM by GEMM from the model's
        dense_gemms (qkv, o, gate/up, down at their TP shapes), each at its achieved rate; None without them."""
        gemms = self.model.dense_gemms
        if not gemms or batch <= 0:
            return None
        layers = (self.model.layers - self.model.moe_layers) / self.pp
        dtype = next((p.dtype for p in self.dense_parts if p.layers in ("all", "dense")), self.dense_dtype)
        total = 0.0
        for g in gemms:
            n = g.n / self.tp if g.split == "n" else g.n
            k = g.k / self.tp if g.split == "k" else g.k
            tflops, _ = self.achieved_tflops(dtype, batch, n, k)
            w_bytes = n * k * DTYPE_BYTES.get(dtype, 2.0)
            flops = 2 * batch * n * k
            total += max(w_bytes / self.bw, flops / (tflops * 1e12) if tflops > 0 else 0.0)
        return layers * total

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
        # a dense model with measured GEMMs of its own layers' shapes: each linear layer at its rate (the layers'
        # parts below then add their bytes and FLOPs, not their time); else one proxy shape for every part
        per_gemm = self.dense_gemm_time(batch) if self.measured_dense() else None
        for p in self.dense_parts:
            shard = 1 if p.replicated else self.tp
            b = p.params * p.bytes_per_param / (shard * pp)
            f = batch * 2 * p.params / (shard * pp)
            dense_bytes += b
            dense_flops += f
            if per_gemm is not None and p.layers in ("all", "dense"):
                continue
            tflops, _ = self.achieved_tflops(p.dtype, max(batch, 1e-9), model.hidden_size / shard)
            t_dense += max(b / self.bw, f / (tflops * 1e12)) if batch > 0 else 0.0
        t_dense += per_gemm or 0.0  # one stage's, as the parts' times above
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


def _interpolated(rows: list[m.MicrobenchResult], m_rows: float) -> tuple[float, list[m.MicrobenchResult]] | None:
    """TFLOPS at m_rows from rows of one shape: log-linear between the nearest measured row counts below and above
    it (the mean of rows measured at the same count), the nearest alone within 2x outside them; None otherwise."""
    by_m: dict[int, list[m.MicrobenchResult]] = {}
    for r in rows:
        by_m.setdefault(r.m, []).append(r)
    if not by_m:
        return None
    mean = {mm: sum(r.tflops for r in rs) / len(rs) for mm, rs in by_m.items()}
    below = [mm for mm in by_m if mm <= m_rows]
    above = [mm for mm in by_m if mm >= m_rows]
    if below and above:
        lo, hi = max(below), min(above)
        if lo == hi:
            return mean[lo], by_m[lo][:1]
        t = (math.log(m_rows) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return mean[lo] + t * (mean[hi] - mean[lo]), [by_m[lo][0], by_m[hi][0]]
    nearest = min(by_m, key=lambda mm: abs(math.log(mm / m_rows)))
    if 0.5 <= nearest / m_rows <= 2:
        return mean[nearest], by_m[nearest][:1]
    return None
