"""`pivot chat`: the terminal UI (agent/tui) on a session, a new demo session, or a picker of both."""

from __future__ import annotations

import sys

import click

from agent.cli.mcp_options import apply_to_session, require_session_for, settings_update, with_mcp_options
from agent.errors import PivotError


def _session_mcp_options(f):
    return with_mcp_options(f, resume=True)  # they change the session opened; none given: as it is


@click.command()
@click.argument("session_ref", metavar="[SESSION]", required=False)
@click.option(
    "--demo", is_flag=True, help="Start the demo session (as `pivot demo` does) and run it to its first pivot."
)
@_session_mcp_options
@click.pass_context
def chat(
    ctx: click.Context,
    session_ref: str | None,
    demo: bool,
    mcp: str | None,
    mcp_instructions: bool | None,
    investigator_model: str | None,
) -> None:
    """Chat with the agent of SESSION in a terminal UI: the conversation, the todo list and the experiments, the
    server and GPU power while it runs, and its pivots as buttons.

    Without SESSION, a picker lists the sessions (resume one) and the plans (start one on the sim engine, with
    `pivot run PLAN`'s defaults). Keys: Escape cancels the running step (the server stops; the session can be
    resumed), ctrl+r opens the latest status summary, ctrl+g goes on after a cancel, ctrl+t hides the side
    panel, ctrl+q quits.
    """
    if session_ref and demo:
        raise PivotError("give SESSION or --demo, not both")
    update = settings_update(mcp, mcp_instructions, investigator_model)
    require_session_for(update, bool(session_ref or demo))
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise PivotError(
            "pivot chat needs a terminal", hint="`pivot demo`, `pivot run` and `pivot resume` work without one"
        )
    from agent.tui.app import PivotApp
    from agent.tui.controller import ChatController
    from tools.engines.process import install_signal_handlers

    home = ctx.obj
    controller = ChatController(home.paths, home.store)
    try:
        if demo:
            controller.create("", demo=True)
        elif session_ref:
            controller.open(session_ref)
        if controller.session is not None:
            apply_to_session(controller.session, update)
        install_signal_handlers()  # servers launched from the agent's threads are stopped on SIGTERM too
        PivotApp(controller, autorun=demo).run()
    finally:
        controller.close()
