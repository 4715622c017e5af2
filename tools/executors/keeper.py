"""The keeper of a Ray task's servers: stops them when the worker that runs the task is gone.

A Ray task launches its server in the server's own session (start_new_session), so when Ray SIGKILLs the worker
(the driver died, the task was force-cancelled, the worker ran out of memory) the server would keep running and
keep its GPUs. Before it launches anything, the task spawns a keeper, in a session of its own too:

    python -m tools.executors.keeper --watch PID --watch-start TICKS --mark ID

and launches its servers with `PIVOT_TASK_OF=ID` in their environment (their children inherit it). The keeper
polls every half second; when the watched pid is gone, or is another process now (its kernel start time
changed), it stops every process group whose processes carry `PIVOT_TASK_OF=ID` (SIGTERM, SIGKILL after a grace
period) and exits. A task that ends normally stops its server itself and then terminates its keeper.

A local Ray instance (`--ray local`) gets a keeper too, watching the driver: its processes (raylet, GCS, agents,
workers and what they launched) carry `PIVOT_LOCAL_RAY_OF=ID`, and a SIGKILLed driver would leave Ray's agents
running; they share the driver's process group, so they are stopped one by one, never by group.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from agent.servers import marked_processes, pid_alive, proc_start, stop_group

TASK_VAR = "PIVOT_TASK_OF"  # in the environment of every process a Ray task launched: which task owns it
LOCAL_RAY_VAR = "PIVOT_LOCAL_RAY_OF"  # in the environment of every process of a local Ray instance pivot started
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


def stop_marked(mark: str, var: str, grace_s: float = STOP_GRACE_S) -> list[int]:
    """Stop every process that carries `var=mark`, one by one (SIGTERM, SIGKILL after `grace_s`), never its process
    group: a local Ray instance's processes share the group of the pivot that started it, and of its parent."""
    pids = [p for p in marked_processes(mark, var) if p != os.getpid()]
    starts = {p: proc_start(p) for p in pids}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(pid_alive(p, starts[p]) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if pid_alive(pid, starts[pid]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return pids


def listed_processes(path: str | None) -> list[tuple[int, str | None]]:
    """(pid, start time) per line of a pids file (`pid start`); empty when there is none."""
    if not path:
        return []
    try:
        lines = Path(path).read_text().split("\n")
    except OSError:
        return []
    out: list[tuple[int, str | None]] = []
    for line in lines:
        fields = line.split()
        if fields and fields[0].isdigit():
            out.append((int(fields[0]), fields[1] if len(fields) > 1 else None))
    return out


def stop_listed(path: str | None, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the processes a pids file lists that are still the processes it names (their start time matches)."""
    alive = [(pid, start) for pid, start in listed_processes(path) if start is not None and pid_alive(pid, start)]
    for pid, _ in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(pid_alive(p, s) for p, s in alive) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, start in alive:
        if pid_alive(pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def descendants(roots: list[int]) -> list[int]:
    """`roots` and every process below them (by parent pid), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(text[text.rfind(")") + 2 :].split()[1]), []).append(int(entry.name))
    out: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.append(pid)
            todo += children.get(pid, [])
    return out


def spawn(
    watch_pid: int,
    task_of: str,
    *,
    var: str = TASK_VAR,
    pids_file: str | None = None,
    remove: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start a keeper for the processes marked `var=task_of`, watching `watch_pid` (this worker; or, for a local Ray
    instance, the driver that started it: then its processes are stopped one by one, with those in `pids_file`).
    The folders in `remove` (a local instance's token and pids file) are removed once it has stopped them."""
    from tools.engines.process import server_environ

    env = {k: v for k, v in server_environ().items() if k not in (TASK_VAR, LOCAL_RAY_VAR)}  # it needs no key
    argv = [sys.executable, "-m", "tools.executors.keeper", "--watch", str(watch_pid)]
    start = proc_start(watch_pid)
    if start is not None:
        argv += ["--watch-start", start]
    argv += ["--mark", task_of] + (["--var", var] if var != TASK_VAR else [])
    argv += ["--pids-file", pids_file] if pids_file else []
    for folder in remove:
        argv += ["--remove", folder]
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def keep(
    watch_pid: int,
    watch_start: str | None,
    task_of: str,
    *,
    var: str = TASK_VAR,
    pids_file: str | None = None,
    poll_s: float = POLL_S,
    remove: Sequence[str] = (),
) -> None:
    """Wait until `watch_pid` is gone, then stop what the task (or the local Ray instance) left running: the
    processes marked, and those the pids file lists (a process that renames itself, as Ray's agents do, loses the
    mark it inherited from /proc)."""
    while pid_alive(watch_pid, watch_start):
        time.sleep(poll_s)
    if var == TASK_VAR:
        stop_task_processes(task_of)
    else:
        stop_marked(task_of, var)
    stop_listed(pids_file)
    for folder in remove:  # a killed driver's token would otherwise stay in /tmp
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.executors.keeper", description=__doc__.splitlines()[0])
    parser.add_argument("--watch", type=int, required=True, help="the pid of the Ray worker that runs the task")
    parser.add_argument("--watch-start", default=None, help="its kernel start time (clock ticks since boot)")
    parser.add_argument("--mark", required=True, help=f"the task's {TASK_VAR} value")
    parser.add_argument("--var", default=TASK_VAR, choices=[TASK_VAR, LOCAL_RAY_VAR], help="the variable marked")
    parser.add_argument("--pids-file", default=None, help="a file of 'pid start' lines to stop as well")
    parser.add_argument("--remove", action="append", default=[], help="a folder to remove afterwards (repeatable)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the task ended normally and stopped its server
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of whoever started the worker is not for the keeper
    keep(args.watch, args.watch_start, args.mark, var=args.var, pids_file=args.pids_file, remove=args.remove)
    return 0


if __name__ == "__main__":
    sys.exit(main())
