"""Session locks: a session worked on by a live process is locked by that process's pid (and host, and the
kernel's start time of the pid, so a reused pid is never taken for the holder)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from agent import models as m
from agent.errors import SessionLocked, SessionNotFound
from agent.store.core import StoreCore
from agent.store.rows import _ts

_UNLOCK = "update sessions set lock_pid = null, lock_host = null, lock_proc_start = null, lock_at = null "


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of a process (clock ticks since boot), to tell a reused pid apart; None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _pid_alive(pid: int, proc_start: str | None) -> bool:
    """Whether the process that took a lock is still running (not exited, not a zombie, pid not reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): os.kill is all we can know
    if stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X"):
        return False
    return proc_start is None or _proc_start(pid) == proc_start


class LocksMixin(StoreCore):
    """Taking, releasing and breaking a session's lock."""

    def acquire_session(self, session_id: str) -> str | None:
        """Lock the session for this process. Returns a notice when a dead process's lock was taken over.

        Raises SessionLocked when another live process holds it. Re-acquiring in the same process is fine.
        """
        me, host = os.getpid(), socket.gethostname()
        with self._write() as db:
            rows = list(db["sessions"].rows_where("id = ?", [session_id]))
            if not rows:
                raise SessionNotFound(f"no session {session_id!r}")
            row = rows[0]
            notice = None
            pid = row["lock_pid"]
            if pid and not (pid == me and row["lock_host"] == host):
                if row["lock_host"] != host:
                    raise SessionLocked(
                        f"session {session_id} is in use by pid {pid} on host {row['lock_host']}",
                        hint="stop pivot there first; if it is gone (a container that was replaced), "
                        f"`pivot unlock {session_id}` clears the lock",
                    )
                if _pid_alive(pid, row["lock_proc_start"]):
                    raise SessionLocked(
                        f"session {session_id} is in use by pid {pid} (since {row['lock_at']})",
                        hint=f"wait for it to finish, or stop it (kill {pid}); then run the command again",
                    )
                notice = f"session {session_id} was locked by pid {pid}, which is no longer running; lock taken over"
            db.execute(
                "update sessions set lock_pid = ?, lock_host = ?, lock_proc_start = ?, lock_at = ? where id = ?",
                [me, host, _proc_start(me), _ts(m.utcnow()), session_id],
            )
        return notice

    def break_session_lock(self, session_id: str) -> int | None:
        """Clear a session's lock when its holder is gone (or held from another host); returns the old pid.

        A holder alive on this host is always refused: it is a live run, and clearing its lock would let a second
        process stop its server and run its experiments again. Stopping it is the fix; its own exit releases it.
        """
        with self._write() as db:
            rows = list(db["sessions"].rows_where("id = ?", [session_id]))
            if not rows:
                raise SessionNotFound(f"no session {session_id!r}")
            row = rows[0]
            pid = row["lock_pid"]
            if pid is None:
                return None
            here = row["lock_host"] == socket.gethostname()
            if here and _pid_alive(pid, row["lock_proc_start"]):
                raise SessionLocked(
                    f"session {session_id} is in use by pid {pid}, which is running on this host; its lock is not "
                    "cleared while it runs",
                    hint=f"stop that pivot first: Ctrl-C in its terminal, or `kill {pid}` (it stops its servers and "
                    "releases the lock); then run the command again",
                )
            db.execute(_UNLOCK + "where id = ?", [session_id])
            return pid

    def release_session(self, session_id: str) -> None:
        """Drop this process's lock on the session (a lock held by another process is left alone)."""
        with self._write() as db:
            db.execute(
                _UNLOCK + "where id = ? and lock_pid = ? and lock_host = ?",
                [session_id, os.getpid(), socket.gethostname()],
            )

    def session_lock(self, session_id: str) -> int | None:
        """The pid holding the session's lock, if that process is alive."""
        with self._read() as db:
            row = db["sessions"].get(session_id)
        pid = row["lock_pid"]
        return pid if pid and _pid_alive(pid, row["lock_proc_start"]) else None
