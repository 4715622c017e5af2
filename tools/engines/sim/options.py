"""The digital twin's options, one home for their defaults: the engines `sim` and `sim-http`, `pivot sim` and the
sessions that run on the twin all read them from here.

The defaults are the seeds' campaign (GLM-5 NVFP4 on 8x RTX PRO 6000 Blackwell), the one the twin is calibrated on.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import Field, field_validator

from agent.contracts import EngineOptions
from agent.errors import PivotError

DEFAULT_MODEL_PROFILE = "glm-5-nvfp4"
DEFAULT_HARDWARE = "rtx-pro-6000-blackwell"
DEFAULT_GPUS = 8
# `sim-http`: simulated seconds per wall second, and wall seconds of 503s before it is ready (a campaign of many
# launches stays quick; `pivot sim serve` run by hand keeps the wall clock, 1.0)
DEFAULT_TIME_SCALE = 20.0
DEFAULT_STARTUP_S = 0.5

# The twin's knobs and the values it can run with: (low, high) inclusive; a NaN or infinity is never one.
TWIN_OPTION_RANGES: dict[str, tuple[float, float]] = {
    "time_scale": (0.001, 10_000.0),
    "startup_s": (0.0, 3600.0),
    "noise": (0.0, 0.5),
    "seed": (0, 2**31 - 1),
    "gpus": (1, 1024),
}


def check_twin_options(**values: object) -> None:
    """Raise PivotError naming the first of the twin's options (time_scale, startup_s, noise, seed, gpus) that is
    not a finite number in its range, so a bad value is refused before a server or a session exists."""
    for name, value in values.items():
        low, high = TWIN_OPTION_RANGES[name]
        whole = name in ("seed", "gpus")
        try:
            number = float(value) if not isinstance(value, bool) else math.nan  # type: ignore[arg-type]
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and low <= number <= high and (not whole or number.is_integer())):
            kind = "a whole number" if whole else "a number"
            raise PivotError(
                f"the twin's {name} {value!r} is not {kind} from {low:g} to {high:g}",
                hint=f"e.g. -o {name}={TWIN_OPTION_EXAMPLES[name]}",
            )


TWIN_OPTION_EXAMPLES = {"time_scale": "20", "startup_s": "0.5", "noise": "0.015", "seed": "0", "gpus": "8"}


class TwinOptions(EngineOptions):
    """What the twin simulates: a model profile on some GPUs of a hardware profile, with run-to-run noise."""

    model_profile: str = Field(DEFAULT_MODEL_PROFILE, description="The model profile (tools/profiles/models).")
    hardware: str = Field(DEFAULT_HARDWARE, description="The hardware profile (tools/profiles/hardware).")
    gpus: int = Field(DEFAULT_GPUS, ge=1, le=1024, description="GPUs on the simulated host.")
    noise: float = Field(0.0, ge=0, le=0.5, allow_inf_nan=False, description="Run-to-run variation (0.02 is about 2%).")


class SimOptions(TwinOptions):
    """The `sim` engine's options (the twin in process, in virtual time)."""

    seed: int | None = Field(
        None, ge=0, le=2**31 - 1, description="The noise seed (the agent seeds each experiment on its own)."
    )
    truth: str | None = Field(
        None,
        max_length=4096,
        description="A truth file (tools/engines/sim/truth.py): measure the target as it has it, flags without "
        "effect, flags that cost, the GPU unlike its profile; the predictor stays the stock twin.",
    )

    @field_validator("truth")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        """A session resumed from another folder reads the same file."""
        return str(Path(value).expanduser().absolute()) if value else None


def twin_defaults() -> dict[str, object]:
    """The twin's options' defaults by name (for a command line's defaults)."""
    return {name: f.default for name, f in TwinOptions.model_fields.items()}
