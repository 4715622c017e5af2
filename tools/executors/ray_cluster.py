"""The Ray executor: each experiment is a Ray task that asks for its configuration's GPUs, on whichever node has them.

    executor = RayExecutor("local", parallel=2)      # or "auto", "head-host:6379", "ray://head-host:10001"
    for outcome in executor.run(tasks, on_event=show):
        record(outcome)
    executor.close()

Ray places each task (tools/executors/ray_task.py) on a node with `task.gpus` free GPUs and sets its
CUDA_VISIBLE_DEVICES; the engine and the load generator run there. The task asks for no CPU (`num_cpus=0`): it
only orchestrates, and its server runs outside Ray's CPU accounting. The driver submits at most `parallel` tasks at
once and queues the rest; one reader thread per task turns the task's stream into events and one outcome, and
`run` hands them over in the caller's thread. Ray never retries a task (`max_retries=0`): a task whose node or
worker died comes back `lost` and the driver decides whether to run it again.

A task that no alive node can place (no node has that many GPUs) is not submitted: it fails as `unschedulable`.
A KeyboardInterrupt in the caller, or the caller closing the generator, cancels every running task (each stops
its server) and waits up to CANCEL_WAIT_S for them. A driver that dies without a word leaves no server: its
`Lease` actor goes with it, which the tasks notice, and each task's keeper stops the servers of a killed worker.

Authentication (Ray 2.60): a local instance this executor starts (`local`) gets a token of its own, in a private
temporary file (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH), unless RAY_AUTH_MODE or a token is already set in the
environment, so nothing under ~/.ray is read or written. `ray start --head` turns token auth on only when a token
exists on the head (~/.ray/auth_token, from `ray get-auth-token --generate`, or RAY_AUTH_TOKEN[_PATH]); then every
worker node (`ray start --address=HEAD:6379`) and this driver need the same token and RAY_AUTH_MODE=token (`auto`
turns it on by itself when a token is found; an explicit address does not). `ray://` addresses need the
`ray[client]` package on the driver and the head.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent import models as m
from agent.contracts import EventCallback, ExperimentTask, TaskEvent, TaskOutcome
from agent.errors import PivotError
from tools.engines.process import scrubbed_environ
from tools.executors.ray_task import DriverGone, Lease, Placed, placed_event, task_body

CANCEL_WAIT_S = 20.0  # after ray.cancel, how long the driver waits for the tasks to stop their servers
CONNECT_CHECK_S = 5.0  # a cluster address that accepts no TCP connection in this time is refused at once
POLL_S = 0.25
WAIT_NOTICE_S = 10.0  # a task Ray has not placed after this long waits for GPUs: the driver says so, once
INSTALL_HINT = "pip install 'pivot[ray]'"
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def import_ray() -> Any:
    """The ray module, or a PivotError that says how to install it."""
    try:
        import ray
    except ImportError as err:
        raise PivotError(f"running experiments on a Ray cluster needs Ray ({err})", hint=INSTALL_HINT) from err
    return ray


def _reachable(address: str) -> str | None:
    """None when `address` (host:port or ray://host:port) accepts a TCP connection, else why not."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port or (10001 if parts.scheme == "ray" else 6379)
    except ValueError as err:
        return f"it is not a host:port address ({err})"
    if not host:
        return "it names no host"
    try:
        with socket.create_connection((host, port), timeout=CONNECT_CHECK_S):
            return None
    except OSError as err:
        return f"nothing answers at {host}:{port} ({err.strerror or err})"


@dataclass
class _Running:
    task: ExperimentTask
    started: Any  # datetime
    stream: Any  # ray's ObjectRefGenerator
    reader: threading.Thread
    placed: list[Placed] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)  # when it was submitted
    noticed: bool = False  # whether the driver said it waits for GPUs


