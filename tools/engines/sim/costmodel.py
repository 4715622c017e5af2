"""The twin's cost model: how long one engine step takes on given GPUs, and what it is made of.

Every flag acts only through the quantities below; the hardware profile supplies peaks and the
fitted scalars of its `[calibration]` table (named in brackets here).

Notation: B running requests in a decode step (or T prompt tokens in a prefill step), L layers, Lm
MoE layers, E routed experts, k experts per token, tp/pp/ep the parallel sizes. Per GPU, per step:

  experts hit per MoE layer     E_hit(B) = E * (1 - (1 - k/E)^B)            (uniform routing)
  rows per hit expert           m = B * k / E_hit(B)
  expert width on one GPU       n = expert_ffn / tp under TP, expert_ffn under EP (whole experts)
  GEMM efficiency               eff(m, n) = [gemm_efficiency_max] * m/(m + [gemm_m_half]) * n/(n + [gemm_n_half])
  GEMM weight reads             BW_gemm(n) = memory_bandwidth * [gemm_bandwidth_efficiency]
                                             * n/(n + [gemm_bandwidth_n_half])
                                * [gemm_stream_by_dtype][weight dtype] (1 for a dtype not named)
                                (unset: [bandwidth_efficiency] and no width factor. GEMM kernels stream weights
                                below a plain copy, and narrow ones below wide ones, on the memory side as on
                                the compute side: see scripts/fit_h200_gemm.py for the H200's measurements)
  expert weight bytes           W_exp = (Lm/pp) * E_hit * bytes_per_expert / (tp, or ep under EP)
  expert FLOPs                  F_exp = B * k * 2 * params_per_expert * (Lm/pp) / (tp, or ep)
  expert time                   t_exp = max(W_exp / BW_gemm(n), F_exp / (peak(dtype) * eff(m, n)))   (roofline)
  dense parts (attention projections, shared expert, lm_head): the same roofline with m = B,
                                n = hidden / tp, bytes / tp (whole on every rank if replicated)
  KV read                       t_kv = max(ctx_tokens * kv_bytes / (pp * s) / BW, attention FLOPs / (peak * eff_max)),
                                s = 1 for MLA (its latent is on every TP rank), tp for GQA (KV heads split over TP)
  TP all-reduce                 2 per layer, payload B * hidden * 2 bytes:
                                t_ar = (L/pp) * 2 * (lat + 2(tp-1)/tp * payload / (link_bw * [allreduce_efficiency]))
                                (MSCCL++ halves lat for payloads under 1 MiB)
  EP all-to-all                 dispatch + combine per MoE layer, B * k * hidden bytes each way, (ep-1)/ep of it
                                over the link; single-batch overlap hides half of it behind the expert GEMMs
  where BW = memory_bandwidth * [bandwidth_efficiency] (KV and attention reads; GEMM weights use BW_gemm).

  elementwise                   t_elem = (L/pp) * ([layer_us_per_step] + [layer_us_by_dtype][linear dtype]): norms,
                                RoPE, activations, quantization and the gaps between kernels, per layer and step,
                                whatever the rows (0: not modelled; fitted to whole measured steps by
                                `pivot calibrate` from tools.stepbench's files)
  GPU time of a stage           t_stage(b) = t_exp + t_dense + t_kv + t_ar + t_a2a + t_elem     (for b rows)
  host time of a step           t_host(b) = [host_ms_per_step] + [host_us_per_request] * b
  one stage's turn              u(b) = max(t_host, t_stage) with the overlap scheduler (the default), else
                                t_host + t_stage; + [eager_ms_per_step] / pp when b exceeds the decode CUDA
                                graph's largest batch (or graphs are off): those steps launch every kernel
                                from the host
  decode step (TP, pp = 1)      t = u(B)
  PP (SGLang's event_loop_pp)   stage r holds layers [start_r, end_r) as SGLang's get_pp_indices splits them
                                (L // pp each, the last L % pp stages one more), and with them its share of
                                every part (a part's `layers` says where it lives: the dense layers come first,
                                the embedding sits on the first stage, the lm_head on the last), so the terms
                                above use stage r's layer counts instead of L/pp. The running requests are
                                spread over n_mb = min(B, pp) micro-batches of b = ceil(B / n_mb): SGLang keeps
                                one running batch per micro-batch and admits each new prefill batch into the one
                                whose turn it is, up to mb = --pp-max-micro-batch-size (default max running
                                requests // pp), so at most pp * mb requests run. Each stage's scheduler takes
                                the micro-batches in turn and each micro-batch passes through the stages in
                                order, so every micro-batch advances one token per round
                                of t = max(n_mb * max_r u_r(b), sum_r u_r(b)): the slowest stage paces a full
                                pipeline, one micro-batch waits for every stage. SGLang turns the overlap
                                scheduler off under PP, so host and GPU time add. Each GPU is busy
                                n_mb * t_stage_r(b) of the round (the breakdown is the mean over stages).
  prefill step (T tokens)       the same terms with T rows, all experts hit, attention over the prompt,
                                + [prefill_us_per_token] * T * (stage's share of the layers) of per-token work
                                outside the GEMM roofline (prefill attention and the DSA indexer, KV-page
                                allocation), counted as attention; one chunk passes the stages in turn

Power, from the work the cost model itself puts on the GPU over a level of wall time W (per GPU):
  tensor use                    u_t = sum over GEMMs and attention of FLOPs / peak(dtype) / W
  memory use                    u_m = (weight bytes + KV bytes read) / memory_bandwidth / W
  power                         P = idle + (TDP - idle) * min(1, [power_activity] * ([power_compute_weight] * u_t + u_m))
[power_compute_weight] is what the tensor cores at their peak rate draw against the memory at its peak bandwidth.

Under a power limit C below the TDP (a power item: NVML's nvmlDeviceSetPowerManagementLimit), the GPU lowers its
SM clock to a share c of full speed (the memory clock stays): every compute peak above runs at c x peak, memory and
host times do not change, and the tensor term of the power costs c^2 per unit of work (dynamic power ~ f V^2 with
the voltage following the clock), so
  power at clock c              P(c) = idle + (TDP - idle) * min(1, [power_activity] * ([power_compute_weight]
                                       * u_t * c^2 + u_m))     (u_t, u_m over the level's wall time at clock c)
The twin finds the c at which P(c) = C (tools/engines/sim/twin.py: Twin.simulate, at most three simulations);
c never falls below MIN_CLOCK.
At a fixed configuration more load means more tokens, so more FLOPs per second; the weights read per second fall
as steps lengthen, but by less than the weighted FLOPs rise (tests/test_twin.py checks that power never falls
while throughput rises).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from tools.profiles import HardwareProfile, ModelProfile

MSCCLPP_SMALL_BYTES = 1 << 20
MIN_CLOCK = 0.3  # the lowest SM clock share a power limit brings the GPU to (its base clock region)


@dataclass(frozen=True)
class Parallel:
    """How the model is laid out on the GPUs, and the execution switches the cost model reads."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    kv_dtype: str = "auto"
    cuda_graph_max_bs: int = 512
    cuda_graph: bool = True
    overlap_schedule: bool = True
    mscclpp: bool = False
    single_batch_overlap: bool = False
    pp_micro_batch: int = 0  # SGLang's pp_max_micro_batch_size (the scheduler runs at most pp x this); 0: unset

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


