"""What every tool receives: the live Session (ledger, plan, target, engine, paths, event sink) and the home's Paths.

A tool is `def tool(ctx: RunContext[Session], ...) -> Model`: through `ctx.deps` it reaches the
ledger, the plan, the target, the engine, the paths of this session's files and the event sink.
Engines are found through the `pivot.engines` entry points and all speak the protocols of agent/contracts,
so the agent, the tools and the reports never care whether GPUs are real or simulated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent import models as m
from agent.contracts import Deployment, Engine, load_engine
from agent.errors import PivotError
from agent.paths import Paths
from agent.servers import reap_leftovers
from agent.store import Store, new_session_id

EventSink = Callable[[m.Event], None]


def _discard(_: m.Event) -> None:
    """The default event sink: nobody is watching."""


@dataclass
class LiveServer:
    """The server this process launched for an experiment and still holds (the agent keeps one at a time)."""

    deployment: Deployment
    experiment_id: int | None
    config: m.ServerConfig
    runs_at_start: int = 0  # benchmark runs its experiment had when this server started


@dataclass
class Session:
    """The live session handed to every tool: ledger, plan, target, engine, paths and an event sink.

    Opening a session locks it for this process (see Store.acquire_session); close() stops the server it holds
    and releases the lock.
    """

    store: Store
    record: m.Session
    paths: Paths
    engine: Engine | None = None
    events: EventSink = field(default=_discard)
    notices: list[str] = field(default_factory=list)
    live: LiveServer | None = None
    executor: Any = None  # where experiments run when not in this process (tools/executors: a Ray cluster); None: here

    @property
    def settings(self) -> m.SessionSettings:
        return self.record.settings

    def engine_for(self, seed: int) -> Engine:
        """The session's engine, drawing its noise from `seed` (a real engine has none to draw: it is itself);
        built from the session's engine name and options when none was given."""
        if self.engine is None:
            self.engine = load_engine(self.record.engine, **self.settings.engine_options)
        return self.engine.with_seed(seed)

    def stop_live(self) -> LiveServer | None:
        """Stop the server this process holds, if any; returns what was stopped."""
        live, self.live = self.live, None
        if live is not None:
            live.deployment.stop()
        return live

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def plan(self) -> m.Plan:
        return self.record.plan

    @property
    def target(self) -> m.Target:
        return self.record.plan.target

    def emit(self, kind: str, message: str, **data: Any) -> None:
        """Tell whoever is watching (CLI progress, the TUI) that something happened."""
        self.events(m.Event(kind=kind, message=message, data=data))

    def refresh(self) -> m.Session:
        """Re-read the session's record from the ledger."""
        self.record = self.store.get_session(self.record.id)
        return self.record

    @classmethod
    def create(
        cls,
        store: Store,
        paths: Paths,
        plan: m.Plan,
        *,
        name: str | None = None,
        engine_name: str | None = None,
        model: str = "autopilot",
        model_base_url: str | None = None,
        settings: m.SessionSettings | None = None,
        engine: Engine | None = None,
        events: EventSink = _discard,
    ) -> Session:
        """Record a new session for `plan` and open it (locked for this process)."""
        session_id = new_session_id()
        while True:
            try:
                store.get_session(session_id)
            except PivotError:
                break
            session_id = new_session_id()
        record = m.Session(
            id=session_id,
            name=name or plan.name,
            plan=plan,
            engine=engine_name or (engine.name if engine else plan.target.engine),
            model=model,
            model_base_url=model_base_url,
            settings=settings or m.SessionSettings(),
        )
        store.create_session(record)
        return cls.open(store, paths, record.id, engine=engine, events=events)

    @classmethod
    def open(
        cls,
        store: Store,
        paths: Paths,
        ref: str,
        *,
        engine: Engine | None = None,
        events: EventSink = _discard,
    ) -> Session:
        """Open a recorded session by id, id prefix or name, and lock it for this process.

        Servers a killed pivot left running for this session are stopped here (the lock says no live pivot
        owns them); each gets a notice.
        """
        record = store.get_session(ref)
        notice = store.acquire_session(record.id)
        session = cls(store=store, record=record, paths=paths, engine=engine, events=events)
        texts = ([notice] if notice else []) + reap_leftovers(store, record.id)
        interrupted = store.mark_interrupted(record.id)
        if interrupted:
            ids = ", ".join(str(i) for i in interrupted)
            texts.append(
                f"experiment{'s' if len(interrupted) > 1 else ''} {ids} stopped before finishing (interrupted)"
            )
        for text in texts:
            session.notices.append(text)
            session.emit("warning", text)
        return session

    def close(self) -> None:
        """Stop the server this process holds and release this process's lock on the session."""
        try:
            self.stop_live()
            if self.executor is not None:
                self.executor.close()
        finally:
            self.store.release_session(self.record.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
