"""What every tool receives (the live Session) and the Engine and Deployment protocols that engines implement.

A tool is `def tool(ctx: RunContext[Session], ...) -> Model`: through `ctx.deps` it reaches the
ledger, the plan, the target, the engine, the paths of this session's files and the event sink.
Engines are found through the `pivot.engines` entry points and all speak the two protocols below,
so the agent, the tools and the reports never care whether GPUs are real or simulated.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agent import models as m
from agent import plugins
from agent.errors import PivotError
from agent.servers import reap_leftovers
from agent.store import Store, new_session_id

EventSink = Callable[[m.Event], None]
ProgressCallback = Callable[[str], None]


def _discard(_: m.Event) -> None:
    """The default event sink: nobody is watching."""


# ---------------------------------------------------------------------------------------------- the contract
#
# Everything a caller (a tool, the CLI, the TUI, the analysis) may use of an engine or a deployment is a member of
# the two protocols below, typed and documented; callers never probe attributes or inspect signatures. Engines
# usually subclass tools/engines/base.py:BaseEngine, which gives every optional member a sound default.


@dataclass(frozen=True)
class LedgerLink:
    """Where a launched server is recorded: the ledger, the session, the experiment it serves, the home's paths."""

    store: Store
    session_id: str
    experiment_id: int | None = None
    paths: Paths | None = None

    def path(self, path: Path) -> str:
        return self.paths.relative(path) if self.paths is not None else str(path)


@dataclass(frozen=True)
class Parallelism:
    """How a configuration splits the model over GPUs, as the engine reads its own flags: tensor, pipeline, expert
    and data parallel degrees (1 where the configuration does not split that way)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    dp_within_tp: bool = False  # data-parallel ranks share the tensor-parallel GPUs (SGLang's DP attention)

    @property
    def gpus(self) -> int:
        """The GPUs the configuration occupies: TP x PP, times DP unless the DP ranks live inside the TP group."""
        return self.tp * self.pp * (1 if self.dp_within_tp else self.dp)


@dataclass(frozen=True)
class Diagnosis:
    """Why a server failed: the failure class (oom, cuda-error, unrecognized-argument, ..., unknown) and the log
    line that shows it (None when nothing matched)."""

    failure: str
    line: str | None = None

    def __str__(self) -> str:
        return self.failure if self.line is None else f"{self.failure}: {self.line}"


@dataclass
class FlagAudit:
    """An audit's rows and where its verdicts came from (what `pivot audit-flags` prints)."""

    rows: list[m.FlagIssue]
    parser: str  # which parser judged the flags, e.g. "shipped catalog of vLLM 0.33.0"
    noops: str  # where the no-op verdicts came from
    version: str  # the engine version the flags were judged as
    notes: list[str] = field(default_factory=list)  # fallbacks and mismatches worth a warning

    @property
    def blocking(self) -> bool:
        """True when some row would stop a launch (unknown, ambiguous or invalid)."""
        return any(r.blocking for r in self.rows)


LevelCallback = Callable[[Any], None]  # receives tools.loadgen.LevelProgress (the core cannot name tools' types)


@runtime_checkable
class Deployment(Protocol):
    """A running (or starting) server: something that can be waited for, benchmarked, read and stopped."""

    base_url: str  # http://host:port, or sim://... for a server that runs in this process
    argv: list[str] | None  # the command line it was launched with; None when nothing was launched
    log_path: Path | None  # where its log is written
    level_telemetry: list[m.Telemetry]  # per level of the last benchmark(), in order

    @property
    def failure(self) -> str | None:
        """The classified reason the server failed (oom, cuda-error, ...), once it has; None while it is healthy."""
        ...

    def wait_ready(self, timeout_s: float, on_progress: ProgressCallback | None = None) -> None:
        """Return once the server answers; raise PivotError with the classified reason if it dies or times out."""
        ...

    def alive(self) -> bool:
        """Whether the server process is still running."""
        ...

    def log_tail(self, n: int = 50) -> list[str]:
        """The last `n` lines of the server's log."""
        ...

    def benchmark(
        self,
        spec: m.BenchSpec,
        on_progress: ProgressCallback | None = None,
        *,
        on_level: LevelCallback | None = None,
        output_file: Path | None = None,
    ) -> m.BenchResult:
        """Run the sweep `spec` against this server; failed requests are counted, never raised.

        `on_progress` gets a line of text per event, `on_level` a tools.loadgen.LevelProgress (progress bars);
        `output_file` gets one JSON line per level with bench_serving's keys. Ctrl-C returns the finished levels
        with interrupted=True. Each level's telemetry is in `level_telemetry` afterwards.
        """
        ...

    def telemetry(self) -> m.Telemetry:
        """GPU and server readings now (source says measured, simulated or unavailable)."""
        ...

    def metrics(self) -> dict[str, Any]:
        """The server's own gauges now, by pivot's names (num_running_reqs, num_queue_reqs, token_usage, ...) under
        `metrics`, with `source`; raises PivotError when the server publishes none."""
        ...

    def profile(self, out_dir: Path, spec: m.BenchSpec | None = None) -> m.ProfileSummary:
        """GPU kernel time by category under a short load (`spec`, default a small one); traces go to `out_dir`."""
        ...

    def stop(self) -> None:
        """Stop the server and everything it started; safe to call twice."""
        ...


