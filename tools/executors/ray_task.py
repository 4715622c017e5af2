"""What runs inside a Ray worker for one experiment task: `task_body`, a generator the executor makes a Ray task of.

It needs pivot installed on the node (the worker imports this module); `ray` is imported only inside the task.
The task runs `run_task` in a thread of its own and, in the worker's main thread (where Ray raises the
KeyboardInterrupt of a `ray.cancel`), yields what it reports:

1. a `Placed` record first (host, Ray node, GPUs, worker pid, the log's path there), so the driver knows where it
   runs even if the node dies afterwards;
2. the `TaskEvent`s of run_task as they come;
3. the `TaskOutcome` last, with the log's text (its last MAX_LOG_BYTES) and the sweep's raw JSONL in it, because
   the files are on this node: they are written under `<tmp>/pivot-ray/<session>/...` here, never at the
   driver's paths.

Three things stop the server when the task cannot: the task's own cancel path (a KeyboardInterrupt raised into
the runner thread, so run_task's `finally` stops the server, then a sweep of the processes it marked); the
driver's `Lease` actor, pinged every LEASE_POLL_S (when the driver dies, Ray kills the actor it owns, and the task
stops its server and ends); and the keeper process (tools/executors/keeper.py), which outlives a SIGKILLed worker.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import queue
import re
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import models as m
from agent.contracts import ExperimentTask, TaskEvent, TaskOutcome
from agent.servers import MARK_VAR
from tools.executors import keeper
from tools.executors.task import environ, gpu_ids, run_task

MAX_LOG_BYTES = 2 * 1024 * 1024  # the log's tail a task sends back
LEASE_POLL_S = 1.5  # how often a task asks whether the driver's lease is still there
LEASE_TIMEOUT_S = 10.0  # a ping that does not answer in this time says nothing either way
RUNNER_STOP_S = 20.0  # a cancelled run_task has this long to stop its server before its processes are stopped
TMP_DIR = "pivot-ray"
_DONE = object()


@dataclass(frozen=True)
class Placed:
    """Where a task started: the first thing it yields."""

    host: str
    node_id: str
    gpu_ids: list[str]
    pid: int  # the Ray worker's pid on that host
    log_path: str  # the server's log on that host


class DriverGone(RuntimeError):
    """The driver's lease actor is gone: the driver died, so the task stopped its server and ended."""


class Lease:
    """An actor the driver owns (not detached): Ray kills it when the driver dies, and the tasks notice."""

    def ping(self) -> bool:
        return True


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "session"


def work_dir(task: ExperimentTask, task_of: str, root: str | None = None) -> Path:
    """Where a task keeps its server's log and the sweep's raw file on its node."""
    base = Path(root or tempfile.gettempdir()) / TMP_DIR / _safe(task.session_id)
    return base / f"experiment-{task.experiment_id}-run-{task.run}-{task_of[:8]}"


def read_tail(path: Path, limit: int = MAX_LOG_BYTES) -> str | None:
    """The last `limit` bytes of a file as text, None when it is not there."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def _lease_alive(lease: Any) -> bool:
    """False only when Ray says the lease actor is dead; a slow or unreachable answer counts as alive."""
    import ray
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

    try:
        ray.get(lease.ping.remote(), timeout=LEASE_TIMEOUT_S)
    except (GetTimeoutError, ActorUnavailableError):
        return True
    except RayActorError:
        return False
    return True


def _interrupt(thread: threading.Thread) -> None:
    """Raise KeyboardInterrupt in `thread` (at its next Python instruction), as Ray does in the main thread."""
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))


def _stop_runner(thread: threading.Thread, task_of: str) -> None:
    """Stop a running run_task: interrupt it (its `finally` stops the server), wait, then stop what it marked."""
    _interrupt(thread)  # once: a second one could cut short the stop that the first one began
    if thread.ident is not None:
        thread.join(RUNNER_STOP_S)
    keeper.stop_task_processes(task_of)  # whatever is left (the runner was deaf to the interrupt, or too slow)


def task_body(task: ExperimentTask, lease: Any, root: str | None = None) -> Iterator[object]:
    """The Ray task of one experiment (a streaming generator): Placed, TaskEvents, then the TaskOutcome."""
    import ray

    task_of = uuid.uuid4().hex
    folder = work_dir(task, task_of, root)
    log, raw = folder / "server.log", folder / "raw.jsonl"
    node_id = ray.get_runtime_context().get_node_id()
    placed = Placed(socket.gethostname(), node_id, gpu_ids(), os.getpid(), str(log))
    yield placed
    placement = m.Placement(executor="ray", host=placed.host, node_id=node_id, gpu_ids=placed.gpu_ids,
                            log_path=str(log))  # fmt: skip
    here = dataclasses.replace(task, profile_dir=str(folder / "profiles"))  # the driver's folder is not on this host
    events: queue.Queue[object] = queue.Queue()
    result: dict[str, Any] = {}
    guard = keeper.spawn(os.getpid(), task_of)  # before anything is launched: it outlives a SIGKILLed worker

    def runner() -> None:
        try:
            with environ({keeper.TASK_VAR: task_of, MARK_VAR: task.mark}):
                result["outcome"] = run_task(here, events.put, placement=placement, log_path=log, raw_path=raw)
        except BaseException as err:  # re-raised in the task's own thread below
            result["error"] = err
        finally:
            events.put(_DONE)

    thread = threading.Thread(target=runner, name=f"pivot-task-{task.experiment_id}", daemon=True)
    try:
        thread.start()
        next_ping = time.monotonic() + LEASE_POLL_S
        while True:
            try:
                item = events.get(timeout=0.25)
            except queue.Empty:
                item = None
            if item is _DONE:
                break
            if item is not None:
                yield item
            if time.monotonic() >= next_ping:
                if not _lease_alive(lease):
                    raise DriverGone("the driver that submitted this task is gone; its server was stopped")
                next_ping = time.monotonic() + LEASE_POLL_S
    except BaseException:
        _stop_runner(thread, task_of)
        raise
    finally:
        _end_keeper(guard)
    if "error" in result:
        raise result["error"]
    outcome: TaskOutcome = result["outcome"]
    outcome.task = task
    outcome.log_text = read_tail(log)
    outcome.raw_jsonl = read_tail(raw, 1 << 30)
    yield outcome


def _end_keeper(guard: Any) -> None:
    guard.terminate()
    try:
        guard.wait(5.0)
    except Exception:  # it will be reaped with the worker
        guard.kill()


def placed_event(task: ExperimentTask, placed: Placed) -> TaskEvent:
    """The line the driver shows when a task starts on a node."""
    gpus = f"GPUs {','.join(placed.gpu_ids)}" if placed.gpu_ids else "no GPU list"
    return TaskEvent(
        task.experiment_id,
        f"{task.label}: running on {placed.host} (Ray node {placed.node_id[:12]}, {gpus}, Ray worker pid "
        f"{placed.pid}); its log there: {placed.log_path}",
        "info",
    )
