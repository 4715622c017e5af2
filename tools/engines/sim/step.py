"""One engine step as the twin costs it (`pivot sim step`): the GPU's time by component, the host's, the step as the
engine runs it, and the power and clock it runs at. Simulated, not measured: the figures the step benchmark
(`pivot microbench --step`, on a GPU host) is held against.

    step = step_cost("llama-3.3-70b-fp8", "h200", tp=1, batch=64, context=4096)
    step.as_json()   # {"gpu_ms": ..., "host_ms": ..., "step_ms": ..., "power_w": ..., "breakdown_ms": {...}}

A decode step of `batch` requests each holding `context` tokens of KV (CUDA graphs on, SGLang's overlap scheduler:
the host's work hides behind the GPU's when it is shorter); with `prefill_tokens`, one prefill step of that many
prompt tokens (one request) beside it. Elementwise work (norms, RoPE, activations, quantization, the gaps between
kernels) is the hardware profile's `layer_us_per_step` per layer, where it has one (fitted to whole measured steps by
`pivot calibrate`); without one its time is null, said so in `notes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import models as m
from agent.errors import PivotError
from tools.engines.sim.costmodel import StepCost
from tools.profiles import HardwareProfile, ModelProfile, load_hardware, load_model


def resolve_model(ref: str) -> ModelProfile:
    """A model profile from a shipped profile's name, a profile file, or a model folder with a config.json (as a
    plan's target resolves it), or that config.json itself."""
    folder = Path(ref).expanduser()
    if folder.is_file() and folder.name.endswith(".json"):  # the config.json given itself: its folder is the model
        folder = folder.parent
    if folder.is_dir():
        from tools.profiles.generated import model_from_config

        config = folder / "config.json"
        if not config.is_file():
            raise PivotError(f"{folder} has no config.json", hint="name a model profile, or a model folder")
        return model_from_config(config, str(folder))
    return load_model(ref)


@dataclass
class StepReport:
    model: str
    hardware: str
    tp: int
    batch: int
    context: int
    decode: StepCost
    host_s: float
    power_w: float
    clock_share: float
    overlap: bool
    prefill_tokens: int | None = None
    prefill: StepCost | None = None
    notes: list[str] = field(default_factory=list)
    elementwise: bool = False  # the profile models it (layer_us_per_step)

    @property
    def gpu_s(self) -> float:
        d = self.decode
        return d.expert_gemm_s + d.dense_gemm_s + d.attention_s + d.communication_s + d.elementwise_s

    def as_json(self) -> dict[str, Any]:
        d = self.decode
        ms = lambda s: round(s * 1e3, 4)  # noqa: E731
        out: dict[str, Any] = {
            "source": "simulated",
            "model": self.model,
            "hardware": self.hardware,
            "tp": self.tp,
            "batch": self.batch,
            "context": self.context,
            "gpu_ms": ms(self.gpu_s),
            "host_ms": ms(self.host_s),
            "step_ms": ms(d.total_s),
            "overlap": self.overlap,
            "breakdown_ms": {
                "dense_gemm": ms(d.dense_gemm_s),
                "expert_gemm": ms(d.expert_gemm_s),
                "attention": ms(d.attention_s),
                "communication": ms(d.communication_s),
                "elementwise": ms(d.elementwise_s) if self.elementwise else None,  # None: not modelled (notes)
                "host_wait": ms(d.host_s),
                "eager": ms(d.eager_s),
            },
            "tensor_util": round(d.tensor_s / d.total_s, 4) if d.total_s > 0 else None,
            "memory_util": round(d.memory_s / d.total_s, 4) if d.total_s > 0 else None,
            "power_w": round(self.power_w, 1),
            "clock_share": self.clock_share,
            "tokens_per_s": round(self.batch / d.total_s, 2) if d.total_s > 0 else None,
            "notes": self.notes,
        }
        if self.prefill is not None:
            p = self.prefill
            out["prefill"] = {
                "tokens": self.prefill_tokens,
                "step_ms": ms(p.total_s),
                "gpu_ms": ms(p.expert_gemm_s + p.dense_gemm_s + p.attention_s + p.communication_s + p.elementwise_s),
                "breakdown_ms": {k: ms(v) for k, v in p.breakdown().items()},
            }
        return out


def step_cost(model: str | ModelProfile, hardware: str | HardwareProfile, *, tp: int = 1, batch: int, context: int,
              prefill_tokens: int | None = None, flags: tuple[str, ...] = ()) -> StepReport:  # fmt: skip
    """The twin's cost of one decode step (and of one prefill step with `prefill_tokens`); see the module."""
    from tools.engines.catalog import CatalogError
    from tools.engines.sim.twin import Twin, TwinStartupError

    if batch < 1 or context < 1:
        raise PivotError("the batch and the context are at least 1")
    profile = resolve_model(model) if isinstance(model, str) else model
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    config = m.ServerConfig.parse(["--tp-size", str(tp), *flags])
    try:
        twin = Twin.build(profile, hw, tp, config)
    except CatalogError as e:
        raise PivotError(f"SGLang would refuse these flags: {e.message}", hint=e.hint) from e
    except TwinStartupError as e:
        raise PivotError(f"the server would not start: {e.message}", hint=f"SGLang logs: {e.log}") from e
    cost = twin.cost
    decode = cost.decode(batch, float(batch * context))
    cal = cost.cal
    host = cal.host_ms_per_step * 1e-3 + cal.host_us_per_request * 1e-6 * batch
    power = cost.power_w(decode.tensor_s / decode.total_s, decode.memory_s / decode.total_s)
    elementwise = cal.layer_us_per_step > 0 or bool(cal.layer_us_by_dtype)
    notes = [] if elementwise else ["elementwise work (norms, RoPE, activations, quantization) is not modelled apart"]
    if batch > twin.limits.max_running_requests:
        notes.append(f"batch {batch} is above the server's max running requests ({twin.limits.max_running_requests})")
    if context * batch > twin.limits.kv_capacity_tokens:
        notes.append(f"{batch} x {context} tokens exceed the KV pool ({twin.limits.kv_capacity_tokens:,} tokens)")
    prefill = None
    if prefill_tokens:
        prefill = cost.prefill(prefill_tokens, prefill_tokens * (prefill_tokens + 1) / 2, 1)
    return StepReport(model=profile.name, hardware=hw.name, tp=tp, batch=batch, context=context, decode=decode,
                      host_s=host, power_w=power, clock_share=cost.clock, overlap=twin.par.overlap_schedule,
                      prefill_tokens=prefill_tokens, prefill=prefill, notes=notes, elementwise=elementwise)  # fmt: skip
