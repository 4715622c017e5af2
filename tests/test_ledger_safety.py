"""The ledger under bad conditions: a corrupt file, and a session locked by a live or a killed process."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent import models as m
from agent.errors import LedgerError, SessionLocked
from agent.session import Paths, Session
from agent.store import Store
from tests.procs import pivot_here

PIVOT = [sys.executable, "-m", "agent.cli"]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("header", [b"", b"SQLite format 3\x00"], ids=["random", "sqlite-header-then-garbage"])
def test_corrupt_ledger_gives_a_clear_error_and_is_untouched(paths, header):
    paths.state_dir.mkdir(parents=True)
    paths.db_path.write_bytes(header + os.urandom(64 * 1024))
    before = _digest(paths.db_path)
    proc = pivot_here("sessions")
    assert proc.returncode == 1
    assert "damaged or not a pivot database" in proc.stderr and "hint:" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert _digest(paths.db_path) == before
    assert sorted(p.name for p in paths.state_dir.iterdir()) == ["pivot.db"]  # no -wal or -shm beside it
    with pytest.raises(LedgerError):
        Store(paths.db_path)
    assert _digest(paths.db_path) == before


HOLDER = textwrap.dedent(
    """
    import sys, time
    from agent.store import Store
    store = Store(sys.argv[1])
    store.acquire_session(sys.argv[2])
    print("locked", flush=True)
    time.sleep(120)
    """
)


def _hold_lock(db_path: Path, session_id: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(db_path), session_id], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _wait_for_zombie(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rfind(")") + 2 :].split()[0] == "Z":
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} did not die")


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_lock_of_a_live_process_refuses_and_a_killed_ones_is_taken_over(paths, store, small_plan, reap):
    store.create_session(m.Session(id="lock01", name="locked", plan=small_plan, engine="sim"))
    holder = _hold_lock(paths.db_path, "lock01")
    try:
        with pytest.raises(SessionLocked, match=f"in use by pid {holder.pid}"):
            Session.open(store, paths, "lock01")
        assert store.session_lock("lock01") == holder.pid
        (summary,) = store.session_summaries()
        assert summary.locked_by_pid == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        if reap:
            holder.wait()
        else:  # SIGKILL is delivered asynchronously: wait until it is a zombie, without reaping it
            _wait_for_zombie(holder.pid)
    try:
        session = Session.open(store, paths, "lock01")
        assert session.notices == [
            f"session lock01 was locked by pid {holder.pid}, which is no longer running; lock taken over"
        ]
        assert store.session_lock("lock01") == os.getpid()
        session.close()
        assert store.session_lock("lock01") is None
    finally:
        holder.wait()


def test_same_process_can_reopen_its_session(paths, store, small_plan):
    with Session.create(store, paths, small_plan, engine_name="sim") as s:
        assert store.session_lock(s.id) == os.getpid()
        again = Session.open(store, paths, s.id)
        assert again.notices == []
    assert store.session_lock(s.id) is None


def test_cli_show_says_who_holds_the_lock(paths, store, small_plan):
    store.create_session(m.Session(id="lock02", name="shown", plan=small_plan, engine="sim"))
    holder = _hold_lock(paths.db_path, "lock02")
    try:
        proc = pivot_here("show", "lock02")
        assert proc.returncode == 0, proc.stderr
        assert f"in use by pid {holder.pid}" in proc.stdout
    finally:
        holder.kill()
        holder.wait()


def test_paths_default_to_pivot_home(pivot_home, tmp_path, monkeypatch):
    assert Paths.from_env().home == pivot_home.resolve()
    assert Paths.from_env(tmp_path / "x").db_path == (tmp_path / "x" / "state" / "pivot.db").resolve()
    monkeypatch.delenv("PIVOT_HOME")
    monkeypatch.chdir(tmp_path)
    assert Paths.from_env().home == tmp_path.resolve()


def test_unlock_clears_a_dead_or_foreign_lock_but_not_a_live_one(paths, store, small_plan):
    store.create_session(m.Session(id="lock03", name="x", plan=small_plan, engine="sim"))
    holder = _hold_lock(paths.db_path, "lock03")
    try:
        proc = pivot_here("unlock", "lock03")
        assert proc.returncode == 1 and f"in use by pid {holder.pid}, which is running" in proc.stderr
        store.db.conn.execute("update sessions set lock_host = 'gone-container' where id = 'lock03'")
        store.db.conn.commit()
        with pytest.raises(SessionLocked, match="on host gone-container") as info:
            Session.open(store, paths, "lock03")
        assert "pivot unlock lock03" in info.value.hint
        proc = pivot_here("unlock", "lock03")
        assert proc.returncode == 0 and f"lock of pid {holder.pid} cleared" in proc.stdout
        Session.open(store, paths, "lock03").close()
    finally:
        holder.kill()
        holder.wait()


WAL_WRITER = textwrap.dedent(
    """
    import os, sys
    from agent import models as m
    from agent.plans import load_plan
    from agent.store import Store
    store = Store(sys.argv[1])
    plan = load_plan("llama70b-fp8-h200x1")
    store.create_session(m.Session(id="wal000", name="x", plan=plan, engine="sim"))
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for i in range(40):
        store.create_session(m.Session(id=f"wal{i:03d}x", name="y" * 2000, plan=plan, engine="sim"))
    os._exit(0)  # killed before closing: what it wrote is in the -wal, never checkpointed
    """
)


def test_a_damaged_ledger_with_an_uncheckpointed_wal_is_left_untouched(paths):
    """Before: closing the connection that found the damage checkpointed the WAL into the file (it grew, the -wal
    went away) while pivot printed "left untouched"."""
    paths.state_dir.mkdir(parents=True)
    subprocess.run([sys.executable, "-c", WAL_WRITER, str(paths.db_path)], check=True, timeout=60)
    wal = paths.db_path.with_name("pivot.db-wal")
    assert wal.stat().st_size > 0
    data = bytearray(paths.db_path.read_bytes())
    data[8192:24576] = b"\x5a" * 16384  # damage middle pages of the main file
    paths.db_path.write_bytes(bytes(data))
    before = (_digest(paths.db_path), _digest(wal))
    for command in (["sessions"], ["resume", "wal000"], ["run", "llama70b-fp8-h200x1"]):
        proc = pivot_here(*command)
        assert proc.returncode == 1 and "damaged" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert (_digest(paths.db_path), _digest(wal)) == before, command


def test_a_ledger_missing_a_table_is_refused_before_anything_writes_to_it(paths, store, small_plan):
    store.create_session(m.Session(id="tbl001", name="x", plan=small_plan, engine="sim"))
    store.db.execute("drop table servers")
    store.db.conn.commit()
    store.close()
    before = _digest(paths.db_path)
    for command in (["resume", "tbl001"], ["servers", "tbl001"], ["run", "llama70b-fp8-h200x1"], ["sessions"]):
        proc = pivot_here(*command)
        assert proc.returncode == 1, (command, proc.stderr)
        assert "lacks the table servers" in proc.stderr and "no such table" not in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        assert _digest(paths.db_path) == before, command


def test_a_full_disk_is_one_line_and_loses_nothing_recorded(store, paths, small_plan):
    """G10: SQLite's "database or disk is full" (here: the ledger capped at its size with max_page_count) under a
    write, the lock's included, is one line that says so; what was recorded stays, and the transaction is undone."""
    from agent.session import Session

    with Session.create(store, paths, small_plan, engine_name="sim") as s:
        sid = s.id
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(LedgerError) as info:
        for _ in range(200):
            store.add_experiment(sid, m.Experiment(kind="change", config=small_plan.target.base_config(),
                                                   workload=small_plan.workload, title="x" * 4000))  # fmt: skip
    assert "the disk is full" in info.value.message and "nothing was changed" in info.value.message
    store.db.execute(f"PRAGMA max_page_count = {pages * 1000}")
    assert store.get_session(sid).id == sid  # still readable, still writable once there is room
    store.acquire_session(sid)
