"""A truth for the twin: the target as it really behaves where that differs from what the twin believes.

The `sim` engine measures with the twin; with `-o truth=FILE` it measures with the twin *changed by the truth*
while its predictor (what the search ranks by) stays the plan's own stock twin. That is how a campaign is
rehearsed against a twin that is wrong in structure, as it is on a real GPU (benchmarks/wrong_twin.py):

    name = "s2-cost"
    description = "the twin calls --chunked-prefill-size 4096 neutral; on this target it costs 8%"

    [[flags]]                       # a flag the target ignores: it is dropped before the twin resolves the flags
    flag = "--kv-cache-dtype"
    value = "fp8_e4m3"              # optional: only this value (else any)
    no_effect = true

    [[flags]]                       # a flag that costs (or gains): every step runs 1 / throughput_scale as long
    flag = "--chunked-prefill-size"
    throughput_scale = 0.92

    [[interactions]]                # flags that cost (or gain) together: every step 1 / throughput_scale as long
    throughput_scale = 0.85         #   with them all set (none alone does); each flag as in [[flags]]
    flags = [{ flag = "--enable-mixed-chunk" }, { flag = "--num-continuous-decode-steps", value = "4" }]

    [hardware]                      # the target's GPU unlike its profile
    profile = "h200"                # optional: another profile (a name or a file); else the engine's
    [hardware.scale]                # a profile's figures multiplied: dotted names, as in the profile's file
    "calibration.host_ms_per_step" = 2.0
    "calibration.gemm_m_half" = 1.43  # GEMM efficiency at small row counts x 1/1.43 (-30%): eff ~ m / m_half

A throughput scale slows (or speeds) every part of a step alike: every peak of the hardware (tensor throughput,
memory and link bandwidth) is multiplied by it and every fixed time (host work per step and per request, eager
launches, per-token prefill work, link latency) divided by it, so each step's time is divided by the scale and
the power (work per unit of time at each peak) is unchanged. The KV pool and the limits are those of the flags.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent import models as m
from agent.errors import PivotError
from tools.profiles import HardwareProfile, load_hardware


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FlagMatch(_Strict):
    """A flag as a truth names it: by its name, and optionally its value."""

    flag: str = Field(pattern=r"^--?[A-Za-z0-9][A-Za-z0-9_.-]*$", description="The flag, with its dashes.")
    value: str | None = Field(None, description="Only when the flag has this value (else any value).")

    def matches(self, flag: m.Flag) -> bool:
        if flag.name != self.flag:
            return False
        if self.value is None:
            return True
        value = flag.value if isinstance(flag.value, str) or flag.value is None else " ".join(flag.value)
        return value == self.value


class FlagEffect(FlagMatch):
    """What one flag really does on the target, where the twin believes otherwise."""

    no_effect: bool = Field(False, description="The target ignores the flag: it is dropped before the twin runs.")
    throughput_scale: float = Field(
        1.0, gt=0.05, le=20.0, allow_inf_nan=False, description="Every step runs 1 / this as long (0.92: costs 8%)."
    )

    @model_validator(mode="after")
    def _one_effect(self) -> FlagEffect:
        if self.no_effect == (self.throughput_scale != 1.0):
            if self.no_effect:
                raise ValueError(f"{self.flag}: no_effect and throughput_scale are two effects: give one")
            raise ValueError(f"{self.flag}: give its effect (no_effect = true, or a throughput_scale other than 1)")
        return self


class Interaction(_Strict):
    """Flags that cost (or gain) together on the target what none of them does alone: an interaction the twin does
    not model (two features that contend for the same resource)."""

    flags: tuple[FlagMatch, ...] = Field(min_length=2, description="The flags, all set for the effect to hold.")
    throughput_scale: float = Field(
        gt=0.05, le=20.0, allow_inf_nan=False, description="Every step runs 1 / this as long with them all set."
    )

    def holds(self, flags: list[m.Flag]) -> bool:
        return all(any(want.matches(f) for f in flags) for want in self.flags)


class HardwareTruth(_Strict):
    """The target's GPU where it differs from the engine's hardware profile."""

    profile: str | None = Field(None, description="Another hardware profile (a name or a file); else the engine's.")
    scale: dict[str, float] = Field(
        default_factory=dict, description="Figures of the profile multiplied, by dotted name (calibration.x, x)."
    )


class Truth(_Strict):
    """The target as it behaves, against the twin: flag effects and the hardware."""

    name: str = Field("truth", max_length=80)
    description: str = Field("", max_length=2000)
    flags: tuple[FlagEffect, ...] = ()
    interactions: tuple[Interaction, ...] = ()
    hardware: HardwareTruth = HardwareTruth()

    def apply(self, config: m.ServerConfig) -> tuple[m.ServerConfig, float]:
        """`config` as the target reads it (flags without effect dropped) and the throughput scale of the rest (the
        flags' own, and the interactions' whose flags the target reads all)."""
        kept, scale = [], 1.0
        for flag in config.flags:
            effects = [e for e in self.flags if e.matches(flag)]
            if any(e.no_effect for e in effects):
                continue
            for e in effects:
                scale *= e.throughput_scale
            kept.append(flag)
        for pair in self.interactions:
            scale *= pair.throughput_scale if pair.holds(kept) else 1.0
        return (config if len(kept) == len(config.flags) else config.model_copy(update={"flags": tuple(kept)})), scale

    def hardware_for(self, hardware: str | HardwareProfile, throughput_scale: float = 1.0) -> HardwareProfile:
        """The engine's hardware profile as this truth has it, slowed by `throughput_scale`; renamed, so nothing
        cached for the stock profile is taken for it."""
        ref = self.hardware.profile or hardware
        base = load_hardware(ref) if isinstance(ref, str) else ref
        data = base.model_dump()
        for dotted, factor in self.hardware.scale.items():
            _scale(data, dotted, factor)
        if throughput_scale != 1.0:
            _slow(data, throughput_scale)
        if not self.hardware.scale and not self.hardware.profile and throughput_scale == 1.0:
            return base
        tag = hashlib.sha256(json.dumps([self.model_dump(), throughput_scale], sort_keys=True).encode()).hexdigest()
        data["name"] = f"{base.name}~{self.name}~{tag[:10]}"
        try:
            return HardwareProfile.model_validate(data)
        except ValidationError as e:
            raise PivotError(f"the truth {self.name!r} makes the hardware profile invalid: {_first(e)}") from None


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


def _scale(data: dict[str, Any], dotted: str, factor: float) -> None:
    """Multiply the figure at `dotted` in a profile's data by `factor`; PivotError when there is no such number."""
    *path, leaf = dotted.split(".")
    node: Any = data
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    value = node.get(leaf) if isinstance(node, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PivotError(
            f"the truth scales {dotted!r}, which is not a number of the hardware profile",
            hint="e.g. calibration.host_ms_per_step, calibration.gemm_m_half, memory_bandwidth_gbs",
        )
    node[leaf] = value * factor


SPEEDS = ("memory_bandwidth_gbs",)  # multiplied by a throughput scale (with every dense_tflops and the link's)
TIMES = ("host_ms_per_step", "host_us_per_request", "eager_ms_per_step", "prefill_us_per_token")  # divided


def _slow(data: dict[str, Any], s: float) -> None:
    """Every peak times `s`, every fixed time divided by it: each step's time is divided by `s`."""
    for key in SPEEDS:
        if data.get(key) is not None:
            data[key] *= s
    data["dense_tflops"] = {k: v * s for k, v in (data.get("dense_tflops") or {}).items()}
    if data.get("interconnect"):
        data["interconnect"]["bandwidth_gbs"] *= s
        data["interconnect"]["latency_us"] /= s
    cal = data.get("calibration")
    if cal:
        for key in TIMES:
            cal[key] /= s


@cache
def load_truth(path: str) -> Truth:
    """A truth file (TOML or JSON); PivotError naming the file and the first thing wrong in it."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PivotError(f"cannot read the truth file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise PivotError(f"the truth file {path} is not text") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise PivotError(f"the truth file {path} does not parse: {e}") from None
    try:
        return Truth.model_validate(data)
    except ValidationError as e:
        raise PivotError(f"the truth file {path} is not a truth: {_first(e)}") from None
