"""The keeper of a Ray task's servers: stops them when the worker that runs the task is gone.

A Ray task launches its server in the server's own session (start_new_session), so when Ray SIGKILLs the worker
(the driver died, the task was force-cancelled, the worker ran out of memory) the server would keep running and
keep its GPUs. Before it launches anything, the task spawns a keeper, in a session of its own too:

    python -m tools.executors.keeper --watch PID --watch-start TICKS --mark ID

and launches its servers with `PIVOT_TASK_OF=ID` in their environment (their children inherit it). The keeper
polls every half second; when the watched pid is gone, or is another process now (its kernel start time
changed), it stops every process group whose processes carry `PIVOT_TASK_OF=ID` (SIGTERM, SIGKILL after a grace
period) and exits. A task that ends normally stops its server itself and then terminates its keeper.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from agent.servers import marked_processes, pid_alive, proc_start, stop_group

TASK_VAR = "PIVOT_TASK_OF"  # in the environment of every process a Ray task launched: which task owns it
POLL_S = 0.5
STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL: nobody waits for these servers' results any more


def task_groups(task_of: str) -> dict[int, list[int]]:
    """The process groups with a process that carries `PIVOT_TASK_OF=task_of` (this process excluded), with
    those processes."""
    groups: dict[int, list[int]] = {}
    for pid in marked_processes(task_of, TASK_VAR):
        if pid == os.getpid():
            continue
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            continue
        groups.setdefault(pgid, []).append(pid)
    return groups


def stop_task_processes(task_of: str, grace_s: float = STOP_GRACE_S) -> list[int]:
    """Stop every process group a task launched (found by its mark); returns the groups it signalled."""
    groups = task_groups(task_of)
    if os.getpgid(0) in groups:  # never this process's own group (a process that carries the mark by mistake)
        groups.pop(os.getpgid(0))
    for pgid, pids in sorted(groups.items()):
        starts = [int(s) for s in (proc_start(p) for p in pids) if s is not None and s.isdigit()]
        stop_group(pgid, grace_s, started_since=str(min(starts)) if starts else None)
    return sorted(groups)


def spawn(watch_pid: int, task_of: str) -> subprocess.Popen[bytes]:
    """Start a keeper for the processes marked `task_of`, watching `watch_pid` (this worker)."""
    env = {k: v for k, v in os.environ.items() if k != TASK_VAR}
    argv = [sys.executable, "-m", "tools.executors.keeper", "--watch", str(watch_pid)]
    start = proc_start(watch_pid)
    if start is not None:
        argv += ["--watch-start", start]
    argv += ["--mark", task_of]
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def keep(watch_pid: int, watch_start: str | None, task_of: str, *, poll_s: float = POLL_S) -> None:
    """Wait until `watch_pid` is gone, then stop what the task left running."""
    while pid_alive(watch_pid, watch_start):
        time.sleep(poll_s)
    stop_task_processes(task_of)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.executors.keeper", description=__doc__.splitlines()[0])
    parser.add_argument("--watch", type=int, required=True, help="the pid of the Ray worker that runs the task")
    parser.add_argument("--watch-start", default=None, help="its kernel start time (clock ticks since boot)")
    parser.add_argument("--mark", required=True, help=f"the task's {TASK_VAR} value")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the task ended normally and stopped its server
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of whoever started the worker is not for the keeper
    keep(args.watch, args.watch_start, args.mark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
