"""The driver's side of an executor: experiments of one step audited, handed to the executor as tasks, and their
outcomes written to the ledger by this process alone.

`run_batch` is what the `run_experiments` tool calls. For each experiment it does what the serial path (launch_server,
run_benchmark, stop_server) does, in the same words: flags the engine would refuse are recorded as refused without a
launch; a server that does not start is recorded failed with its classified reason; a sweep adds a run with its
telemetry and raw JSONL. Outcomes are recorded as they land (a measurement is never held back), so a driver killed
mid-step keeps what finished; an experiment whose task was lost (its node or worker died) is recorded interrupted and
run again, LOST_RERUNS times at most, and then left interrupted for `pivot resume` to run. The method judges nothing
here: verdicts wait until the whole step is in (the caller judges after run_batch returns).

The seed of each task is the serial path's (settings.seed + 100 x experiment + runs so far), so a step gives the same
numbers on any executor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent import models as m
from agent.contracts import Executor, ExperimentTask, LedgerLink, TaskEvent, TaskOutcome
from agent.errors import PivotError
from agent.servers import server_mark
from agent.session import Session
from tools.engines.failures import PIVOT_FAILURE
from tools.experiments import raw_run_file, record_failed, refusal

LOST_RERUNS = 2  # an experiment whose task was lost runs again at most this many times in the same step
MAX_LOG_BYTES = 2 * 1024 * 1024


@dataclass
class BatchEntry:
    """One experiment of a step and how its run ended."""

    experiment_id: int
    status: str  # measured, failed, refused, interrupted, lost
    message: str = ""
    placement: m.Placement | None = None


def executor_of(session: Session) -> Executor:
    """The session's executor: the one it was opened with (`pivot run --ray`), else this host, one at a time."""
    if session.executor is not None:
        return session.executor  # type: ignore[no-any-return]
    from tools.executors.local import LocalExecutor

    return LocalExecutor(
        ledger_for=lambda t: LedgerLink(session.store, session.id, t.experiment_id, session.paths),
        engine_for=session.engine_for,
    )


def run_batch(
    session: Session, experiments: Sequence[m.Experiment], runs: Sequence[int] | None = None
) -> list[BatchEntry]:
    """Run each experiment (recorded already) `runs[i]` times at once (default once) on the session's executor, each
    run on its own server; returns how each experiment ended, in the order given. Outcomes are written to the
    ledger as they land."""
    store = session.store
    entries: dict[int, BatchEntry] = {}
    tasks: list[ExperimentTask] = []
    for i, e in enumerate(experiments):
        tasks += _prepare(session, e, entries, runs[i] if runs else 1)
    executor = executor_of(session)
    attempts = dict.fromkeys(((t.experiment_id, t.run) for t in tasks), 1)
    pending = tasks
    try:
        while pending:
            lost: list[ExperimentTask] = []
            for outcome in executor.run(pending, lambda ev: _show(session, ev)):
                key = (outcome.task.experiment_id, outcome.task.run)
                outcome.placement = outcome.placement.model_copy(update={"attempt": attempts[key]})
                entry = record_outcome(session, outcome)
                entries[key[0]] = _merged(entries.get(key[0]), entry)
                if outcome.status == "lost" and attempts[key] <= LOST_RERUNS:
                    attempts[key] += 1
                    lost.append(outcome.task)
                    session.emit(
                        "warning",
                        f"{outcome.task.label}: its task was lost ({outcome.message}); recorded interrupted, running "
                        f"it again (attempt {attempts[key]} of {LOST_RERUNS + 1})",
                    )
            pending = lost
        _refuse_what_was_not_the_engines(session, entries)
    finally:
        for e in experiments:  # cut short (Ctrl-C, a cancel): what never ended is interrupted, not running
            eid = e.id or 0
            if eid not in entries:
                now = store.get_experiment(eid)
                if now.status == "running":
                    store.update_experiment(now.model_copy(update={"status": "interrupted"}))
    return [entries[e.id or 0] for e in experiments]


