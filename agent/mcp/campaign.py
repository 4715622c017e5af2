"""A campaign step for `pivot mcp`: open the session, run the agent to its next pivot (the TUI's controller, the same
code as `pivot run` and `pivot resume`), report its events as MCP progress, and settle the ledger on a cancel.

A client that cancels the request (MCP `notifications/cancelled`) gets what Escape gives in `pivot chat`: the running
server stops now, the tool in flight records nothing it did not finish, the experiment cut short is marked
interrupted and the session stopped, so `answer_pivot`/`resume_campaign` (or `pivot resume`) goes on from there.
The session's lock is held only while a step runs. The ledger's lock is per process, and every request of this
server runs in its one process: a second step call on a session while one runs (two `answer_pivot`s, an answer and a
`resume_campaign`) is refused here, with the CLI's words, before it reads or records anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any, Literal

import anyio
from pydantic import BaseModel, Field

from agent import models as m
from agent.session import Paths
from agent.store import Store

MAX_NOTICES = 20
_STEPPING: set[str] = set()  # sessions a step call of this server is running now
_STEPPING_LOCK = threading.Lock()


@contextlib.contextmanager
def one_step_at_a_time(store: Store, session_ref: str) -> Iterator[str]:
    """Hold the session for one step call of this server; a second call meanwhile is refused (SessionLocked)."""
    from agent.errors import SessionLocked

    sid = store.get_session(session_ref).id
    with _STEPPING_LOCK:
        if sid in _STEPPING:
            raise SessionLocked(
                f"session {sid} is in use by pid {os.getpid()} (another call of this MCP server is running its step)",
                hint="wait for that call to return, or cancel it; then call again",
            )
        _STEPPING.add(sid)
    try:
        yield sid
    finally:
        with _STEPPING_LOCK:
            _STEPPING.discard(sid)


class CampaignOutcome(BaseModel):
    """Where a campaign step stopped: at a pivot (answer it with answer_pivot), finished, stopped or failed."""

    session: str
    status: Literal["pivot", "finished", "stopped", "failed", "waiting"]
    message: str
    question: str | None = Field(default=None, description="The pivot's question, when it stopped at one.")
    options: list[str] = Field(default_factory=list, description="Numbered options: answer with a number or words.")
    summary_path: str | None = Field(default=None, description="The status summary written for this pivot.")
    summary_resource: str | None = Field(default=None, description="The latest status summary as an MCP resource.")
    hint: str | None = None
    warnings: list[str] = Field(default_factory=list, description="Warnings the step raised (servers, MCP, ...).")
    next: str = Field(description="What to call next.")


def status_uri(session_id: str) -> str:
    return f"pivot://sessions/{session_id}/status"


class ProgressPump:
    """The session's events (from any thread) as MCP progress notifications, in order; warnings are kept."""

    def __init__(self, report: Any) -> None:
        self.report = report  # async (progress, total, message) -> None, or None without a client asking
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[m.Event | None] = asyncio.Queue()
        self.count = 0
        self.warnings: list[str] = []
        self.task = asyncio.ensure_future(self._run())

    def sink(self, event: m.Event) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    async def _run(self) -> None:
        while (event := await self.queue.get()) is not None:
            if event.kind in ("warning", "error"):
                self.warnings = [*self.warnings, event.message][-MAX_NOTICES:]
            self.count += 1
            if self.report is not None:
                with contextlib.suppress(Exception):  # a client that went away must not stop the campaign
                    await self.report(self.count, None, f"{event.kind}: {event.message}"[:400])

    async def close(self) -> None:
        self.queue.put_nowait(None)
        with contextlib.suppress(Exception):
            await self.task


def outcome_of(session_id: str, outcome: Any, warnings: list[str], home: Paths) -> CampaignOutcome:
    pivot = outcome.pivot
    summary = str(home.home / outcome.summary_path) if outcome.summary_path else None
    if outcome.status == "pivot" and pivot is not None:
        nxt = (
            f"read {status_uri(session_id)}, then answer_pivot(session={session_id!r}, answer=...): an option's "
            "number, a plan item's id or words of its title, 'continue' or 'stop'"
        )
    elif outcome.status == "finished":
        nxt = f"read {status_uri(session_id)} (the final summary); answer_pivot with an item id tests it again"
    else:
        nxt = f"resume_campaign(session={session_id!r}) goes on where it stopped"
    return CampaignOutcome(
        session=session_id,
        status=outcome.status,
        message=outcome.message,
        question=pivot.question if pivot is not None else None,
        options=list(pivot.options) if pivot is not None else [],
        summary_path=summary,
        summary_resource=status_uri(session_id),
        hint=outcome.hint,
        warnings=warnings,
        next=nxt,
    )


async def run_step(paths: Paths, store: Store, session_id: str, *, answer: str | None, report: Any) -> CampaignOutcome:
    """Run the session to its next stop; on a cancel, stop its server and settle the ledger before the cancel goes
    on (see the module docstring). One step call per session at a time (one_step_at_a_time)."""
    with one_step_at_a_time(store, session_id) as sid:
        return await _run_step(paths, store, sid, answer=answer, report=report)


async def _run_step(paths: Paths, store: Store, session_id: str, *, answer: str | None, report: Any) -> CampaignOutcome:
    from agent.tui.controller import ChatController

    controller = ChatController(paths, store)
    pump = ProgressPump(report)
    try:
        await anyio.to_thread.run_sync(controller.open, session_id)  # reaps a killed run's servers: may wait
        if answer is not None and (pivot := store.open_pivot(session_id)) is not None:
            from tools.method.answers import check_answer

            record = store.get_session(session_id)  # a non-answer is refused: the question stays as asked
            check_answer(answer, pivot, record.plan, record.id)
        controller.attach(pump.sink)
        step = asyncio.ensure_future(controller.step(answer=answer))
        try:
            outcome = await asyncio.shield(step)
        except asyncio.CancelledError:
            controller.request_cancel()  # the server stops now, so the tool in flight returns at once
            step.cancel()
            with anyio.CancelScope(shield=True), contextlib.suppress(asyncio.CancelledError):
                await step  # the controller settles the ledger (interrupted, stopped)
            raise
        await pump.close()
        return outcome_of(session_id, outcome, pump.warnings, paths)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(controller.close)
            await pump.close()
