"""The `sim-http` engine: the sglang engine launching the twin's HTTP server (`pivot sim serve`) as a real process.

    engine = SimHttpEngine(time_scale=50)   # python -m agent.cli sim serve --time-scale 50 ... -- FLAGS --host --port

Every code path of the real engine (argv, process, readiness, streaming, crash classification, stop) runs; every
number it gives is simulated, with latencies and throughputs on the wall clock `time_scale` times faster.
"""

from __future__ import annotations

import sys
from typing import ClassVar

from pydantic import Field

from agent import models as m
from agent.contracts import EngineOptions
from tools.engines.sglang import SGLangEngine, SGLangOptions
from tools.engines.sim.options import DEFAULT_STARTUP_S, DEFAULT_TIME_SCALE, TwinOptions

READY_SLACK_S = 120.0  # a launch may take startup_s plus this before it counts as failed


class SimHttpOptions(SGLangOptions, TwinOptions):
    """The sim-http engine's options: the twin's, how fast its clock runs, and the sglang engine's."""

    name: str = Field("sim-http", description="The engine's name in the ledger and in messages.")
    time_scale: float = Field(DEFAULT_TIME_SCALE, ge=0.001, le=10_000, allow_inf_nan=False,
                              description="Simulated seconds per wall second.")  # fmt: skip
    startup_s: float = Field(DEFAULT_STARTUP_S, ge=0, le=3600, allow_inf_nan=False,
                             description="Wall seconds of 503s before it is ready.")  # fmt: skip
    seed: int = Field(0, ge=0, le=2**31 - 1, description="The seed of the step-time noise (the agent seeds each "
                      "experiment).")  # fmt: skip
    require_model: bool = Field(False, description="The twin needs no model path.")
    source: m.Source = Field("simulated", description="Its numbers are simulated.")
    stop_grace_s: float = Field(10.0, ge=0, description="SIGTERM to SIGKILL.")


class SimHttpEngine(SGLangEngine):
    """The digital twin served over HTTP as a real process, driven exactly as SGLang is."""

    Options: ClassVar[type[EngineOptions] | None] = SimHttpOptions

    def __init__(self, **options: object) -> None:
        """Options (SimHttpOptions): the twin's (`model_profile`, `hardware`, `gpus`, `noise`, `seed`), its clock
        (`time_scale`, `startup_s`) and the sglang engine's; the launch command is `pivot sim serve` with them."""
        o = self.setup(options)
        assert isinstance(o, SimHttpOptions)
        command = [
            o.python or sys.executable, "-m", "agent.cli", "sim", "serve",
            "--model-profile", o.model_profile, "--hardware", o.hardware, "--gpus", str(o.gpus),
            "--time-scale", repr(o.time_scale), "--startup-s", repr(o.startup_s),
            "--noise", repr(o.noise), "--seed", str(o.seed), "--",
        ]  # fmt: skip
        derived: dict[str, object] = {
            "command": command,
            "twin": (o.model_profile, o.hardware, o.gpus),
            "warmup_pause_s": 1.0 / o.time_scale,
            "ready_timeout_s": o.startup_s + READY_SLACK_S,
        }
        self._apply(o.model_copy(update={k: v for k, v in derived.items() if k not in o.model_fields_set}))


def sim_http_engine(**options: object) -> SimHttpEngine:
    """The sim-http engine with `options` (SimHttpOptions)."""
    return SimHttpEngine(**options)
