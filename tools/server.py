"""The server toolset: audit flags, launch a server for an experiment, stop it, and ask how it is.

An experiment is one configuration on one workload. `launch_server` records it (or relaunches a recorded one for a
rerun), audits its flags first and refuses what the engine would refuse, starts the server with the session's
engine and waits until it is ready. The session holds one server at a time: launching another stops the first.
Startup failures are recorded on the experiment with their classified reason (oom, unrecognized-argument, ...).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from pydantic_ai import FunctionToolset, ModelRetry, RunContext

from agent import models as m
from agent.errors import Interrupted, LaunchFailed, PivotError
from agent.session import LiveServer, Session
from tools.executors.task import telling_line
from tools.experiments import audit_issues, proposed_config, record_failed, record_step, refusal
from tools.method import Judgement, Method
from tools.numbering import number_of

toolset: FunctionToolset[Session] = FunctionToolset(id="server", max_retries=3)


class FlagAudit(BaseModel):
    """The engine's verdict on a command line before any GPU time is spent."""

    config: str = Field(description="The full flags audited.")
    would_start: bool = Field(description="False when the engine would refuse to start with these flags.")
    issues: list[m.FlagIssue] = Field(description="Flags that are not plainly ok, with what to do instead.")
    noop_flags: list[str] = Field(description="Accepted flags that this engine version never reads (no effect).")


class LaunchResult(BaseModel):
    """What happened to a launch: ready, refused by the audit, or failed to start."""

    experiment_id: int
    status: Literal["ready", "refused", "failed"]
    config: str
    plan_item: str | None = None
    base_experiment_id: int | None = None
    base_url: str | None = None
    failure: str | None = Field(default=None, description="Classified reason when it did not start.")
    message: str = ""
    noop_flags: list[str] = Field(default_factory=list)
    log_tail: list[str] = Field(default_factory=list)


class ServerState(BaseModel):
    """The server this session holds, if any."""

    running: bool
    experiment_id: int | None = None
    base_url: str | None = None
    config: str | None = None
    alive: bool | None = None
    log_tail: list[str] = Field(default_factory=list)
    recorded_servers: int = Field(default=0, description="Server processes of this session still marked running.")


@toolset.tool
def audit_flags(
    ctx: RunContext[Session],
    plan_item: str | None = None,
    flags: str | None = None,
    remove_flags: list[str] | None = None,
    plan_items: list[str] | None = None,
    revert_items: list[str] | None = None,
) -> FlagAudit:
    """Check a command line with the engine's own parser before spending GPU time on it.

    The command line audited is the best configuration so far, changed by `plan_item` (its flags) or by every item
    of `plan_items` (a combined step), then by `remove_flags` and `flags` (extra flags, SGLang spelling, e.g.
    "--chunked-prefill-size 16384"); `revert_items` audits the best configuration rebuilt without those adopted
    items (a revert). With none of them, the best configuration itself. `would_start` false means the server would refuse to start: rule the
    item out (record_verdict with plan_item and verdict ruled_out) instead of launching. `noop_flags` are accepted
    but do nothing in this engine version: say so in the verdict.
    """
    method = Method.read(ctx.deps.store, ctx.deps.id)
    config = proposed_config(method, plan_item, flags, remove_flags, plan_items, revert_items)
    issues = audit_issues(ctx.deps, config)
    shown = [i for i in issues if i.status != "ok"]
    audit = FlagAudit(
        config=str(config),
        would_start=not any(i.blocking for i in issues),
        issues=shown,
        noop_flags=[i.flag for i in issues if i.status == "noop"],
    )
    ctx.deps.emit("info", f"audit {config}: {'ok' if audit.would_start else 'refused'}", audit=audit.model_dump())
    return audit


