"""pivot's settings in one object: every default the CLI, the TUI and the loop use, each overridable by a `PIVOT_*`
environment variable (PIVOT_HOME, PIVOT_MODEL, PIVOT_MODEL_RETRIES, ...) and, where a command has one, by its option.

    from agent.settings import settings
    settings().model_retries          # PIVOT_MODEL_RETRIES, else 3; a bad value is one line naming the variable

The environment is read on each call (a test, or a TUI that opens a second session, sees what is set now); a value
that does not fit is a PivotError naming the variable, never a traceback. Part of the core: it imports nothing else
of pivot but the errors.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.errors import PivotError

PREFIX = "PIVOT_"


class Settings(BaseSettings):
    """The defaults of everything a user can set without a plan: where pivot works, which model drives it, which
    engine a command starts, what the demo runs. Each field is `PIVOT_<NAME>` in the environment."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", frozen=True, validate_default=True)

    home: Path = Field(Path("."), description="Where state/ (the ledger, logs) and docs_out/ live.")
    model: str = Field(
        "autopilot",
        min_length=1,
        description="The model that drives a campaign: autopilot, provider:name, script:FILE.",
    )
    model_api_key: SecretStr | None = Field(
        None, description="The key sent to --model-base-url (read from the environment only, never stored)."
    )
    model_retries: int = Field(3, ge=0, le=100, description="Retries (with backoff) of a failed model request.")
    model_timeout_s: float = Field(
        300.0, gt=0, le=86_400, allow_inf_nan=False,
        description="Seconds one attempt at a model request may take in all (a deadline, not per read).",
    )  # fmt: skip
    engine: str = Field("sim", min_length=1, description="The engine of a new campaign (pivot run, demo, chat).")
    serve_engine: str = Field(
        "sim-http", min_length=1, description="The engine of pivot serve and launch-bench: a server you reach by URL."
    )
    audit_engine: str = Field("sglang", min_length=1, description="The engine whose flags pivot audit-flags judges.")
    demo_plan: str = Field("glm5-nvfp4-rtxpro6000x8", min_length=1, description="The plan of pivot demo and pivot sim.")
    demo_noise: float = Field(0.015, ge=0, description="Run-to-run noise of the simulated engine in pivot demo.")
    cache_dir: Path = Field(
        Path("~/.cache/pivot"), description="What pivot can rebuild: dumps of an installed engine's parser, venvs."
    )
    vllm_python: str | None = Field(
        None, description="The interpreter that has vLLM, when the vllm engine is given no python option."
    )
    update_snapshots: bool = Field(False, description="Tests: rewrite the TUI's SVG snapshots (refused under CI).")
    ci: bool = Field(False, validation_alias="CI", description="Running in CI (CI=true): snapshots never rewrite.")


def settings(**given: object) -> Settings:
    """The settings now: `given` (a command's options, None meaning not given) over the environment over the
    defaults; PivotError naming the variable (or option) whose value does not fit."""
    chosen = {k: v for k, v in given.items() if v is not None}
    try:
        return Settings(**chosen)  # type: ignore[arg-type]
    except ValidationError as e:
        raise settings_error(e, chosen) from None


def settings_error(error: ValidationError, given: dict[str, object]) -> PivotError:
    """One line for the first setting whose value does not fit: the variable (or option), the value, what it must be."""
    item = error.errors()[0]
    name = str(item["loc"][0]) if item["loc"] else "settings"
    where = f"--{name.replace('_', '-')}" if name in given else ("CI" if name == "CI" else PREFIX + name.upper())
    value = item.get("input")
    field = Settings.model_fields.get(name)
    return PivotError(
        f"{where}={value!r}: {item['msg']}",
        hint=f"{field.description} Unset {where} for the default ({field.default!r})." if field else None,
    )