@dataclass
class StepCost:
    """One step's time, split the way a profiler would show it (seconds), plus its busy share."""

    total_s: float
    expert_gemm_s: float = 0.0
    dense_gemm_s: float = 0.0
    attention_s: float = 0.0
    communication_s: float = 0.0
    host_s: float = 0.0
    eager_s: float = 0.0
    busy_s: float = 0.0
    tensor_s: float = 0.0  # FLOPs / peak FLOP rate: the step's work at the tensor cores' full rate
    memory_s: float = 0.0  # bytes read / peak bandwidth: the step's traffic at the memory's full rate
    elementwise_s: float = 0.0  # the profile's per-layer work outside the roofline (layer_us_per_step)

    def breakdown(self) -> dict[str, float]:
        """Seconds by component: expert GEMMs, dense GEMMs, attention, communication, host overhead."""
        return {
            "expert_gemm": self.expert_gemm_s,
            "dense_gemm": self.dense_gemm_s,
            "attention": self.attention_s,
            "communication": self.communication_s,
            "host_overhead": self.host_s + self.eager_s,
            **({"elementwise": self.elementwise_s} if self.elementwise_s else {}),
        }


def pp_layer_ranges(layers: int, pp: int) -> list[tuple[int, int]]:
    """The layers [start, end) of each pipeline stage, as SGLang's get_pp_indices splits them by default:
    layers // pp each, one more on each of the last layers % pp stages."""
    base, extra = divmod(layers, pp)
    out, start = [], 0
    for rank in range(pp):
        n = base + (1 if rank >= pp - extra else 0)
        out.append((start, start + n))
        start += n
    return out


