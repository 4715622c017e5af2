"""How the CLI (`pivot demo/run`) and the TUI (`pivot chat`) build a new session's settings, from one set of defaults.

The method's thresholds are `models.SessionSettings`' field defaults (`setting(name)`); what is not a session
setting (the demo's plan and noise, the default engine and model) is `agent.settings` (PIVOT_* in the environment);
the twin's options are the engines' own (tools/engines/sim/options.py). Neither the CLI's options nor the TUI keep a
copy, and the TUI never imports the CLI to learn them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent import models as m
from agent.errors import PivotError
from agent.settings import settings

SIMULATED = ("sim", "sim-http")  # the engines that take the plan's model profile, hardware and GPU count

# The method's command-line options (`pivot demo/run`) and the settings they set.
METHOD_SETTINGS = {
    "min_gain": "min_gain_pct",
    "reruns": "reruns",
    "stall_after": "stall_after",
    "seed": "seed",
    "request_limit": "request_limit",
    "search_kind": "proposer",  # `--search KIND`; `--no-search` (plan-order) and the `search` setting follow it
    "paired": "paired",
    "max_launches": "max_launches",
    "fit_twin": "fit_twin",
    "parallel": "parallel",
    "ray": "executor",
    "ray_gpus": "ray_gpus",
    "mcp": "mcp_config",
    "mcp_instructions": "mcp_instructions",
    "investigator_model": "investigator_model",
}


def setting(name: str) -> Any:
    """A session setting's default (`SessionSettings.<name>`), e.g. for a command-line option's default."""
    return m.SessionSettings.model_fields[name].default


def default_model(model: str | None) -> str:
    """The model a session is driven by: the one given, else $PIVOT_MODEL, else the built-in autopilot."""
    return settings(model=model or None).model


def default_engine() -> str:
    """The engine of a new campaign: $PIVOT_ENGINE, else the in-process twin (sim)."""
    return settings().engine


def demo() -> tuple[str, float]:
    """`pivot demo`'s plan and the noise of its simulated engine ($PIVOT_DEMO_PLAN, $PIVOT_DEMO_NOISE)."""
    s = settings()
    return s.demo_plan, s.demo_noise


def session_settings(
    target: m.Target, engine: str, options: dict[str, Any], noise: float | None, method: Mapping[str, Any]
) -> m.SessionSettings:
    """A new session's settings: the method's thresholds given in `method` (keyed by the command-line option's
    name, see METHOD_SETTINGS; one not given keeps its default) and the engine's options (the simulated engines get
    the plan's model profile, hardware and GPU count unless told otherwise)."""
    opts = dict(options)
    if engine in SIMULATED and not (opts.get("hardware") or target.hardware):
        raise PivotError(
            f"the {engine} engine simulates named hardware: the plan's target.hardware is not set",
            hint="name a hardware profile in the plan (tools/profiles/hardware/), or -o hardware=NAME",
        )
    if engine in SIMULATED:
        if target.model_profile:
            opts.setdefault("model_profile", target.model_profile)
        opts.setdefault("hardware", target.hardware)
        opts.setdefault("gpus", target.gpus)
        if noise is not None:
            opts.setdefault("noise", noise)
    elif noise is not None:
        raise PivotError("--noise applies to the simulated engines (sim, sim-http) only")
    for key in ("api_key", "token", "password", "secret"):
        if any(key in k.lower() for k in opts):
            raise PivotError("engine options are stored in the ledger: pass secrets through the environment")
    given = {field: method[option] for option, field in METHOD_SETTINGS.items() if method.get(option) is not None}
    kind = "plan-order" if method.get("no_search") else method.get("search_kind")
    if kind is not None:  # `--search KIND` (`--no-search`: plan-order): the proposer, and the twin's rules with it
        given["proposer"], given["search"] = kind, kind != "plan-order"
        from tools.peers import check_available

        check_available(kind)
    if engine in SIMULATED and given.get("executor") == "local" and given.get("ray_gpus") is None:
        given["ray_gpus"] = simulated_gpus(int(opts.get("gpus") or target.gpus), int(given.get("parallel") or 1))
    return m.SessionSettings(**given, engine_options=opts)


def simulated_gpus(gpus: int, parallel: int) -> int:
    """The GPUs a local Ray instance offers a simulated engine: its GPUs are the plan's (the twin simulates them),
    enough for `parallel` experiments of the plan's size at once; Ray would detect none on a host without GPUs."""
    return gpus * max(parallel, 1)
