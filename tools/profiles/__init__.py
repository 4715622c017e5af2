"""Hardware and model profiles as data (TOML), shared by the twin, the analysis and the micro-benchmarks.

Profiles ship with pivot (tools/profiles/hardware/*.toml, tools/profiles/models/*.toml); a path to a
TOML file of the same shape works too. Errors name the file and the field.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.errors import PivotError

HERE = Path(__file__).resolve().parent
DTYPE_BYTES: dict[str, float] = {"nvfp4": 0.5625, "fp4": 0.5, "fp8": 1.0, "bf16": 2.0, "fp16": 2.0, "fp32": 4.0}


class _Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Interconnect(_Profile):
    """How the GPUs of one host talk to each other."""

    kind: Literal["pcie4", "pcie5", "nvlink3", "nvlink4", "nvlink5"]
    bandwidth_gbs: float = Field(gt=0, description="Per direction, per GPU, GB/s.")
    latency_us: float = Field(ge=0, description="Fixed cost of one collective call, us.")


# The engine's host work per decode step: SGLang's scheduler (batch scheduling, memory allocation, prefix matching,
# the sampled tokens' bookkeeping) is the engine's, not the GPU's, so a hardware profile that was not fitted on a
# serving table of its own takes these rather than another GPU's fit. The only public per-step split of SGLang's
# host work found is sgl-project/sglang-jax PR #1484 (2026-07-27: per-step phase timing of the overlap loop, host
# 2.6-2.9 ms a step against a 5.7-5.9 ms forward at 16 running requests, Qwen3-8B); SGLang's overlap scheduler
# (the default, lmsys.org/blog/2024-12-04-sglang-v0-4, "zero-overhead batch scheduler") runs it while the GPU computes
# the step before, so it sets the step only where it is the longer of the two. 2.5 ms + 20 us per running request
# gives 2.8 ms at 16. An estimate for SGLang on a GPU host: a campaign fits it per target ([learn]: tools/fit.py's
# "host" group), and `pivot calibrate` on a serving table writes it into the profile as fitted.
ENGINE_HOST_MS_PER_STEP = 2.5
ENGINE_HOST_US_PER_REQUEST = 20.0
ENGINE_HOST_SOURCE = (
    "engine: SGLang's host work per step, an estimate from sglang-jax PR #1484's per-step timing (2.6-2.9 ms at 16 "
    "requests), not fitted on this GPU"
)


class Calibration(_Profile):
    """The twin's fitted scalars for this hardware (see tools/engines/sim/costmodel.py for where each enters)."""

    provenance: dict[str, str] = Field(
        default_factory=dict,
        description="Where each scalar comes from, by name: 'fitted: <data>' (on this GPU), 'borrowed: <profile>' "
        "(another GPU's fit), 'estimate: <why>', 'engine: <why>' (the engine's own, not the GPU's: the host work per "
        "step where the profile does not give it). `plan check` says which; an unnamed scalar's source is unknown.",
    )

    def provenance_note(self) -> str | None:
        """The scalars grouped by where they come from, in one sentence (None when the profile says nothing)."""
        groups: dict[str, list[str]] = {}
        for name, source in self.provenance.items():
            kind, _, what = source.partition(":")
            label = {
                "fitted": "fitted on this GPU",
                "borrowed": "borrowed from",
                "estimate": "estimated",
                "engine": "the engine's, not this GPU's",
            }.get(kind.strip(), kind.strip())
            detail = what.strip()
            key = f"{label} {detail}" if kind.strip() == "borrowed" and detail else label
            groups.setdefault(key, []).append(name)
        if not groups:
            return None
        return "; ".join(f"{key}: {', '.join(names)}" for key, names in groups.items())

    host_ms_per_step: float = Field(
        default=ENGINE_HOST_MS_PER_STEP,
        ge=0,
        description="Scheduler and launch work per engine step (hidden behind the GPU's step under the overlap "
        "scheduler); unset: the engine's (ENGINE_HOST_MS_PER_STEP).",
    )
    host_us_per_request: float = Field(
        default=ENGINE_HOST_US_PER_REQUEST,
        ge=0,
        description="Extra host work per running request per step; unset: the engine's.",
    )

    @model_validator(mode="before")
    @classmethod
    def _engine_host(cls, data: object) -> object:
        """Host work the profile does not give is the engine's, and its provenance says so."""
        if not isinstance(data, dict):
            return data
        unset = [n for n in ("host_ms_per_step", "host_us_per_request") if n not in data]
        if not unset:
            return data
        provenance = data.get("provenance")
        if provenance is None or isinstance(provenance, dict):
            data = {**data, "provenance": {**(provenance or {}), **dict.fromkeys(unset, ENGINE_HOST_SOURCE)}}
        return data

    bandwidth_efficiency: float = Field(gt=0, le=1, description="Achieved / peak memory bandwidth.")
    gemm_m_half: float = Field(gt=0, description="Rows per GEMM at which efficiency reaches half its maximum.")
    gemm_n_half: float = Field(gt=0, description="Output width at which efficiency reaches half its maximum.")
    gemm_efficiency_max: float = Field(gt=0, le=1, description="Best achieved / peak tensor throughput.")
    gemm_bandwidth_efficiency: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Achieved / peak memory bandwidth of GEMM weight reads at full width; unset: bandwidth_efficiency.",
    )
    gemm_bandwidth_n_half: float = Field(
        default=0.0, ge=0, description="Output width at which GEMM weight reads stream at half their rate; 0: none."
    )
    gemm_stream_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="GEMM weight reads per weight dtype, as a factor on their streaming efficiency (an FP8 W8A8 "
        "GEMM through torch._scaled_mm streams slower than a bf16 one); a dtype not named: 1.",
    )
    layer_us_per_step: float = Field(
        default=0.0,
        ge=0,
        description="GPU time per layer per step outside the GEMM and attention roofline: norms, RoPE, activations, "
        "quantization and the gaps between kernels (the elementwise work); 0: not modelled.",
    )
    layer_us_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="Extra GPU time per layer and step when the linear layers are of this dtype (FP8 W8A8: the "
        "activations quantized before each GEMM, the scaled GEMMs' own overhead); a dtype not named: 0.",
    )
    allreduce_efficiency: float = Field(gt=0, le=1, description="Achieved / link bandwidth in collectives.")
    eager_ms_per_step: float = Field(ge=0, description="Launch overhead of a decode step run without CUDA graph.")
    prefill_us_per_token: float = Field(
        ge=0, description="Per-token prefill work outside the GEMM roofline (attention and indexer, KV pages)."
    )
    power_activity: float = Field(
        gt=0, le=1, description="Power above idle per unit of activity (memory use + weighted tensor use)."
    )
    power_compute_weight: float = Field(
        default=5.0,
        gt=0,
        description="The tensor cores at their peak rate draw this many times what the memory at its peak bandwidth "
        "draws (activity = this x tensor use + memory use).",
    )

    def gemm_efficiency(self, m: float, n: float) -> float:
        """Achieved / peak tensor throughput of a GEMM with m rows and output width n (the compute side)."""
        return self.gemm_efficiency_max * m / (m + self.gemm_m_half) * n / (n + self.gemm_n_half)

    def gemm_stream_efficiency(self, n: float, dtype: str | None = None) -> float:
        """Achieved / peak memory bandwidth of a GEMM's weight reads at output width n (the memory side), for
        weights of `dtype` (None: any)."""
        base = self.bandwidth_efficiency if self.gemm_bandwidth_efficiency is None else self.gemm_bandwidth_efficiency
        base *= self.gemm_stream_by_dtype.get(dtype, 1.0) if dtype is not None else 1.0
        return base * n / (n + self.gemm_bandwidth_n_half) if self.gemm_bandwidth_n_half > 0 else base