def _refuse_what_was_not_the_engines(session: Session, entries: dict[int, BatchEntry]) -> None:
    """After a batch: runs lost again and again (Ray's own processes are gone) or stopped by an error of pivot's own
    are recorded interrupted, and the run stops here with what happened, so no verdict rests on them."""
    store = session.store
    lost = [k for k, v in entries.items() if v.status == "lost"]
    own = []
    for k in entries:
        e = store.get_experiment(k)
        if e.status == "interrupted" and (e.failure_detail or "").startswith("pivot's own error"):
            own.append(k)
    if not lost and not own:
        return
    names = ", ".join(str(store.get_experiment(k).number) for k in sorted({*lost, *own}))
    why = (
        f"the executor lost them {LOST_RERUNS + 1} times (Ray's own processes are gone: its lease actor, a raylet or "
        "a node)"
        if lost
        else f"an error of pivot's own: {entries[own[0]].message}"
    )
    raise PivotError(
        f"experiment{'s' if ',' in names else ''} {names} recorded interrupted, not crashed: {why}",
        hint=f"see `ray status` (or the line above), then `pivot resume {session.id}` runs them again",
    )


RANK = {"measured": 0, "failed": 1, "refused": 2, "interrupted": 3, "lost": 4}


def _merged(old: BatchEntry | None, new: BatchEntry) -> BatchEntry:
    """An experiment's entry over its runs: a measured run makes it measured; otherwise the last word stands."""
    if old is None or RANK[new.status] <= RANK[old.status]:
        return new
    return old


def _show(session: Session, event: TaskEvent) -> None:
    session.emit(event.kind, event.message)


def _prepare(session: Session, e: m.Experiment, entries: dict[int, BatchEntry], n: int) -> list[ExperimentTask]:
    """Audit `e` as a launch would and mark it running; the tasks of its next `n` runs, or none when the audit
    refused it (recorded failed with the refusal's class, as launch_server records it)."""
    store = session.store
    eid = e.id or 0
    runs = len(store.bench_results(eid))
    engine = session.engine_for(session.settings.seed + 100 * eid + runs)
    issues = engine.validate(e.config)
    e = e.model_copy(update={"not_modelled": engine.not_modelled(e.config), "audit": issues})
    refused = refusal(issues)
    if refused is not None:
        record_failed(session, e, *refused)
        entries[eid] = BatchEntry(eid, "refused", refused[1])
        return []
    store.update_experiment(
        e.model_copy(update={"status": "running", "started_at": e.started_at or m.utcnow(), "failure": None})
    )
    from tools.engines.http import server_log_path

    item = session.plan.item(e.plan_item) if e.plan_item in session.plan.item_ids() else None
    paths = session.paths
    from tools.loadgen.capacity import capacity_search_of

    objective, start = capacity_search_of(session.plan.objective, engine, session.target, e.config, e.workload)
    return [
        ExperimentTask(
            session_id=session.id,
            experiment_id=eid,
            run=run,
            engine=session.record.engine,
            engine_options=dict(session.settings.engine_options),
            seed=session.settings.seed + 100 * eid + run - 1,  # the serial path's seed for this run (tools/server.py)
            config=e.config,
            workload=e.workload,
            gpus=engine.parallelism(e.config).gpus,
            log_path=str(server_log_path(paths, session.id, engine.name, e.number or eid)),
            raw_path=str(raw_run_file(session, eid, run)),
            mark=server_mark(store.path, session.id),
            ready_timeout_s=engine.ready_timeout_s,
            profile=item is not None and item.kind == "profile" and run == runs + 1,
            profile_dir=str(paths.session_state_dir(session.id) / "profiles"),
            objective=objective,
            capacity_start=start,
            audit=tuple(issues),
            number=e.number,
        )
        for run in range(runs + 1, runs + n + 1)
    ]


