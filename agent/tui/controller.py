"""The TUI's hold on one session: open or start it, run the agent one step at a time, cancel a step, read the
ledger for the panels. No textual here: the app calls these from its handlers and workers, and every event of the
agent goes to `sink` (which may be called from any thread).

A step is one `agent.loop.run_async` call: until the agent stops at a pivot, finishes, or fails. Its sync tools run
on a thread pool of the step's own, so a cancel can wait for the tool in flight to return before it settles the
ledger (agent/tui/cancel.py says why that return is quick and records nothing half done).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pydantic_ai
from pydantic_ai import Agent

from agent import models as m
from agent.contracts import Engine, load_engine
from agent.errors import PivotError
from agent.session import EventSink, Paths, Session
from agent.store import Store
from agent.tui import view
from agent.tui.cancel import CancellableEngine, Canceller, StepCancelled, stop_quietly
from tools.numbering import number_of

CANCELLED = "step cancelled: the server was stopped and the ledger is as a resume finds it"
EngineFactory = Callable[[m.Session], Engine]


def default_engine(record: m.Session) -> Engine:
    """The engine a session names, built with its stored options (what Session.engine_for would build)."""
    return load_engine(record.engine, **record.settings.engine_options)


@dataclass
class PickerRows:
    sessions: list[m.SessionSummary]
    plans: list[tuple[str, str, int]]  # name, title, items


def picker_rows(store: Store) -> PickerRows:
    from agent.plans import bundled_plans, load_plan

    plans = []
    for name, path in bundled_plans().items():
        try:
            plan = load_plan(path)
            plans.append((name, plan.title, len(plan.items)))
        except PivotError as e:
            plans.append((name, f"(invalid: {e.message})", 0))
    return PickerRows(sessions=store.session_summaries(), plans=plans)


def run_settings(plan: m.Plan, *, demo: bool = False) -> m.SessionSettings:
    """The settings `pivot run PLAN` (sim engine) or `pivot demo` gives a new session: both read their defaults from
    `agent.defaults` (the method's from `SessionSettings`), so the TUI never drifts from them."""
    from agent import defaults

    engine = defaults.default_engine()
    return defaults.session_settings(plan.target, engine, {}, defaults.demo()[1] if demo else None, {})


class ChatController:
    """One open session and the step running on it."""

    def __init__(
        self,
        paths: Paths,
        store: Store,
        *,
        model: Any = None,
        engine_factory: EngineFactory = default_engine,
    ) -> None:
        self.paths, self.store = paths, store
        self.model = model  # a pydantic-ai model for every step (tests); None: the session's own
        self.engine_factory = engine_factory
        self.canceller = Canceller()
        self.session: Session | None = None
        self._sink: EventSink | None = None
        self._pending: list[m.Event] = []
        self._lock = threading.Lock()
        self._stopper: threading.Thread | None = None
        self._settler: threading.Thread | None = None

    # ---- events

    def attach(self, sink: EventSink) -> None:
        """Send events to `sink` from now on, starting with those that came before (notices of opening)."""
        with self._lock:
            self._sink, pending, self._pending = sink, self._pending, []
        for event in pending:
            sink(event)

    def emit(self, event: m.Event) -> None:
        with self._lock:
            sink = self._sink
            if sink is None:
                self._pending.append(event)
                return
        sink(event)

    def _say(self, kind: str, message: str, **data: Any) -> None:
        self.emit(m.Event(kind=kind, message=message, data=data))

    # ---- sessions

    def _engine(self) -> CancellableEngine:
        """The session's engine, built on first use from its record, behind the cancel wrapper."""
        return CancellableEngine(None, self.canceller, factory=lambda: self.engine_factory(self.require().record))

    def open(self, ref: str) -> Session:
        """Open a recorded session (and lock it), as `pivot resume` does."""
        self._require_none()
        record = self.store.get_session(ref)
        self.session = Session.open(self.store, self.paths, record.id, engine=self._engine(), events=self.emit)
        if record.settings.executor is not None:  # its cancel reaches servers of this process only
            self._say(
                "warning",
                f"session {record.id} runs its experiments on Ray ({record.settings.executor}); here they run on this "
                f"host, one at a time (pivot resume {record.id} goes on on the cluster)",
            )
        return self.session

    def create(self, plan_ref: str, *, demo: bool = False, model: str | None = None) -> Session:
        """Start a session on a plan with `pivot run PLAN`'s defaults on the sim engine (`demo`: `pivot demo`'s)."""
        from agent import defaults
        from agent.plans import load_plan
        from tools.preflight import check_runnable, item_errors_note

        self._require_none()
        plan = load_plan(defaults.demo()[0] if demo else plan_ref)
        problems = check_runnable(plan, engine=defaults.default_engine())  # an error of the target: refused first
        settings = run_settings(plan, demo=demo)
        model_name = defaults.default_model(model)
        self.session = Session.create(
            self.store,
            self.paths,
            plan,
            name="demo" if demo else plan.name,
            engine_name=defaults.default_engine(),
            model=model_name,
            settings=settings,
            engine=self._engine(),
            events=self.emit,
        )
        note = item_errors_note(plan, problems)
        if note:
            self._say("info", note)
        return self.session

    def _require_none(self) -> None:
        if self.session is not None:
            raise PivotError(f"session {self.session.id} is open here; close it first")

    def require(self) -> Session:
        if self.session is None:
            raise PivotError("no session is open")
        return self.session

    def close(self) -> None:
        """Wait for a cancel to settle, stop the server, release the session's lock."""
        for thread in (self._stopper, self._settler):
            if thread is not None:
                thread.join(timeout=120)
        session, self.session = self.session, None
        if session is not None:
            try:
                stop_quietly(self.canceller.cancel())
            finally:
                session.close()

    # ---- reading the ledger

    def board(self) -> view.Board:
        return view.board(self.store, self.require().id)

    def history(self) -> list[view.Entry]:
        from agent import loop

        return view.history_entries(loop.load_history(self.require()))

    def server(self) -> tuple[str, m.Telemetry | None]:
        """The server's state in a few words and its telemetry now (None without a server). Blocking: a thread."""
        session = self.session
        live = session.live if session is not None else None
        if live is None:
            return "no server", None
        dep = live.deployment
        try:
            alive = dep.alive()
            telemetry = dep.telemetry() if alive else None
        except Exception as e:  # a reading that fails must not take the UI down
            return f"exp {number_of(self.require(), live.experiment_id)}: {type(e).__name__}", None
        return f"exp {number_of(self.require(), live.experiment_id)} {'ready' if alive else 'down'}", telemetry

    # ---- running

    async def step(self, *, answer: str | None = None, prompt: str | None = None) -> Any:
        """Run the agent until it stops (agent.loop.run_async's RunOutcome). Cancelling the task that awaits this
        (after request_cancel) settles the ledger before the CancelledError goes on."""
        from agent import loop

        session = self.require()
        pydantic_ai.BANNER_ENABLED = False  # its first-run banner goes to stderr, which is the TUI's screen
        self.canceller.reset()
        executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="pivot-step")
        try:
            with Agent.using_thread_executor(executor):
                return await loop.run_async(session, answer=answer, prompt=prompt, model=self.model)
        except StepCancelled:  # a tool met the cancel before the task did
            await self._settle(executor)
            return loop.RunOutcome("stopped", CANCELLED)
        except asyncio.CancelledError:
            await self._settle(executor)
            raise
        finally:
            executor.shutdown(wait=False)

    def request_cancel(self) -> None:
        """Stop the step's servers now (in a thread: stopping waits for the process); the task is cancelled by
        the caller. The session lets go of its server at once, so nothing on the UI's thread waits for it."""
        session = self.require()
        deployments = self.canceller.cancel()
        live, session.live = session.live, None
        if live is not None and all(live.deployment is not d for d in deployments):
            deployments.append(live.deployment)
        self._stopper = threading.Thread(target=stop_quietly, args=(deployments,), name="pivot-stop", daemon=True)
        self._stopper.start()

    async def _settle(self, executor: ThreadPoolExecutor) -> None:
        self._settler = threading.Thread(target=self._settle_now, args=(executor,), name="pivot-settle", daemon=True)
        self._settler.start()
        # shielded: a second cancel (the app quitting) must not leave the ledger half settled; close() joins it
        await asyncio.shield(asyncio.to_thread(self._settler.join))

    def _settle_now(self, executor: ThreadPoolExecutor) -> None:
        session = self.require()
        if not self.canceller.cancelled:  # StepCancelled without request_cancel cannot happen; be safe anyway
            self.canceller.cancel()
        if self._stopper is not None:
            self._stopper.join()
        executor.shutdown(wait=True)  # the tool in flight returns: StepCancelled at its next engine call
        errors = stop_quietly(self.canceller.cancel())  # anything launched while the cancel went out
        session.stop_live()
        interrupted = self.store.mark_interrupted(session.id)
        self.store.set_session_status(session.id, "stopped")
        for error in errors:
            self._say("warning", f"a server did not stop cleanly: {error}")
        if interrupted:
            ids = ", ".join(str(i) for i in interrupted)
            self._say(
                "warning",
                f"experiment{'s' if len(interrupted) > 1 else ''} {ids} stopped before finishing (interrupted)",
            )
        self._say("info", CANCELLED)