@dataclass(frozen=True)
class StageShape:
    """What one pipeline stage holds: its layers, its MoE layers and its share of every dense part."""

    layers: int
    moe_layers: int
    layer_share: float  # of all layers (KV, attention, per-token prefill work)
    dense_shares: tuple[float, ...]  # per dense part, in CostModel._dense order
    weight_bytes: float  # per GPU


_RowsPart = tuple[float | None, float, float, float, float, float]
_ROWS_MEMOS: OrderedDict[tuple, dict[tuple[int, float], _RowsPart]] = OrderedDict()
_ROWS_LOCK = threading.Lock()
ROWS_MEMOS_KEPT = 32  # cost models (model, hardware, layout, clock) whose per-row-count parts a process keeps


def _rows_memo(key: tuple) -> dict[tuple[int, float], _RowsPart]:
    """The per-row-count parts of every cost model alike (a campaign builds one per configuration it predicts, and
    configurations share layouts), the most recently used ROWS_MEMOS_KEPT of them."""
    with _ROWS_LOCK:  # twins are built in tools' worker threads
        memo = _ROWS_MEMOS.pop(key, None)
        memo = {} if memo is None else memo
        _ROWS_MEMOS[key] = memo
        while len(_ROWS_MEMOS) > ROWS_MEMOS_KEPT:
            _ROWS_MEMOS.popitem(last=False)
        return memo