@runtime_checkable
class Engine(Protocol):
    """A serving engine: it owns what pivot knows of it (flag catalog and audit, metric names, failure rules,
    parallelism) and launches deployments."""

    name: str
    ready_timeout_s: float  # how long a launch may take to become ready before it counts as failed
    gauges: Mapping[str, str]  # pivot's gauge name -> this engine's Prometheus metric name

    def validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        """One row per flag as typed: ok, unknown, ambiguous, deprecated, invalid or noop, with a message."""
        ...

    def audit(self, config: m.ServerConfig, *, version: str | None = None, source: Path | None = None) -> FlagAudit:
        """The full audit for `pivot audit-flags`: rows as validate() gives them, judged as `version` (default: the
        engine's), no-ops from a scan of the engine's source at `source` where the engine can scan one, and where
        each verdict came from."""
        ...

    def parallelism(self, config: m.ServerConfig) -> Parallelism:
        """The TP, PP, EP and DP degrees `config` asks for, as this engine reads its flags (defaults resolved)."""
        ...

    def not_modelled(self, config: m.ServerConfig) -> list[str]:
        """The flags of `config` this engine accepts but does not model (a simulation that would not show their
        effect); empty for a real engine, which runs them all."""
        ...

    def diagnose(self, lines: Sequence[str]) -> Diagnosis:
        """Why a server of this engine failed, from its log's tail (this engine's failure rules)."""
        ...

    def with_seed(self, seed: int) -> Engine:
        """The engine drawing its noise from `seed` (simulated engines); a real engine returns itself."""
        ...

    def launch(
        self, config: m.ServerConfig, log_path: Path, *, ledger: LedgerLink | None = None, force: bool = False
    ) -> Deployment:
        """Start a server with `config`, logging to `log_path` and recorded in `ledger`; returns before it is ready.

        Flags the audit finds the engine would refuse stop the launch (FlagsRefused) unless `force`.
        """
        ...


@dataclass(frozen=True)
class Paths:
    """Where one home keeps its files: the ledger in state/, generated documents in docs_out/."""

    home: Path

    @classmethod
    def from_env(cls, home: str | Path | None = None) -> Paths:
        """`home`, else $PIVOT_HOME, else the current directory."""
        chosen = home if home is not None else os.environ.get("PIVOT_HOME") or "."
        return cls(Path(chosen).expanduser().resolve())

    @property
    def state_dir(self) -> Path:
        return self.home / "state"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "pivot.db"

    @property
    def docs_root(self) -> Path:
        return self.home / "docs_out"

    def session_state_dir(self, session_id: str) -> Path:
        """state/<session>/: server logs and raw benchmark JSONL of one session."""
        return self.state_dir / session_id

    def logs_dir(self, session_id: str) -> Path:
        return self.session_state_dir(session_id) / "logs"

    def raw_dir(self, session_id: str) -> Path:
        return self.session_state_dir(session_id) / "bench"

    def docs_dir(self, session_id: str) -> Path:
        """docs_out/<session>/: improvement documents and status summaries."""
        return self.docs_root / session_id

    def relative(self, path: Path) -> str:
        """A path as the ledger records it: relative to the home when inside it."""
        try:
            return str(path.resolve().relative_to(self.home))
        except ValueError:
            return str(path)


_ENGINE_MEMBERS = ("name", "ready_timeout_s", "gauges", "validate", "audit", "parallelism", "not_modelled",
                   "diagnose", "with_seed", "launch")  # fmt: skip


def engine_names() -> list[str]:
    """The engines installed as `pivot.engines` plugins, by name (nothing is imported)."""
    return sorted({p.name for p in plugins.available(plugins.ENGINES_GROUP)})


def load_engine(name: str, **options: Any) -> Engine:
    """Build the engine registered under `name` in the `pivot.engines` entry points."""
    factory = plugins.load(plugins.ENGINES_GROUP, name)
    try:
        engine = factory(**options)
    except PivotError:
        raise
    except Exception as e:
        raise PivotError(f"engine {name!r} could not be set up: {type(e).__name__}: {e}") from e
    if not isinstance(engine, Engine):
        missing = sorted(n for n in _ENGINE_MEMBERS if not hasattr(engine, n))  # contract: what a plugin lacks
        raise PivotError(
            f"engine plugin {name!r} did not return an Engine (got {type(engine).__name__}"
            + (f", which lacks {', '.join(missing)})" if missing else ")"),
            hint="subclass tools.engines.base.BaseEngine, which gives every optional member a default",
        )
    return engine


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