class RayExecutor:
    """Runs experiment tasks on a Ray cluster (or a local Ray instance), up to `parallel` at once."""

    name = "ray"

    def __init__(self, address: str, parallel: int, *, num_gpus: int | None = None, temp_root: str | None = None):
        if parallel < 1:
            raise PivotError(f"parallel must be at least 1, got {parallel}")
        self.address, self.parallel, self.temp_root = address, parallel, temp_root
        self._ray = import_ray()
        self._closed = False
        self._owns_instance = False
        self._saved_env: dict[str, str | None] = {}
        self._token_dir: str | None = None
        self._local_keeper: Any = None  # the keeper of a local instance this executor started
        self._local_dir: str | None = None  # its pids file's folder
        self._pids_file: str | None = None
        self._local_mark = ""
        self._connect(num_gpus)
        try:
            self._lease = self._new_lease()
            self._ray.get(self._lease.ping.remote(), timeout=60)
            self._remote = self._ray.remote(num_returns="streaming", max_retries=0, retry_exceptions=False)(task_body)
        except BaseException:
            self.close()
            raise

    # ---- connection

    def _connect(self, num_gpus: int | None) -> None:
        ray = self._ray
        if ray.is_initialized():
            raise PivotError(
                "Ray is already initialized in this process; pivot connects to the cluster itself",
                hint="run pivot as its own process (not inside a Ray job)",
            )
        if self.address == "local":
            self._private_token()
            self._watch_local_instance()
            try:
                # Ray's processes (and the servers its workers launch) inherit no key but Ray's own
                with scrubbed_environ(keep=AUTH_VARS):
                    ray.init(  # "local": a new instance even where RAY_ADDRESS names a cluster
                        address="local", num_gpus=num_gpus, include_dashboard=False, log_to_driver=False,
                        configure_logging=False,
                    )  # fmt: skip
            except Exception as err:
                self._restore_env()
                raise PivotError(f"cannot start a local Ray instance: {err}", hint="see `ray status`") from err
            self._owns_instance = True
            self._list_local_instance()
            return
        if self.address != "auto" and (why := _reachable(self.address)) is not None:
            raise PivotError(
                f"cannot reach the Ray cluster at {self.address}: {why}",
                hint="start its head with `ray start --head` and pass its address: HOST:6379 (this host must be a node of "
                "the cluster), or ray://HOST:10001 (needs ray[client] here and on the head)",
            )
        try:
            ray.init(address=self.address, log_to_driver=False, configure_logging=False)
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise PivotError(
                f"cannot connect to the Ray cluster at {self.address}: {first}",
                hint="check the address; a cluster with token auth needs its token here (RAY_AUTH_TOKEN, or "
                "~/.ray/auth_token copied from the head) and RAY_AUTH_MODE=token",
            ) from err

    def _watch_local_instance(self) -> None:
        """Mark the processes of the local instance about to start (they inherit the environment) and start a keeper
        that stops them if this process dies without closing it (a SIGKILL leaves Ray's agents running)."""
        from tools.executors import keeper

        mark = secrets.token_hex(8)
        self._saved_env[keeper.LOCAL_RAY_VAR] = os.environ.get(keeper.LOCAL_RAY_VAR)
        os.environ[keeper.LOCAL_RAY_VAR] = mark
        self._local_dir = tempfile.mkdtemp(prefix="pivot-ray-local-")
        self._pids_file = str(Path(self._local_dir) / "pids")
        folders = [self._local_dir, *([self._token_dir] if self._token_dir else [])]
        self._local_keeper = keeper.spawn(
            os.getpid(), mark, var=keeper.LOCAL_RAY_VAR, pids_file=self._pids_file, remove=folders
        )
        self._local_mark = mark

    def _list_local_instance(self) -> None:
        """Write the local instance's processes (those marked and everything below them) for its keeper: Ray's agents
        rename themselves, which wipes the mark they inherited from /proc."""
        from agent.servers import marked_processes, proc_start
        from tools.executors import keeper

        if self._pids_file is None:
            return
        roots = [p for p in marked_processes(self._local_mark, keeper.LOCAL_RAY_VAR) if p != os.getpid()]
        lines = [f"{pid} {proc_start(pid)}" for pid in keeper.descendants(roots) if proc_start(pid) is not None]
        tmp = self._pids_file + ".tmp"
        Path(tmp).write_text("\n".join(lines) + "\n")
        os.replace(tmp, self._pids_file)

    def _private_token(self) -> None:
        """A token of this instance's own in a private file, unless the environment already decides auth."""
        if any(os.environ.get(v) for v in AUTH_VARS):
            return
        self._token_dir = tempfile.mkdtemp(prefix="pivot-ray-auth-")
        path = Path(self._token_dir) / "auth_token"
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(32))
        for var, value in (("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN_PATH", str(path))):
            self._saved_env[var] = os.environ.get(var)
            os.environ[var] = value
        _reload_auth_config()

    def _restore_env(self) -> None:
        if self._local_keeper is not None:  # the instance is shut down (or never started): nothing to stop
            self._local_keeper.terminate()
            with contextlib.suppress(Exception):
                self._local_keeper.wait(5.0)
            self._local_keeper = None
        if self._local_dir is not None:
            shutil.rmtree(self._local_dir, ignore_errors=True)
            self._local_dir = self._pids_file = None
        for var, value in self._saved_env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        self._saved_env = {}
        _reload_auth_config()
        if self._token_dir is not None:
            shutil.rmtree(self._token_dir, ignore_errors=True)
            self._token_dir = None

    def _new_lease(self) -> Any:
        """The Lease actor, on this driver's own node: a lease on another node would die with that node, and every
        task would take the driver for dead."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(node_id=self._ray.get_runtime_context().get_node_id(), soft=True)
        return self._ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy=here)(Lease).remote()

    # ---- the cluster

    def _nodes(self) -> list[dict[str, Any]]:
        return [n for n in self._ray.nodes() if n.get("Alive")]

    def describe(self) -> str:
        nodes = self._nodes()
        gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in nodes)
        where = "a local Ray instance" if self._owns_instance else f"Ray cluster at {self.address}"
        return (f"{where}: {len(nodes)} node{'s' if len(nodes) != 1 else ''}, {gpus:g} GPUs; "
                f"up to {self.parallel} experiment{'s' if self.parallel != 1 else ''} at once")  # fmt: skip

    def _unschedulable(self, task: ExperimentTask, nodes: list[dict[str, Any]]) -> TaskOutcome | None:
        """A failed outcome when no alive node has the GPUs the task asks for (it would wait forever)."""
        per_node = [float(n.get("Resources", {}).get("GPU", 0)) for n in nodes]
        largest = max(per_node, default=0.0)
        if task.gpus <= largest:
            return None
        now = m.utcnow()
        detail = (
            f"it needs {task.gpus} GPUs on one node; the largest of the cluster's {len(nodes)} alive "
            f"node{'s' if len(nodes) != 1 else ''} has {largest:g} ({sum(per_node):g} GPUs in all)"
        )
        return TaskOutcome(task=task, status="failed", started_at=now, finished_at=now,
                           placement=m.Placement(executor="ray", host="(not placed)"),
                           failure="unschedulable", failure_detail=detail, message=detail)  # fmt: skip

    # ---- running

    def run(self, tasks: Sequence[ExperimentTask], on_event: EventCallback) -> Iterator[TaskOutcome]:
        if self._closed:
            raise PivotError("this Ray executor was closed")
        inbox: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        pending: deque[tuple[int, ExperimentTask]] = deque()
        running: dict[int, _Running] = {}
        nodes = self._nodes()
        for key, task in enumerate(tasks):  # what no node can place fails at once, before anything runs
            refused = self._unschedulable(task, nodes)
            if refused is None:
                pending.append((key, task))
                continue
            on_event(TaskEvent(task.experiment_id, f"{task.label}: not run: {refused.message}", "warning"))
            yield refused
        try:
            while pending or running:
                while pending and len(running) < self.parallel:
                    key, task = pending.popleft()
                    refused = self._unschedulable(task, self._nodes())  # a node may have died since
                    if refused is not None:
                        on_event(TaskEvent(task.experiment_id, f"{task.label}: not run: {refused.message}", "warning"))
                        yield refused
                        continue
                    running[key] = self._submit(key, task, inbox)
                if not running:
                    continue
                got = self._next(inbox)
                if got is None:
                    self._notice_waiting(running, on_event)
                    continue
                kind, key, item = got
                if kind == "event":
                    on_event(item)
                elif key in running:
                    running.pop(key).reader.join(1.0)
                    yield item
        finally:
            if running:
                self._cancel(running, inbox)

    def _notice_waiting(self, running: dict[int, _Running], on_event: EventCallback) -> None:
        """Say once about each task that Ray has not placed after WAIT_NOTICE_S (its GPUs are busy)."""
        now = time.monotonic()
        waiting = [e for e in running.values() if not e.placed and not e.noticed and now - e.since > WAIT_NOTICE_S]
        if not waiting:
            return
        free = self._ray.available_resources().get("GPU", 0.0)
        total = self._ray.cluster_resources().get("GPU", 0.0)
        for entry in waiting:
            entry.noticed = True
            on_event(TaskEvent(entry.task.experiment_id, f"{entry.task.label}: waiting for {entry.task.gpus} free "
                               f"GPUs on one node ({free:g} of the cluster's {total:g} GPUs are free now)", "info"))  # fmt: skip

    def _submit(self, key: int, task: ExperimentTask, inbox: queue.Queue[tuple[str, int, Any]]) -> _Running:
        stream = self._remote.options(num_gpus=task.gpus, num_cpus=0).remote(task, self._lease, self.temp_root)
        entry = _Running(task=task, started=m.utcnow(), stream=stream, reader=threading.Thread(daemon=True))
        entry.reader = threading.Thread(target=self._read, args=(key, entry, inbox), daemon=True,
                                        name=f"pivot-ray-reader-{task.experiment_id}")  # fmt: skip
        entry.reader.start()
        return entry

    @staticmethod
    def _next(inbox: queue.Queue[tuple[str, int, Any]]) -> tuple[str, int, Any] | None:
        """The next event or outcome, or None after a short wait (so a KeyboardInterrupt reaches this thread)."""
        try:
            return inbox.get(timeout=POLL_S)
        except queue.Empty:
            return None

    def _read(self, key: int, entry: _Running, inbox: queue.Queue[tuple[str, int, Any]]) -> None:
        """A reader thread: the task's stream into the inbox, ending with exactly one outcome."""
        ray = self._ray
        try:
            for ref in entry.stream:
                item = ray.get(ref)
                if isinstance(item, Placed):
                    entry.placed.append(item)
                    inbox.put(("event", key, placed_event(entry.task, item)))
                elif isinstance(item, TaskEvent):
                    inbox.put(("event", key, item))
                elif isinstance(item, TaskOutcome):
                    inbox.put(("outcome", key, item))
                    return
            inbox.put(("outcome", key, self._ended(entry, "lost", "the task ended without an outcome")))
        except BaseException as err:  # every task gets an outcome, whatever happened
            inbox.put(("outcome", key, self._from_error(entry, err)))

    def _ended(self, entry: _Running, status: str, message: str, **kw: Any) -> TaskOutcome:
        placed = entry.placed[0] if entry.placed else None
        placement = m.Placement(executor="ray", host="(not placed)")
        if placed is not None:
            placement = m.Placement(
                executor="ray",
                host=placed.host,
                node_id=placed.node_id,
                gpu_ids=placed.gpu_ids,
                log_path=placed.log_path,
            )
        return TaskOutcome(task=entry.task, status=status, started_at=entry.started, finished_at=m.utcnow(),  # type: ignore[arg-type]
                           placement=placement, message=message, **kw)  # fmt: skip

    def _from_error(self, entry: _Running, err: BaseException) -> TaskOutcome:
        """The outcome of a task whose stream raised: cancelled -> interrupted, an error of the task's own ->
        failed, anything of Ray's (node or worker died, owner died, object lost) -> lost."""
        from ray import exceptions as rx

        where = f" on {entry.placed[0].host}" if entry.placed else ""
        cause = getattr(err, "cause", None)
        if isinstance(err, rx.TaskCancelledError) or isinstance(cause, (KeyboardInterrupt, rx.TaskCancelledError)):
            return self._ended(entry, "interrupted", f"cancelled{where}")
        if isinstance(cause, DriverGone):  # the executor's own lease actor is gone: Ray's failure, not the engine's
            return self._ended(entry, "lost", f"the executor's lease actor is gone{where}: {cause}")
        if isinstance(err, rx.RayTaskError) and not isinstance(cause, rx.RayError):
            shown = f"{type(cause).__name__}: {cause}" if cause is not None else _first_line(err)
            failure = "engine-not-installed" if isinstance(cause, ImportError) else "unknown"
            detail = f"the task raised{where}: {shown}"[:500]
            return self._ended(entry, "failed", detail, failure=failure, failure_detail=detail)
        if isinstance(err, rx.RayError) or isinstance(cause, rx.RayError):
            return self._ended(entry, "lost", f"Ray lost the task{where}: {type(err).__name__}: {_first_line(err)}")
        detail = f"{type(err).__name__}: {_first_line(err)}"[:500]
        return self._ended(entry, "failed", detail, failure="unknown", failure_detail=detail)

    def _cancel(self, running: dict[int, _Running], inbox: queue.Queue[tuple[str, int, Any]]) -> None:
        """Cancel the running tasks (each stops its server) and wait up to CANCEL_WAIT_S for them to end."""
        for entry in running.values():
            with contextlib.suppress(Exception):
                self._ray.cancel(entry.stream)
        deadline = time.monotonic() + CANCEL_WAIT_S
        for entry in running.values():
            entry.reader.join(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(queue.Empty):
            while True:
                inbox.get_nowait()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._ray.shutdown()
        self._restore_env()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reload_auth_config() -> None:
    """Make this process's Ray see the auth variables as they are now (Ray reads them once, at import; this is
    what its own `ray.init` does when it turns token auth on), and forget a token it cached."""
    with contextlib.suppress(Exception):
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__
