"""The predictor contract: what an engine offers to foresee a configuration's numbers without a launch.

The search ranks candidates by a predictor's readings, corrected to the campaign's own measurements; the autopilot's
pivot options and the documents quote them. An engine that has none (a real engine pivot has no calibrated model
of: vLLM, a plugin's engine) returns None from `Engine.predictor`, and the search measures instead. A prediction is
never a measurement: everything that shows one says it was predicted, and by what.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agent import models as m


@dataclass(frozen=True)
class Prediction:
    """What a predictor says one configuration does at one level of a workload (noise-free)."""

    level: m.BenchLevel | None = None  # the predicted level (bench_serving's keys); None when there is no reading
    crashed: bool = False  # the server would not start, or its requests fail at this level
    error: str | None = None  # why there is no reading (refused flags, a startup fault, a missing profile)
    not_modelled: tuple[str, ...] = ()  # dests of the flags the predictor accepts but does not model
    no_effect: tuple[str, ...] = ()  # dests of the flags it models as having no effect here

    @property
    def tok_s(self) -> float | None:
        """Output tok/s at the level; None when it crashed, did not start or completed nothing."""
        if self.crashed or self.level is None or self.level.completed == 0:
            return None
        return self.level.output_throughput


@runtime_checkable
class Predictor(Protocol):
    """Foresees a configuration's level without launching it; deterministic, and cheap after the first call."""

    name: str  # what predicts, in words, e.g. "the SGLang twin (GLM-5 NVFP4 on 8x RTX PRO 6000)"

    def predict(self, config: m.ServerConfig, spec: m.BenchSpec, level: int) -> Prediction:
        """`config` under `spec` at concurrency `level`: its level, or why there is none."""
        ...
