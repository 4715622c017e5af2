"""One experiment's run on whatever host runs it: launch, wait until ready, sweep with telemetry, profile, stop.

`run_task` needs none of the ledger: it builds the engine from the task's name and options, so it runs the same in
this process (the local executor) and in a Ray worker on another node. Whatever happens, the server it started is
stopped before it returns or raises (a KeyboardInterrupt, the way Ray cancels a task, included).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from agent import models as m
from agent.contracts import (
    Deployment,
    Engine,
    ExperimentTask,
    LedgerLink,
    OutcomeStatus,
    TaskEvent,
    TaskOutcome,
    load_engine,
)
from agent.errors import Interrupted, LaunchFailed, PivotError, RequestsRefused
from tools.engines.failures import serving_failure

PORT_RETRIES = 2  # another server took the port between its pick and the launch (servers side by side on a host)
MAX_ERRORS = 3

Emit = Callable[[TaskEvent], None]


def telling_line(engine: Engine, tail: Sequence[str]) -> str | None:
    """The log line that says why a server failed, as the engine's crash classifier found it, else the last
    non-empty line."""
    from tools.engines.failures import short_line

    line = engine.diagnose(tail).line or next((x for x in reversed(tail) if x.strip()), None)
    return short_line(line, 300) if line else None


def gpu_ids() -> list[str]:
    """The GPUs this process was given (CUDA_VISIBLE_DEVICES), as ids; empty when it was given no list."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return [g.strip() for g in value.split(",") if g.strip()] if value else []


def run_task(
    task: ExperimentTask,
    emit: Emit,
    *,
    ledger: LedgerLink | None = None,
    placement: m.Placement | None = None,
    log_path: Path | None = None,
    raw_path: Path | None = None,
    engine: Engine | None = None,
) -> TaskOutcome:
    """Run `task` here; the server's log goes to `log_path` and the sweep's JSONL to `raw_path` (default: the
    task's own paths, which are the driver's). `ledger` records the server in the ledger (only the driver's process
    has one); `placement` says where this is (default: this host, the local executor); `engine` is the driver's
    own engine seeded for the task (the local executor), else one is built from the task's name and options."""
    started = m.utcnow()
    place = placement or m.Placement(executor="local", host=socket.gethostname(), gpu_ids=gpu_ids())
    log = Path(log_path or task.log_path)
    raw = Path(raw_path or task.raw_path)

    def outcome(status: OutcomeStatus, **kw: object) -> TaskOutcome:
        return TaskOutcome(task=task, status=status, started_at=started, finished_at=m.utcnow(), placement=place,
                           **kw)  # type: ignore[arg-type]  # fmt: skip

    def say(message: str, kind: str = "progress") -> None:
        emit(TaskEvent(task.experiment_id, f"{task.label}: {message}", kind))  # type: ignore[arg-type]

    engine = engine or load_engine(task.engine, **task.engine_options).with_seed(task.seed)
    where = f" on {place.host}" + (f" (GPUs {','.join(place.gpu_ids)})" if place.gpu_ids else "")
    say(f"launching {engine.name}{where} with {task.config}")
    deployment: Deployment | None = None
    try:
        for attempt in range(PORT_RETRIES + 1):
            deployment, failed = _start(engine, task, log, ledger, say, outcome)
            if failed is None:
                break
            deployment = None
            if failed.failure != "port-in-use" or attempt == PORT_RETRIES:
                return failed
            say("its port was taken by another server in the meantime; launching again on another port", "warning")
        assert deployment is not None
        say(f"server ready at {deployment.base_url}", "info")
        raw.parent.mkdir(parents=True, exist_ok=True)
        spec = task.workload
        say(f"benchmarking levels {', '.join(map(str, spec.concurrency))}")
        try:
            result = deployment.benchmark(spec, lambda line: say(line), output_file=raw)
        except RequestsRefused as err:  # up, but it refused every request: the experiment failed, in its words
            named = serving_failure([err.detail])  # its answers name the cause (a CUDA OOM while loading on demand)
            failure = named.failure if named is not None else err.failure
            detail = err.message if named is not None else f"{err.message} ({err.hint})"
            say(f"the server failed the benchmark's requests ({failure}): {err.detail[:200]}", "warning")
            return outcome("failed", failure=failure, failure_detail=detail[:500], log_tail=deployment.log_tail(5))
        if result.interrupted:
            return outcome("interrupted", message="the benchmark was cut short before it finished")
        if not result.levels:
            return outcome("interrupted", message="the benchmark produced no level")
        failed_levels = [lv for lv in result.levels if lv.failed > 0]
        failure = deployment.failure if failed_levels else None
        errors = sorted({err for lv in failed_levels for err in lv.errors})[:MAX_ERRORS]
        if failed_levels and failure is None:
            named = serving_failure(errors)  # the server's answers name the cause: a CUDA OOM at a larger batch
            failure = named.failure if named is not None else "unknown" if deployment.alive() else "server-exited"
        telemetry = list(deployment.level_telemetry)  # the sweep's (a capacity level's benchmark starts afresh)
        profile = None
        if task.profile and deployment.alive():
            say("profiling under load")
            profile = deployment.profile(Path(task.profile_dir or raw.parent / "profiles"))
        if task.objective is not None and task.objective.kind == "capacity" and deployment.alive():
            from tools.loadgen.capacity import run_capacity

            capacity = run_capacity(deployment, spec, task.objective, result, predicted=task.capacity_start,
                                    on_progress=lambda line: say(line), output_file=raw)  # fmt: skip
            result = result.model_copy(update={"capacity": capacity})
        return outcome(
            "measured",
            bench=result,
            telemetry=telemetry,
            failure=failure,
            errors=errors,
            server_alive=deployment.alive(),
            log_tail=deployment.log_tail(5),
            profile=profile,
        )
    finally:
        if deployment is not None:
            deployment.stop()


