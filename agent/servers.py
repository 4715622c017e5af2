"""Server processes pivot started, as the core knows them: identity by pid plus start time, stopping a process group,
and stopping what a killed pivot left running when its session is next opened.

This is a core module (it imports nothing from tools/): `Session.open` calls `reap_leftovers`, and the engines'
process machinery (tools/engines/process.py) stops its process groups with `stop_group`. A server pivot launches
is the leader of its own process group and session (`start_new_session=True`), so its pgid is its pid and its
children share the group; the ledger records pid, pgid and the kernel's start time of the pid, so a pid that was
reused by an unrelated process is never signalled.

A pivot killed between spawning a server and recording it leaves a process the ledger does not know. So every
server launched for a session carries a mark in its environment (`PIVOT_SERVER_OF=<session>@<ledger>`, inherited
by its children), and `reap_leftovers` also stops the process groups that carry the session's mark but that no
live process of this pivot owns.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from agent.store import Store, _pid_alive, _proc_start

LEFTOVER_GRACE_S = 10.0  # SIGTERM to SIGKILL for a leftover: nobody is waiting for its results any more
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the group to be gone
POLL_S = 0.05
MARK_VAR = "PIVOT_SERVER_OF"  # in a launched server's environment: which home's session launched it
FAULT_VAR = "PIVOT_FAULT_KILL_AT"  # the fault tests: SIGKILL this pivot at the named point (see fault_point)


def fault_point(name: str) -> None:
    """SIGKILL this process here when $PIVOT_FAULT_KILL_AT names this point: the fault suite's deterministic kill."""
    if os.environ.get(FAULT_VAR) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def server_mark(db_path: Path | str, session_id: str) -> str:
    """The mark a server launched for `session_id` of the ledger at `db_path` carries in its environment."""
    ledger = hashlib.sha256(str(Path(db_path).resolve()).encode()).hexdigest()[:16]
    return f"{session_id}@{ledger}"


def marked_processes(mark: str, var: str = MARK_VAR) -> list[int]:
    """Running processes (not zombies) whose environment carries `var=mark` (only this user's are readable); `var`
    is the server mark (PIVOT_SERVER_OF) unless another is named (a Ray task's PIVOT_TASK_OF)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    needle = f"{var}={mark}".encode()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            fields = _stat(entry.name)
            if fields and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def proc_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), recorded with it; None without /proc."""
    return _proc_start(pid)


def pid_alive(pid: int, start: str | None) -> bool:
    """Whether `pid` runs (not a zombie) and, when `start` is given, is still the process that started then."""
    return _pid_alive(pid, start)


def _stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, session, ..., starttime at 19]."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def group_members(pgid: int, *, started_since: str | None = None) -> list[int]:
    """Running (not zombie) processes of process group `pgid`; with `started_since`, only those started then or later.

    Without /proc (macOS) it can only say whether the group has any process at all: [pgid] or [].
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    since = int(started_since) if started_since is not None and started_since.isdigit() else None
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(entry.name)
        if not fields or len(fields) < 20 or fields[0] in ("Z", "X") or int(fields[2]) != pgid:
            continue
        if since is not None and int(fields[19]) < since:
            continue
        members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(
    pgid: int,
    grace_s: float,
    *,
    started_since: str | None = None,
    reap: Callable[[], object] | None = None,
) -> bool:
    """SIGTERM process group `pgid`, wait up to `grace_s` for all of it to exit, then SIGKILL what is left.

    Returns True when SIGKILL was needed. `reap` is called while waiting (a parent reaps its child there, so
    the leader does not linger as a zombie); `started_since` limits the wait to processes started then or later.
    """
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + max(grace_s, 0.0)
    while True:
        if reap is not None:
            reap()
        if not group_members(pgid, started_since=started_since):
            return False
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        if not group_members(pgid, started_since=started_since):
            break
        time.sleep(POLL_S)
    return True


def reap_leftovers(store: Store, session_id: str, *, grace_s: float = LEFTOVER_GRACE_S) -> list[str]:
    """Stop the servers a gone pivot process left running for this session; returns one notice per server.

    Call it with the session lock held: the lock guarantees no live pivot owns these servers. A server recorded
    as starting or ready whose pid still runs with the recorded start time (or whose process group still has
    processes started since) is stopped (SIGTERM, then SIGKILL after `grace_s`) and recorded as stopped; one
    that is already gone is recorded as stopped. A pid without a recorded start time is never signalled, and
    servers started by this very process (its own children) are left alone.
    """
    notices = []
    me = os.getpid()
    for server in store.servers(session_id, running_only=True):
        if server.id is None:
            continue
        leader = _stat(server.pid)
        if leader is not None and leader[0] not in ("Z", "X") and int(leader[1]) == me:
            continue  # launched by this process and still running: not a leftover
        what = f"server {server.id} ({server.engine}, pid {server.pid}, {server.base_url})"
        if server.proc_start is None:
            if pid_alive(server.pid, None):
                notices.append(
                    f"{what} was recorded as {server.status} without a start time, so pid {server.pid} cannot be "
                    f"told apart from a reused one; it was left alone (stop it yourself if it is still the server)"
                )
            store.update_server(server.id, status="stopped")
            continue
        leader_ours = pid_alive(server.pid, server.proc_start) and leader is not None and int(leader[2]) == server.pgid
        # Linux never hands out a pid still used as a process group id: if another process has the pid now, the
        # server's group is gone; only when nobody has it can the group outlive its leader (orphaned children).
        members = [] if pid_alive(server.pid, None) else group_members(server.pgid, started_since=server.proc_start)
        if leader_ours or members:
            killed = stop_group(server.pgid, grace_s, started_since=server.proc_start)
            how = f"SIGKILL after {grace_s:g} s" if killed else "SIGTERM"
            notices.append(f"{what} was left running by a pivot process that is gone; stopped it ({how})")
        else:
            notices.append(f"{what} was recorded as {server.status} but is no longer running; recorded as stopped")
        store.update_server(server.id, status="stopped")
    notices += _reap_unrecorded(store, session_id, grace_s)
    return notices


def _reap_unrecorded(store: Store, session_id: str, grace_s: float) -> list[str]:
    """Stop the process groups that carry this session's mark and that no live process of this pivot started: a
    pivot killed between spawning a server and recording it left them (the lock says no live pivot owns them)."""
    me = os.getpid()
    groups: dict[int, list[int]] = {}
    for pid in marked_processes(server_mark(store.path, session_id)):
        fields = _stat(pid)
        if pid == me or fields is None:
            continue
        pgid = int(fields[2])
        leader = _stat(pgid)
        if leader is not None and leader[0] not in ("Z", "X") and int(leader[1]) == me:
            continue  # a server this process launched (or one of its children)
        groups.setdefault(pgid, []).append(pid)
    notices = []
    for pgid, pids in sorted(groups.items()):
        starts = [int(s) for s in (proc_start(p) for p in pids) if s is not None and s.isdigit()]
        since = str(min(starts)) if starts else None
        killed = stop_group(pgid, grace_s, started_since=since)
        how = f"SIGKILL after {grace_s:g} s" if killed else "SIGTERM"
        shown = ", ".join(str(p) for p in sorted(pids))
        notices.append(
            f"a server of session {session_id} (pid {shown}, process group {pgid}) was running but never recorded: "
            f"a pivot was killed while launching it; stopped it ({how})"
        )
    return notices
