"""`--mcp FILE`, `--mcp-instructions` and `--investigator-model` of `pivot demo/run/resume/chat`: MCP servers' tools
for the agent and the model of its investigations, kept with the session so a resume uses them again."""

from __future__ import annotations

from typing import Any

import click

from agent.console import err
from agent.defaults import setting
from agent.errors import PivotError

OFF = ("off", "none", "")


def _mcp_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """The file checked now (before any session is recorded) and kept as its absolute path; `off` on resume."""
    if value is None or value.lower() in OFF:
        return value
    from agent.mcp.config import load_config, resolve_path

    specs = load_config(value)
    path = str(resolve_path(value))
    err.print(f"MCP servers from {path}: {', '.join(s.name for s in specs) or '(none enabled)'}", highlight=False)
    return path


def mcp_options(*, resume: bool = False) -> list[Any]:
    """The options, as click decorators (on resume they default to what the session keeps)."""
    keep = " Default: the session's." if resume else ""
    return [
        click.option(
            "--mcp",
            "mcp",
            metavar="FILE",
            callback=_mcp_file,
            help="An `mcpServers` JSON file (as Claude Code's or Cursor's): its servers' tools are given to the "
            "agent's model, prefixed by server name, behind the method's guard. Only the path is kept with the "
            "session." + (" `off` drops them." if resume else ""),
        ),
        click.option(
            "--mcp-instructions/--no-mcp-instructions",
            "mcp_instructions",
            default=None if resume else setting("mcp_instructions"),
            help="Give the model the MCP servers' own instructions too (off unless asked)." + keep,
        ),
        click.option(
            "--investigator-model",
            "investigator_model",
            metavar="MODEL",
            help="The model of sub-agent investigations (a pydantic-ai model string, autopilot, script:FILE.jsonl). "
            "Default: the session's model." + keep,
        ),
    ]


def with_mcp_options(f: Any, *, resume: bool = False) -> Any:
    for decorator in reversed(mcp_options(resume=resume)):
        f = decorator(f)
    return f


def check_investigator(name: str | None, base_url: str | None = None) -> None:
    """A provider model for investigations is built now, so a missing key is an error before anything runs."""
    from agent import loop

    if name and name not in (loop.AUTOPILOT, "investigator"):
        loop.provider_model(name, base_url)


def settings_update(mcp: str | None, mcp_instructions: bool | None, investigator_model: str | None) -> dict[str, Any]:
    """The session settings these options change (none given: none)."""
    update: dict[str, Any] = {}
    if mcp is not None:
        update["mcp_config"] = None if mcp.lower() in OFF else mcp
    if mcp_instructions is not None:
        update["mcp_instructions"] = mcp_instructions
    if investigator_model is not None:
        check_investigator(investigator_model)
        update["investigator_model"] = investigator_model
    return update


def apply_to_session(session: Any, update: dict[str, Any]) -> None:
    """Record the changed settings on an open session (what the next runs use)."""
    if not update:
        return
    settings = session.settings.model_copy(update=update)
    if settings != session.settings:
        session.store.set_session_settings(session.id, settings)
        session.refresh()


def require_session_for(update: dict[str, Any], has_session: bool) -> None:
    if update and not has_session:
        raise PivotError(
            "--mcp, --mcp-instructions and --investigator-model apply to a session: give SESSION or --demo",
            hint="or set them with `pivot resume SESSION --mcp FILE` first; a session keeps them",
        )