class CostModel:
    """Step times for one model on one kind of GPU with one parallel layout."""

    def __init__(self, model: ModelProfile, hw: HardwareProfile, par: Parallel, clock: float = 1.0) -> None:
        self.model, self.hw, self.par = model, hw, par
        self.clock = min(max(clock, MIN_CLOCK), 1.0)  # SM clock share under a power limit (1: full speed)
        cal = hw.calibration
        self.bw = hw.memory_bandwidth_gbs * 1e9 * cal.bandwidth_efficiency  # KV and attention reads
        self.link_bw = hw.interconnect.bandwidth_gbs * 1e9 * cal.allreduce_efficiency
        self.cal = cal
        experts = model.part("experts")
        self.expert_dtype = experts[0].dtype if experts else "bf16"
        self.expert_bytes_total = sum(p.params * p.bytes_per_param for p in experts)
        n_experts = max(model.moe_layers * model.experts, 1)
        self.bytes_per_expert = self.expert_bytes_total / n_experts
        self.kv_bytes = model.kv_bytes(par.kv_dtype)
        self._dense = model.part("dense")
        linear = experts or self._dense  # the linear layers' dtype: the experts', else the largest dense part's
        self.linear_dtype = max(linear, key=lambda p: p.params).dtype if linear else "bf16"
        self.layer_s = (cal.layer_us_per_step + cal.layer_us_by_dtype.get(self.linear_dtype, 0.0)) * 1e-6
        self.stages = [self._shape(a, b) for a, b in pp_layer_ranges(model.layers, par.pp)]
        self._attn_peak = hw.peak_tflops("bf16") * 1e12 * self.clock * cal.gemm_efficiency_max
        self._bf16_peak = hw.peak_tflops("bf16") * 1e12
        self._memory_bw = hw.memory_bandwidth_gbs * 1e9
        self._by_rows = _rows_memo((model.model_dump_json(), hw.model_dump_json(), par, self.clock))

    def _shape(self, start: int, end: int) -> StageShape:
        model, tp = self.model, self.par.tp
        moe = model.moe_layers_in(start, end) if model.kind == "moe" else 0
        weights = self.expert_bytes_total * moe / model.moe_layers / tp if model.moe_layers else 0.0
        for p in model.parts:
            if p.kind != "experts":
                weights += p.params * p.bytes_per_param * model.share_in(p, start, end) / (1 if p.replicated else tp)
        return StageShape(
            layers=end - start,
            moe_layers=moe,
            layer_share=(end - start) / model.layers,
            dense_shares=tuple(model.share_in(p, start, end) for p in self._dense),
            weight_bytes=weights,
        )

    # ---- memory

    def weight_bytes_per_gpu(self) -> float:
        """Bytes of weights one GPU holds (what must fit beside the KV pool); the heaviest stage's under PP."""
        return max(st.weight_bytes for st in self.stages)

    def kv_bytes_per_token_per_gpu(self, stage: StageShape | None = None) -> float:
        """KV bytes one GPU holds per token: its stage's layers (the most any stage has, by default)."""
        shard = 1 if self.model.kv_replicated_across_tp else self.par.tp
        share = stage.layer_share if stage else max(st.layer_share for st in self.stages)
        return self.kv_bytes * share / shard

    def kv_capacity_tokens(self, budget_bytes: float) -> int:
        """Tokens the KV pool holds when `budget_bytes` per GPU must hold the weights and the pool: the
        least over the stages, since every stage keeps the KV of every running token for its layers."""
        return min(int(max(budget_bytes - st.weight_bytes, 0.0) / self.kv_bytes_per_token_per_gpu(st))
                   for st in self.stages)  # fmt: skip

    # ---- GEMM efficiency

    def efficiency(self, m: float, n: float) -> float:
        """eff(m, n): achieved / peak tensor throughput of a GEMM with m rows and output width n."""
        return self.cal.gemm_efficiency(m, n)

    def gemm_bw(self, n: float, dtype: str | None = None) -> float:
        """BW_gemm(n): bytes/s at which a GEMM of output width n reads its weights (of `dtype`)."""
        return self.hw.memory_bandwidth_gbs * 1e9 * self.cal.gemm_stream_efficiency(n, dtype)

    # ---- one stage of work for `rows` tokens

    def _stage(self, index: int, rows: float, ctx_tokens: float, attn_flops: float) -> dict[str, float]:
        """Stage `index`'s work for `rows` tokens reading `ctx_tokens` of KV: the GEMMs and the communication depend
        on the rows alone and are worked out once per row count (a level repeats its batch sizes thousands of
        times); attention is added per call, in the same order of sums as one pass would add it."""
        st = self.stages[index]
        key = (index, rows)
        part = self._by_rows.get(key)
        if part is None:
            part = self._by_rows[key] = self._rows_part(st, rows)
        expert, t_dense, busy, tensor, traffic, t_comm = part
        kv_read = ctx_tokens * self.kv_bytes_per_token_per_gpu(st)
        attn = attn_flops * st.layer_share / self.par.tp
        t_attn = max(kv_read / self.bw, attn / self._attn_peak)
        out: dict[str, float] = {} if expert is None else {"expert_gemm": expert}
        out["dense_gemm"] = t_dense
        out["attention"] = t_attn
        out["communication"] = t_comm
        t_elem = st.layers * self.layer_s
        if t_elem:
            out["elementwise"] = t_elem
        out["busy"] = busy + t_attn + t_elem
        out["tensor"] = tensor + attn / self._bf16_peak
        out["memory"] = (traffic + kv_read) / self._memory_bw
        return out

    def _rows_part(self, st: StageShape, rows: float) -> _RowsPart:
        """What a stage's step costs for `rows` tokens before attention: (expert GEMMs or None for a dense model,
        dense GEMMs, busy, tensor and traffic so far, communication)."""
        model, par, hw = self.model, self.par, self.hw
        expert = None
        busy = tensor = traffic = 0.0
        if model.kind == "moe" and rows > 0:
            E, k = model.experts, model.experts_per_token
            hit = E * (1.0 - (1.0 - k / E) ** rows)
            m = rows * k / hit
            shard = par.ep if par.ep > 1 else par.tp
            n = model.expert_ffn if par.ep > 1 else model.expert_ffn / par.tp
            w_bytes = st.moe_layers * hit * self.bytes_per_expert / shard
            flops = rows * k * 2 * model.expert_params * st.moe_layers / shard
            peak = hw.peak_tflops(self.expert_dtype) * 1e12
            expert = max(
                w_bytes / self.gemm_bw(n, self.expert_dtype), flops / (peak * self.clock * self.efficiency(m, n))
            )
            busy += expert
            tensor += flops / peak
            traffic += w_bytes
        t_dense = 0.0
        for p, share in zip(self._dense, st.dense_shares, strict=True):
            if rows <= 0 or share <= 0:
                continue
            shard = 1 if p.replicated else par.tp
            w_bytes = p.params * p.bytes_per_param * share / shard
            flops = rows * 2 * p.params * share / shard
            n = model.hidden_size / shard
            peak = hw.peak_tflops(p.dtype) * 1e12
            t_dense += max(w_bytes / self.gemm_bw(n, p.dtype), flops / (peak * self.clock * self.efficiency(rows, n)))
            tensor += flops / peak
            traffic += w_bytes
        busy += t_dense
        # communication
        t_comm = 0.0
        lat = hw.interconnect.latency_us * 1e-6
        if par.tp > 1:
            payload = rows * model.hidden_size * 2
            call_lat = lat * (0.5 if par.mscclpp and payload < MSCCLPP_SMALL_BYTES else 1.0)
            per_call = call_lat + 2 * (par.tp - 1) / par.tp * payload / self.link_bw
            t_comm += st.layers * 2 * per_call
        if par.ep > 1 and model.kind == "moe":
            payload = rows * model.experts_per_token * model.hidden_size * 1.0
            per_layer = 2 * (lat + (par.ep - 1) / par.ep * payload / self.link_bw)
            a2a = st.moe_layers * per_layer
            if par.single_batch_overlap:
                a2a *= 0.5
            t_comm += a2a
        if par.pp > 1:
            t_comm += lat + rows * model.hidden_size * 2 / self.link_bw
        return expert, t_dense, busy, tensor, traffic, t_comm

    def _combine(
        self, stages: list[dict[str, float]], host_s: float, eager_s: float, micro_batches: int = 1
    ) -> StepCost:
        """A round: `micro_batches` micro-batches each pass through the stages (one stage: one plain step)."""
        gpu = [st.get("expert_gemm", 0.0) + st["dense_gemm"] + st["attention"] + st["communication"]
               + st.get("elementwise", 0.0) for st in stages]  # fmt: skip
        turns = [max(host_s, g) if self.par.overlap_schedule else host_s + g for g in gpu]
        total = max(micro_batches * max(turns), sum(turns)) + eager_s
        n = len(stages)

        def mean(key: str) -> float:  # what one GPU computes in the round, averaged over the stages
            if n == 1:  # one stage (no PP): the same sum, without a generator per key
                return micro_batches * (0 + stages[0].get(key, 0.0)) / n
            return micro_batches * sum(st.get(key, 0.0) for st in stages) / n

        computed = micro_batches * sum(gpu) / n
        return StepCost(
            total_s=total,
            expert_gemm_s=mean("expert_gemm"),
            dense_gemm_s=mean("dense_gemm"),
            attention_s=mean("attention"),
            communication_s=mean("communication"),
            host_s=max(0.0, total - computed - eager_s),  # time the GPU waited for the host (and for other stages)
            eager_s=eager_s,
            busy_s=mean("busy"),
            tensor_s=mean("tensor"),
            memory_s=mean("memory"),
            elementwise_s=mean("elementwise"),
        )

    def decode(self, batch: int, ctx_tokens: float) -> StepCost:
        """One decode step (under PP, one round of micro-batches) for `batch` requests holding `ctx_tokens`."""
        par = self.par
        micro = max(min(batch, par.pp), 1)  # the scheduler keeps each micro-batch within pp_micro_batch
        rows = -(-batch // micro)
        ctx_tokens *= self.model.kv_share(ctx_tokens / max(batch, 1))  # sliding-window layers read their window
        attn_flops = ctx_tokens / micro * self.model.attention_flops_per_ctx_token
        stages = [self._stage(i, rows, ctx_tokens / micro, attn_flops) for i in range(len(self.stages))]
        host = self.cal.host_ms_per_step * 1e-3 + self.cal.host_us_per_request * 1e-6 * rows
        eager = self.cal.eager_ms_per_step * 1e-3 if (not par.cuda_graph or rows > par.cuda_graph_max_bs) else 0.0
        return self._combine(stages, host, eager, micro)

    def prefill(self, tokens: int, attn_pairs: float, requests: int) -> StepCost:
        """One prefill step over `tokens` prompt tokens; attn_pairs = sum of (token, earlier token) pairs."""
        stages = []
        for i, st in enumerate(self.stages):
            stage = self._stage(i, tokens, 0.0, attn_pairs * self.model.attention_flops_per_ctx_token)
            per_token = self.cal.prefill_us_per_token * 1e-6 * tokens * st.layer_share / self.clock
            stage["attention"] += per_token
            stage["busy"] += per_token
            stages.append(stage)
        host = self.cal.host_ms_per_step * 1e-3 + self.cal.host_us_per_request * 1e-6 * requests
        return self._combine(stages, host, 0.0)

    def power_w(self, tensor_share: float, memory_share: float) -> float:
        """Mean power per GPU from its tensor-core use (FLOPs at the peak rate / wall time) and its memory use
        (bytes at the peak bandwidth / wall time), at this model's clock, as the module docstring writes it."""
        hw, cal = self.hw, self.cal
        compute = cal.power_compute_weight * max(tensor_share, 0.0) * self.clock**2
        activity = cal.power_activity * (compute + max(memory_share, 0.0))
        return hw.idle_w + (hw.tdp_w - hw.idle_w) * min(activity, 1.0)
