"""The Ray executor's parts that need no Ray cluster: the keeper of a task's servers, and the Ray executor's refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.errors import PivotError
from agent.servers import MARK_VAR, marked_processes
from tests.procs import until
from tools.executors import keeper
from tools.executors.ray_cluster import import_ray

ROOT = Path(__file__).resolve().parents[1]
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def _spawn(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(SLEEP, env={**os.environ, **env}, start_new_session=True, cwd=ROOT)


def test_marked_processes_reads_the_named_variable() -> None:
    mark = f"mark-{os.getpid()}-{time.monotonic_ns()}"
    proc = _spawn({keeper.TASK_VAR: mark})
    try:
        assert until(lambda: marked_processes(mark, keeper.TASK_VAR) == [proc.pid], 5)
        assert marked_processes(mark) == []  # the default variable is the server mark, which it does not carry
        assert MARK_VAR == "PIVOT_SERVER_OF"
    finally:
        proc.kill()
        proc.wait()


def test_the_keeper_stops_the_marked_groups_when_the_worker_is_gone() -> None:
    mark = f"task-{os.getpid()}-{time.monotonic_ns()}"
    worker = _spawn({})  # stands for the Ray worker
    server = _spawn({keeper.TASK_VAR: mark})  # a server the task launched, in its own session
    bystander = _spawn({keeper.TASK_VAR: mark + "-other"})  # another task's server
    guard = keeper.spawn(worker.pid, mark)
    try:
        time.sleep(1.0)
        assert guard.poll() is None and server.poll() is None  # the worker lives: the keeper waits
        worker.kill()
        worker.wait()
        assert until(lambda: server.poll() is not None, 10), "the keeper did not stop the marked server"
        assert until(lambda: guard.poll() is not None, 5) and guard.returncode == 0
        assert bystander.poll() is None
    finally:
        for p in (worker, server, bystander, guard):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_keeper_sees_a_reused_pid_as_gone() -> None:
    mark = f"task-{os.getpid()}-{time.monotonic_ns()}"
    server = _spawn({keeper.TASK_VAR: mark})
    try:  # the watched pid runs, but it started at another time than the keeper was told: not the worker
        # the server is up and marked before the keeper looks, as a task's server is (keep() looks once)
        assert until(lambda: marked_processes(mark, keeper.TASK_VAR) == [server.pid], 5)
        keeper.keep(os.getpid(), "1", mark, poll_s=0.05)
        assert until(lambda: server.poll() is not None, 10)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def test_without_ray_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(PivotError) as err:
        import_ray()
    assert "needs Ray" in err.value.message and err.value.hint == "pip install 'pivot[ray]'"


def test_an_unreachable_cluster_is_refused_at_once() -> None:
    pytest.importorskip("ray", reason="the Ray executor needs the pivot[ray] extra (pip install 'pivot[ray]')")
    from tools.executors.ray_cluster import RayExecutor

    with pytest.raises(PivotError) as err:
        RayExecutor("127.0.0.1:1", 2)
    assert "127.0.0.1:1" in err.value.message and "ray start --head" in (err.value.hint or "")
    with pytest.raises(PivotError, match="at least 1"):
        RayExecutor("local", 0)
