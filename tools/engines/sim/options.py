"""The digital twin's options, one home for their defaults: the engines `sim` and `sim-http`, `pivot sim` and the
sessions that run on the twin all read them from here.

The defaults are the seeds' campaign (GLM-5 NVFP4 on 8x RTX PRO 6000 Blackwell), the one the twin is calibrated on.
"""

from __future__ import annotations

from pydantic import Field

from agent.contracts import EngineOptions

DEFAULT_MODEL_PROFILE = "glm-5-nvfp4"
DEFAULT_HARDWARE = "rtx-pro-6000-blackwell"
DEFAULT_GPUS = 8
# `sim-http`: simulated seconds per wall second, and wall seconds of 503s before it is ready (a campaign of many
# launches stays quick; `pivot sim serve` run by hand keeps the wall clock, 1.0)
DEFAULT_TIME_SCALE = 20.0
DEFAULT_STARTUP_S = 0.5


class TwinOptions(EngineOptions):
    """What the twin simulates: a model profile on some GPUs of a hardware profile, with run-to-run noise."""

    model_profile: str = Field(DEFAULT_MODEL_PROFILE, description="The model profile (tools/profiles/models).")
    hardware: str = Field(DEFAULT_HARDWARE, description="The hardware profile (tools/profiles/hardware).")
    gpus: int = Field(DEFAULT_GPUS, ge=1, description="GPUs on the simulated host.")
    noise: float = Field(0.0, ge=0, description="Run-to-run variation (0.02 is about 2%).")


class SimOptions(TwinOptions):
    """The `sim` engine's options (the twin in process, in virtual time)."""

    seed: int | None = Field(None, description="The noise seed (the agent seeds each experiment on its own).")


def twin_defaults() -> dict[str, object]:
    """The twin's options' defaults by name (for a command line's defaults)."""
    return {name: f.default for name, f in TwinOptions.model_fields.items()}