def record_outcome(session: Session, outcome: TaskOutcome) -> BatchEntry:
    """Write one task's outcome to the ledger: the run, its telemetry, its raw file and log, the experiment's state."""
    store = session.store
    task = outcome.task
    eid = task.experiment_id
    e = store.get_experiment(eid)
    log_path = _bring_log(session, task, outcome)
    update: dict[str, object] = {"placement": outcome.placement}
    if log_path is not None:
        update["log_path"] = session.paths.relative(log_path)
    if outcome.status == "measured" and outcome.bench is not None:
        raw = Path(task.raw_path)
        if outcome.raw_jsonl is not None:
            _write(raw, outcome.raw_jsonl)
        bench = outcome.bench.model_copy(update={"placement": outcome.placement})
        if raw.exists():
            bench = bench.model_copy(update={"raw_path": session.paths.relative(raw)})
        run_id = store.add_bench_result(eid, bench)
        for t in outcome.telemetry:
            store.add_telemetry(eid, t, run_id=run_id)
        update |= {"status": "finished", "failure": outcome.failure or e.failure, "finished_at": outcome.finished_at}
        if outcome.profile is not None:
            _record_profile(session, eid, outcome.profile)
    elif outcome.status == "failed" and outcome.failure == PIVOT_FAILURE:  # pivot's own error, not the engine's
        update |= {"status": "interrupted" if not store.bench_results(eid) else e.status,
                   "failure_detail": f"pivot's own error: {outcome.failure_detail or outcome.message}"[:500]}  # fmt: skip
    elif outcome.status in ("failed", "refused") and store.bench_results(eid):  # another run of it was measured
        update |= {"failure_detail": f"{task.label} did not start ({outcome.failure}): "
                   f"{outcome.failure_detail or outcome.message}"[:500]}  # fmt: skip
    elif outcome.status in ("failed", "refused"):
        update |= {"status": "failed", "failure": outcome.failure or "unknown",
                   "failure_detail": (outcome.failure_detail or outcome.message)[:500] or None,
                   "finished_at": outcome.finished_at}  # fmt: skip
    elif not store.bench_results(eid):  # interrupted, lost: nothing measured to keep; it runs again
        update |= {"status": "interrupted"}
    store.update_experiment(e.model_copy(update=update))
    where = outcome.placement.host + (
        f" GPUs {','.join(outcome.placement.gpu_ids)}" if outcome.placement.gpu_ids else ""
    )
    text = {
        "measured": "measured" + (f" ({outcome.failure} under load)" if outcome.failure else ""),
        "failed": f"did not start ({outcome.failure})",
        "refused": f"refused by the engine ({outcome.failure})",
        "interrupted": f"cut short: {outcome.message}",
        "lost": f"lost: {outcome.message}",
    }[outcome.status]
    session.emit("tool_result" if outcome.status == "measured" else "warning", f"{task.label} on {where}: {text}")
    return BatchEntry(eid, outcome.status, outcome.message or (outcome.failure_detail or ""), outcome.placement)


def _bring_log(session: Session, task: ExperimentTask, outcome: TaskOutcome) -> Path | None:
    """The server's log on this host: the task's own file when it ran here, else the text it brought back, appended to
    the file the serial path would have written (a relaunch appends there too)."""
    path = Path(task.log_path)
    if outcome.log_text is None:
        return path if path.exists() else None
    header = f"\n# pivot: {task.label} on {outcome.placement.host}"
    if outcome.placement.log_path:
        header += f" (its log there: {outcome.placement.log_path})"
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(header + "\n" + outcome.log_text[-MAX_LOG_BYTES:])
        return path
    return None


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _record_profile(session: Session, eid: int, summary: m.ProfileSummary) -> None:
    """A profile the task took: recorded as evidence with the experiment's analysis, as the profile tool does."""
    from agent.errors import PivotError
    from tools.analysis import analyze, check_plan, same_config_analysed

    analyze(session, eid, profile=summary)
    for other in same_config_analysed(session.store, session.id, eid):
        analyze(session, other)
    with contextlib.suppress(PivotError):
        check_plan(session)