@toolset.tool
def launch_server(
    ctx: RunContext[Session],
    plan_item: str | None = None,
    flags: str | None = None,
    remove_flags: list[str] | None = None,
    baseline: bool = False,
    experiment_id: int | None = None,
    hypothesis: str = "",
    plan_items: list[str] | None = None,
    revert_items: list[str] | None = None,
) -> LaunchResult:
    """Record an experiment and start its server; returns when the server is ready (or why it is not).

    - baseline=True: the plan's base flags on the plan's workload (do this first; an item with its own workload
      gets its own baseline: baseline=True with that plan_item).
    - plan_item="05": that item's change on top of the best configuration so far (one change at a time), on the
      item's workload. `flags`/`remove_flags` adjust further (SGLang spelling).
    - plan_items=["05", "06"]: a combined step, the named items' changes together as one experiment (for items
      that pay off only together); every item is named in the ledger and the reports.
    - revert_items=["01"]: take adopted items back: the best configuration rebuilt from its chain of adopted
      changes without them (when a later change made them a brake); plan_item/plan_items may add items to it.
    - experiment_id=N: relaunch experiment N's exact configuration, to rerun its benchmark (a rerun adds a run to
      the same experiment; use it when a gain is inside the noise).
    The flags are audited first: flags the engine would refuse are not launched (status "refused"). A server that
    fails to start is recorded with its classified reason (status "failed"). One server at a time: a running one is
    stopped first. Then call run_benchmark, record_verdict, and stop_server.
    """
    session = ctx.deps
    method = Method.read(session.store, session.id)
    e = record_step(
        session,
        method,
        plan_item=plan_item,
        plan_items=plan_items,
        flags=flags,
        remove_flags=remove_flags,
        baseline=baseline,
        experiment_id=experiment_id,
        hypothesis=hypothesis,
        reverts=revert_items,
    )
    return _launch(session, method, e)


def _launch(session: Session, method: Method, e: m.Experiment) -> LaunchResult:
    from tools.engines.http import launch_in_session
    from tools.engines.process import CLASSIFY_LINES, FlagsRefused

    store = session.store
    eid = e.id or 0
    stopped = session.stop_live()
    if stopped is not None:
        _mark_stopped(session, stopped)
        session.emit(
            "info",
            f"stopped the server of experiment {number_of(session, stopped.experiment_id)} first (one at a time)",
        )
    runs = method.run_count(e)
    engine = session.engine_for(session.settings.seed + 100 * eid + runs)
    issues = engine.validate(e.config)
    e = e.model_copy(update={"not_modelled": engine.not_modelled(e.config)})
    noops = [i.flag for i in issues if i.status == "noop"]
    common = {
        "experiment_id": eid,
        "config": str(e.config),
        "plan_item": e.plan_item,
        "base_experiment_id": e.base_experiment_id,
        "noop_flags": noops,
    }
    refused = refusal(issues)
    if refused is not None:
        failure, message = refused
        record_failed(session, e.model_copy(update={"audit": issues}), failure, message)
        return LaunchResult(status="refused", failure=failure, message=message, **common)
    e = store.update_experiment(
        e.model_copy(
            update={"status": "running", "audit": issues, "started_at": e.started_at or m.utcnow(), "failure": None}
        )
    )
    session.emit("progress", f"experiment {e.number}: launching {engine.name} with {e.config}")
    try:
        deployment = launch_in_session(session, e.config, engine=engine, experiment_id=eid, issues=issues)
    except FlagsRefused as err:  # the engine's own audit disagreed with ours: record it the same way
        record_failed(session, e, "unrecognized-argument", err.message)
        return LaunchResult(status="refused", failure="unrecognized-argument", message=err.message, **common)
    except Interrupted:  # pivot is stopping: the experiment is not a failed launch (the run marks it interrupted)
        raise
    except PivotError as err:
        failure = err.failure if isinstance(err, LaunchFailed) else "unknown"
        record_failed(session, e, failure, err.message)
        return LaunchResult(status="failed", failure=failure, message=err.message, **common)
    if deployment.log_path is not None:
        e = store.update_experiment(e.model_copy(update={"log_path": session.paths.relative(deployment.log_path)}))
    try:
        deployment.wait_ready(
            engine.ready_timeout_s, lambda line: session.emit("progress", f"experiment {e.number}: {line}")
        )
    except PivotError as err:
        failure = err.failure if isinstance(err, LaunchFailed) else deployment.failure or "unknown"
        tail = deployment.log_tail(15)
        why = telling_line(engine, deployment.log_tail(CLASSIFY_LINES))  # the classifier's line may be far up
        deployment.stop()
        record_failed(session, e, failure, why or err.message)
        return LaunchResult(status="failed", failure=failure, message=err.message, log_tail=tail, **common)
    session.live = LiveServer(deployment=deployment, experiment_id=eid, config=e.config, runs_at_start=runs)
    session.emit("info", f"experiment {e.number}: server ready at {deployment.base_url}")
    return LaunchResult(status="ready", base_url=deployment.base_url, log_tail=deployment.log_tail(3), **common)


def _mark_stopped(session: Session, live: LiveServer) -> None:
    """An experiment whose server stops before it was measured is interrupted, not running."""
    if live.experiment_id is None:
        return
    e = session.store.get_experiment(live.experiment_id)
    if e.status == "running":
        runs = session.store.bench_results(live.experiment_id)
        session.store.update_experiment(
            e.model_copy(update={"status": "finished" if runs else "interrupted", "finished_at": m.utcnow()})
        )