def _start(
    engine: Engine,
    task: ExperimentTask,
    log: Path,
    ledger: LedgerLink | None,
    say: Callable[..., None],
    outcome: Callable[..., TaskOutcome],
) -> tuple[Deployment | None, TaskOutcome | None]:
    """Launch and wait until ready: (the deployment, None), or (None, the outcome of a server that did not start)."""
    from tools.engines.process import CLASSIFY_LINES, FlagsRefused

    def failed(status: OutcomeStatus, failure: str, detail: str, tail: list[str] | None = None) -> TaskOutcome:
        say(f"did not start ({failure}): {detail[:200]}", "warning")
        return outcome(status, failure=failure, failure_detail=detail[:500], log_tail=tail or [])

    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        deployment = engine.launch(task.config, log, ledger=ledger, issues=task.audit)
    except FlagsRefused as err:  # the engine's own audit disagreed with the driver's: recorded the same way
        return None, failed("refused", "unrecognized-argument", err.message)
    except Interrupted:  # the driver is stopping: not a server that failed to start
        raise
    except PivotError as err:
        return None, failed("failed", err.failure if isinstance(err, LaunchFailed) else "unknown", err.message)
    try:
        deployment.wait_ready(task.ready_timeout_s, lambda line: say(line))
    except PivotError as err:
        failure = err.failure if isinstance(err, LaunchFailed) else deployment.failure or "unknown"
        tail = deployment.log_tail(15)
        why = telling_line(engine, deployment.log_tail(CLASSIFY_LINES))  # the classifier's line may be far up
        deployment.stop()
        return None, failed("failed", failure, why or err.message, tail)
    except BaseException:
        deployment.stop()
        raise
    return deployment, None


@contextlib.contextmanager
def environ(extra: dict[str, str]):  # type: ignore[no-untyped-def]
    """This process's environment with `extra` set while the block runs (a Ray worker runs one task at a time, so
    the servers it launches inherit the marks), restored after."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