class Fault(_Profile):
    """A known failure, declared as data: when it happens and what the engine prints."""

    name: str
    description: str
    phase: Literal["startup", "load"] = Field(description="Whether it stops the launch or a running server.")
    when: dict[str, int | float | str] = Field(
        description="Conditions, all of which must hold: min_ep_size, model_kind, min_running_requests, max_kv_tokens."
    )
    log: str = Field(description="The line the engine logs when it fails.")
    classify: str = Field(description="The crash class pivot records, e.g. cuda-error, oom.")


class HardwareProfile(_Profile):
    """One GPU model (or this host's CPU): memory, bandwidth, peak throughput per dtype, power, interconnect,
    calibration. A shipped profile has every figure; one pivot generated (tools/profiles/generated.py: NVML's GPU and
    a table of datasheet peaks, or the CPU) leaves unknown what it does not know, and has no calibration: the twin
    needs one, the analysis uses what is there and names what is not."""

    name: str
    title: str
    kind: Literal["gpu", "cpu"] = "gpu"
    arch: str = ""
    sms: int | None = None
    memory_gib: float = Field(gt=0)
    memory_bandwidth_gbs: float | None = Field(default=None, gt=0)
    tdp_w: float | None = Field(default=None, gt=0)
    idle_w: float | None = Field(default=None, ge=0)
    power_limit_min_w: float | None = Field(
        default=None,
        gt=0,
        description="The lowest power limit the driver accepts (NVML's constraints); the twin refuses limits below "
        "it and above tdp_w. None: half the TDP.",
    )
    sm_clock_mhz: float | None = Field(default=None, gt=0, description="The SM clock at full speed (boost), in MHz.")
    smem_per_block_kib: float | None = Field(default=None, gt=0)
    l2_mib: float | None = Field(default=None, gt=0)
    auto_mem_fraction_static: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="What SGLang's memory hook picks for --mem-fraction-static on this GPU at TP >= 4.",
    )
    dense_tflops: dict[str, float] = Field(
        default_factory=dict, description="Dense tensor-core peak per dtype (fp4, fp8, bf16); empty: not known."
    )
    interconnect: Interconnect | None = None
    calibration: Calibration | None = None
    faults: list[Fault] = []
    source: str = Field(default="", description="Where the figures come from when pivot generated the profile.")

    @property
    def calibrated(self) -> bool:
        """Whether the twin can run on this hardware (it needs the fitted scalars and every figure they scale)."""
        return (
            self.calibration is not None
            and self.interconnect is not None
            and self.memory_bandwidth_gbs is not None
            and "bf16" in self.dense_tflops
            and self.tdp_w is not None
            and self.idle_w is not None
            and self.auto_mem_fraction_static is not None
        )

    @property
    def has_roofline(self) -> bool:
        """Whether a roofline can be drawn: the peak memory bandwidth and a BF16 peak are known."""
        return self.memory_bandwidth_gbs is not None and "bf16" in self.dense_tflops

    def unknown(self) -> list[str]:
        """What this profile does not know, in words (for the analysis to name)."""
        out = []
        if self.memory_bandwidth_gbs is None:
            out.append("the peak memory bandwidth")
        if "bf16" not in self.dense_tflops:
            out.append("the peak compute throughput")
        if self.tdp_w is None:
            out.append("the power limit")
        if self.calibration is None:
            out.append("the twin's calibration")
        return out

    @property
    def power_limit_range_w(self) -> tuple[float, float]:
        """(lowest, highest) power limit a GPU of this kind takes."""
        tdp = self.tdp_w or 0.0  # the twin, the only reader, needs a calibrated profile (which has a TDP)
        return (self.power_limit_min_w or tdp / 2), tdp

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak for a weight dtype; NVFP4 runs on the FP4 units, and a missing dtype falls back to BF16."""
        key = "fp4" if dtype == "nvfp4" else dtype
        if key in self.dense_tflops:
            return self.dense_tflops[key]
        if key == "fp4" and "fp8" in self.dense_tflops:  # no FP4 units (Hopper): FP4 weights run at FP8 rate
            return self.dense_tflops["fp8"]
        return self.dense_tflops["bf16"]


class ParamPart(_Profile):
    """A group of parameters with one dtype and one way of being laid out across GPUs."""

    name: str
    params: float = Field(gt=0)
    dtype: str
    kind: Literal["experts", "dense", "embedding"]
    replicated: bool = Field(default=False, description="Held whole on every TP rank.")
    layers: Literal["all", "moe", "dense", "first", "last"] = Field(
        default="all",
        description="Where it lives: spread over all layers, over the MoE layers only (shared experts), over the "
        "dense layers only (the dense MLP of the first non-MoE layers), or once, before the first layer "
        "(embedding) or after the last (lm_head). Pipeline stages hold the share of their layers.",
    )

    @property
    def bytes_per_param(self) -> float:
        if self.dtype not in DTYPE_BYTES:
            raise PivotError(
                f"unknown dtype {self.dtype!r} in part {self.name}", hint=f"known: {', '.join(DTYPE_BYTES)}"
            )
        return DTYPE_BYTES[self.dtype]


class DenseGemm(_Profile):
    """One linear layer of every layer of a model, at TP1: what the GEMM micro-benchmarks measure for dense models."""

    name: str
    n: int = Field(gt=0, description="Output width (TP1).")
    k: int = Field(gt=0, description="Input width (TP1).")
    split: Literal["n", "k"] = Field(
        default="n",
        description="What TP splits: n for column-parallel layers (qkv, gate/up), k for row-parallel (o, down).",
    )


class ModelProfile(_Profile):
    """One model: its parts and dtypes, shape, experts, and KV cache size per token."""

    name: str
    title: str
    model_path: str
    architecture: str
    kind: Literal["moe", "dense"]
    layers: int = Field(gt=0)
    moe_layers: int = Field(ge=0)
    hidden_size: int = Field(gt=0)
    experts: int = Field(ge=0)
    experts_per_token: int = Field(ge=0)
    shared_experts: int = Field(ge=0)
    expert_ffn: int = Field(ge=0)
    context_length: int = Field(gt=0)
    attention_flops_per_ctx_token: float = Field(ge=0)
    kv_replicated_across_tp: bool
    default_kv_dtype: str
    default_page_size: int = Field(default=1, ge=1, description="KV page size SGLang picks when --page-size is unset.")
    kv_bytes_per_token: dict[str, float]
    parts: list[ParamPart]
    dense_gemms: list[DenseGemm] = Field(
        default_factory=list, description="The linear layers of one layer (TP1), for GEMM micro-benchmarks."
    )
    vocab_size: int | None = Field(default=None, gt=0, description="Token ids the model knows (config.json).")
    sliding_window: int | None = Field(
        default=None, gt=0, description="Tokens a sliding-window attention layer attends to (Mistral, Gemma)."
    )
    sliding_window_layers: int = Field(
        default=0, ge=0, description="Layers with sliding-window attention; the others attend to the whole context."
    )
    source: str = Field(default="", description="Where the figures come from when pivot generated the profile.")

    @model_validator(mode="after")
    def _layers_add_up(self) -> ModelProfile:
        if self.moe_layers > self.layers:
            raise ValueError(f"moe_layers ({self.moe_layers}) exceeds layers ({self.layers})")
        if self.sliding_window_layers > self.layers:
            raise ValueError(f"sliding_window_layers ({self.sliding_window_layers}) exceeds layers ({self.layers})")
        return self

    def kv_share(self, context: float) -> float:
        """The share of the whole-context KV (and attention work) a request of `context` tokens has: 1 without
        sliding-window layers; with them, those layers keep and read at most `sliding_window` tokens."""
        if not self.sliding_window or not self.sliding_window_layers or context <= self.sliding_window:
            return 1.0
        full = self.layers - self.sliding_window_layers
        return (full + self.sliding_window_layers * self.sliding_window / context) / self.layers

    def part(self, kind: str) -> list[ParamPart]:
        return [p for p in self.parts if p.kind == kind]

    @property
    def dense_layers(self) -> int:
        """Layers without routed experts; they come first (DeepSeek's first_k_dense_replace, GLM-5 alike)."""
        return self.layers - self.moe_layers

    def moe_layers_in(self, start: int, end: int) -> int:
        """MoE layers among layers [start, end)."""
        return max(0, end - max(start, self.dense_layers))

    def share_in(self, part: ParamPart, start: int, end: int) -> float:
        """The share of a part that the pipeline stage holding layers [start, end) holds."""
        if part.layers == "first":
            return 1.0 if start == 0 else 0.0
        if part.layers == "last":
            return 1.0 if end == self.layers else 0.0
        if part.layers == "moe":
            return self.moe_layers_in(start, end) / self.moe_layers if self.moe_layers else 0.0
        if part.layers == "dense" and self.dense_layers:
            return (end - start - self.moe_layers_in(start, end)) / self.dense_layers
        return (end - start) / self.layers

    @property
    def total_params(self) -> float:
        return sum(p.params for p in self.parts)

    @property
    def active_params(self) -> float:
        """Parameters used per token: all dense ones, and experts_per_token of the routed experts."""
        share = self.experts_per_token / self.experts if self.experts else 0.0
        return sum(p.params * (share if p.kind == "experts" else 1.0) for p in self.parts if p.kind != "embedding")

    @property
    def expert_params(self) -> float:
        """Parameters of one routed expert in one layer (gate, up and down projections)."""
        return 3 * self.hidden_size * self.expert_ffn

    def kv_bytes(self, kv_dtype: str | None = None) -> float:
        """KV bytes per token (all layers) for a KV cache dtype; `auto` means the model's default."""
        key = self.default_kv_dtype if kv_dtype in (None, "auto") else kv_dtype
        key = "bf16" if key == "bfloat16" else key
        if key not in self.kv_bytes_per_token:
            raise PivotError(
                f"model profile {self.name} has no KV size for --kv-cache-dtype {kv_dtype}",
                hint=f"known: {', '.join(self.kv_bytes_per_token)}",
            )
        return self.kv_bytes_per_token[key]


def _load(kind: str, ref: str, model: type[BaseModel]) -> BaseModel:
    from agent.plans import is_profile_path

    known = ", ".join(names(kind)) or "none"
    what = {"models": "model", "hardware": "hardware"}.get(kind, kind)
    if is_profile_path(ref):  # a file: where it was looked for is the path itself (a plan's, from its directory)
        path = Path(ref).expanduser()
        if not path.is_file():
            raise PivotError(
                f"no {what} profile file {path.resolve()}; the shipped {what} profiles: {known}",
                hint="a relative path in a plan is read from the plan file's directory; on the command line, from "
                "the current one",
            )
    else:
        path = HERE / kind / f"{ref}.toml"
        if not path.is_file():
            raise PivotError(
                f"no {what} profile {ref!r} in {HERE / kind}; the {what} profiles that exist: {known}",
                hint=f"name one of those, or give a path to a .toml {what} profile (docs/plans.md, Profiles)",
            )
    try:
        return model.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except tomllib.TOMLDecodeError as e:
        raise PivotError(f"{path}: not valid TOML: {e}") from e
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        field = ".".join(str(p) for p in err["loc"])
        raise PivotError(f"{path}: {field}: {err['msg']}") from e


@cache
def load_hardware(ref: str) -> HardwareProfile:
    """A hardware profile by name (e.g. `h200`) or path."""
    return _load("hardware", ref, HardwareProfile)  # type: ignore[return-value]


@cache
def load_model(ref: str) -> ModelProfile:
    """A model profile by name (e.g. `glm-5-nvfp4`) or path."""
    return _load("models", ref, ModelProfile)  # type: ignore[return-value]


def model_for(model_profile: str | None, model_path: str) -> ModelProfile:
    """A target's model profile: `model_profile` when the plan names one, else the shipped profile that serves
    `model_path`; a PivotError naming the profiles when there is none."""
    if model_profile:
        return load_model(model_profile)
    for name in names("models"):
        profile = load_model(name)
        if profile.model_path == model_path:
            return profile
    raise PivotError(
        f"no model profile for {model_path}",
        hint="set target.model_profile in the plan to one of: " + ", ".join(names("models")),
    )


def names(kind: str) -> list[str]:
    """The shipped profiles of a kind (`hardware` or `models`)."""
    return sorted(p.stem for p in (HERE / kind).glob("*.toml"))