@toolset.tool
def stop_server(ctx: RunContext[Session]) -> ServerState:
    """Stop the server this session holds (its whole process group). Safe to call when none is running."""
    session = ctx.deps
    live = session.stop_live()
    if live is not None:
        _mark_stopped(session, live)
        session.emit("info", f"experiment {number_of(session, live.experiment_id)}: server stopped")
    return _state(session)


def _state(session: Session) -> ServerState:
    recorded = len(session.store.servers(session.id, running_only=True))
    live = session.live
    if live is None:
        return ServerState(running=False, recorded_servers=recorded)
    dep = live.deployment
    return ServerState(
        running=True,
        experiment_id=live.experiment_id,
        base_url=dep.base_url,
        config=str(live.config),
        alive=dep.alive(),
        log_tail=dep.log_tail(5),
        recorded_servers=recorded,
    )


@toolset.tool
def server_status(ctx: RunContext[Session]) -> ServerState:
    """The server this session holds: its experiment, URL, whether its process is alive, and its last log lines."""
    return _state(ctx.deps)


class StepMember(BaseModel):
    """One experiment of a step: what launch_server would take for it."""

    plan_item: str | None = None
    plan_items: list[str] | None = None
    baseline: bool = False
    experiment_id: int | None = Field(default=None, description="Rerun this experiment (adds a run to it).")
    flags: str | None = Field(default=None, description="Only the bounded crash retry: '--max-running-requests N'.")
    revert_items: list[str] | None = Field(default=None, description="Adopted items to take back (a revert).")
    hypothesis: str = ""
    runs: int = Field(
        default=1,
        ge=1,
        description="Runs at once, each on its own server (2: the baseline's noise, or a change's confirming run).",
    )


class StepRow(BaseModel):
    """How one experiment of the step ended, and the method's reading of it."""

    experiment_id: int
    plan_items: list[str]
    status: str = Field(description="measured, failed (did not start), refused, interrupted or lost.")
    config: str
    where: str = Field(description="The host and GPUs it ran on.")
    message: str = ""
    judgement: Judgement | None = Field(default=None, description="Against its base; None when nothing was measured.")


@toolset.tool
def run_experiments(ctx: RunContext[Session], experiments: list[StepMember]) -> list[StepRow]:
    """Run the experiments of one step at once, each on its own server (launch, benchmark, stop), on the session's
    executor: a Ray cluster's free GPUs with `pivot run --ray ADDRESS --parallel N`, else this host one after
    another. Each member is what launch_server takes (a baseline, a plan item or a combined step on the best
    configuration, or experiment_id for a rerun) and obeys the same rules; at most the session's --parallel of them,
    no item in two members; `runs` 2 runs a member twice at once (the baseline's two runs that measure the noise,
    or a change and the run that confirms its gain), counting 2 of --parallel. Returns when every one has ended, with the method's judgement of each against its
    base. Then record_verdict each: judge the largest gain first (it becomes the best; a gain beside it that it
    beat is recorded superseded), and rerun gains inside the noise band (another run_experiments with their ids).
    """
    from tools.executors.driver import run_batch

    session = ctx.deps
    if not experiments:
        raise ModelRetry("name at least one experiment")
    stopped = session.stop_live()
    if stopped is not None:
        _mark_stopped(session, stopped)
    recorded: list[m.Experiment] = []
    for member in experiments:
        method = Method.read(session.store, session.id)
        args = member.model_dump(exclude={"plan_items", "runs", "revert_items"})
        e = record_step(session, method, **args, plan_items=member.plan_items, reverts=member.revert_items)
        if any(x.id == e.id for x in recorded):
            raise ModelRetry(f"experiment {e.number} is named twice in this step")
        recorded.append(e)
    entries = run_batch(session, recorded, [member.runs for member in experiments])
    method = Method.read(session.store, session.id)
    rows = []
    for e, entry in zip(recorded, entries, strict=True):
        now = method.experiment(e.id) or e
        p = entry.placement
        where = (p.host + (f" GPUs {','.join(p.gpu_ids)}" if p.gpu_ids else "")) if p is not None else "not launched"
        measured = method.run_count(now) > 0
        rows.append(
            StepRow(
                experiment_id=e.id or 0,
                plan_items=now.plan_items,
                status=entry.status,
                config=str(now.config),
                where=where,
                message=entry.message[:300],
                judgement=method.judge(now) if measured or now.status == "failed" else None,
            )
        )
    return rows
