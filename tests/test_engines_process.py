"""The process machinery of HTTP engines with small stand-in servers: start, exit while starting, timeout, stop, the
ledger's record, leftovers of a killed pivot, and stopping on exit, on an exception and on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from agent import models as m
from agent.servers import group_members, proc_start, reap_leftovers
from agent.session import Session
from agent.store import Store
from tests.procs import gone
from tools.engines import process
from tools.engines.process import LedgerLink, ManagedServer, ServerStartError, free_port

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]


def _session(store: Store, paths, small_plan) -> Session:
    return Session.create(store, paths, small_plan, engine_name="command")


def _server(tmp_path: Path, code: str, *, ledger: LedgerLink | None = None, **kw) -> ManagedServer:
    port = free_port()
    return ManagedServer(
        [PY, "-c", textwrap.dedent(code)],
        log_path=tmp_path / "logs" / "server.log",
        base_url=f"http://127.0.0.1:{port}",
        engine="command",
        ledger=ledger,
        **kw,
    )


# A stand-in server: /health answers 503 for START_S, then 200; the ready line is logged when it turns 200.
HEALTHY = """
    import http.server, sys, threading, time
    START_S = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    t0 = time.monotonic()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if time.monotonic() - t0 >= START_S else 503)
            self.end_headers()
        def log_message(self, *a):
            pass
    s = http.server.HTTPServer(("127.0.0.1", PORT), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    print("loading weights", flush=True)
    time.sleep(START_S)
    print("The server is fired up and ready to roll!", flush=True)
    time.sleep(600)
"""


def _healthy(tmp_path: Path, *, start_s: float = 0.0, ledger: LedgerLink | None = None, **kw) -> ManagedServer:
    port = free_port()
    code = textwrap.dedent(HEALTHY).replace("PORT", str(port))
    return ManagedServer(
        [PY, "-c", code, str(start_s)],
        log_path=tmp_path / "logs" / "server.log",
        base_url=f"http://127.0.0.1:{port}",
        engine="command",
        ledger=ledger,
        stop_grace_s=5,
        **kw,
    )


def test_a_server_is_recorded_starting_ready_stopped_and_stopping_twice_is_fine(tmp_path, store, paths, small_plan):
    session = _session(store, paths, small_plan)
    server = _healthy(tmp_path, start_s=0.3, ledger=LedgerLink(store, session.id, paths=paths))
    # what this process had before (Ray's driver leaves a SIGTERM handler of its own in a worker that ran ray.init)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    server.start()
    try:
        (row,) = store.servers(session.id)
        assert row.status == "starting" and row.pid == server.pid == row.pgid
        assert row.proc_start == proc_start(server.pid) and row.argv[0] == PY
        assert os.getpgid(server.pid) == server.pid and os.getsid(server.pid) == server.pid  # its own group, session
        progress: list[str] = []
        server.wait_ready(30, on_progress=progress.append)
        assert server.ready and store.servers(session.id)[0].status == "ready"
        assert progress[-1].startswith("ready after")
        assert "The server is fired up and ready to roll!" in server.log_tail(5)[-1]
        assert process.live_servers() == [server]
        assert signal.getsignal(signal.SIGTERM) is process._on_signal  # handlers while a server runs
    finally:
        server.stop()
    assert gone(server.pid)
    (row,) = store.servers(session.id)
    assert row.status == "stopped" and row.failure is None and row.stopped_at is not None
    server.stop()  # twice: nothing happens
    assert process.live_servers() == []
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # the previous ones are back
    session.close()


def test_an_exit_while_starting_is_noticed_at_once_and_classified(tmp_path, store, paths, small_plan):
    session = _session(store, paths, small_plan)
    server = _server(
        tmp_path,
        """
        import sys, time
        print("loading", flush=True)
        time.sleep(0.3)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", flush=True)
        sys.exit(1)
        """,
        ledger=LedgerLink(store, session.id),
    )
    server.start()
    with pytest.raises(ServerStartError) as info:  # raised when it exits, classified: not at the readiness deadline
        server.wait_ready(600)
    e = info.value
    assert e.failure == "oom" and e.exit_code == 1
    assert "exited while starting (exit code 1): oom" in e.message
    assert "CUDA out of memory" in e.hint and str(server.log_path) in e.hint
    row = store.servers(session.id)[0]
    assert row.status == "crashed" and row.failure == "oom"
    server.stop()
    assert store.servers(session.id)[0].status == "crashed"  # stopping does not rewrite how it ended
    session.close()


def test_a_server_never_ready_times_out_and_is_killed(tmp_path, store, paths, small_plan):
    session = _session(store, paths, small_plan)
    server = _healthy(tmp_path, start_s=600, ledger=LedgerLink(store, session.id))
    server.start()
    with pytest.raises(ServerStartError) as info:
        server.wait_ready(0.8)
    assert info.value.failure == "startup-timeout" and "not ready after 0.8 s" in info.value.message
    assert gone(server.pid, 0.1)
    row = store.servers(session.id)[0]
    assert row.status == "stopped" and row.failure == "startup-timeout"
    session.close()


def test_health_without_the_ready_line_counts_after_a_grace(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "READY_LINE_GRACE_S", 0.3)
    server = _healthy(tmp_path, ready_line="a line nobody logs")
    server.start()
    try:
        server.wait_ready(20)
        assert server.ready
    finally:
        server.stop()


def test_stop_kills_the_whole_group_even_when_sigterm_is_ignored(tmp_path):
    server = _server(
        tmp_path,
        """
        import signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "600"])
        print("child", child.pid, flush=True)
        time.sleep(600)
        """,
    )
    server.start()
    deadline = time.monotonic() + 10
    while not any(line.startswith("child") for line in server.log_tail(5)) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(next(line for line in server.log_tail(5) if line.startswith("child")).split()[1])
    assert set(group_members(server.pgid)) == {server.pid, child}
    server.stop(grace_s=0.3)  # SIGKILL after the grace, not the child's 600 s sleep
    assert gone(server.pid, 0.1) and gone(child)
    assert server.exit_text() == "killed by SIGKILL"


def test_a_missing_command_is_a_clear_error(tmp_path):
    server = ManagedServer(["/no/such/server"], log_path=tmp_path / "x.log", base_url="http://127.0.0.1:1",
                           engine="command")  # fmt: skip
    with pytest.raises(process.PivotError, match="'/no/such/server' was not found") as info:
        server.start()
    assert getattr(info.value, "failure", None) == "engine-not-installed"  # recorded so, not `unknown`
    with pytest.raises(process.PivotError, match="non-empty list"):
        ManagedServer("python -m x", log_path=tmp_path / "x.log", base_url="http://x", engine="command")


# ---------------------------------------------------------------------------------------------- leftovers


def _orphan() -> int:
    """A `sleep` in its own session whose parent has exited: what a SIGKILLed pivot leaves behind."""
    code = (
        "import subprocess; print(subprocess.Popen(['sleep', '600'], start_new_session=True, "
        "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
    )
    return int(subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout)


def _record(store: Store, session_id: str, pid: int, start: str | None) -> m.ServerProcess:
    return store.add_server(
        m.ServerProcess(session_id=session_id, engine="sim-http", pid=pid, pgid=pid, proc_start=start,
                        host="127.0.0.1", base_url="http://127.0.0.1:1", argv=["sleep", "600"], status="ready")
    )  # fmt: skip


def test_session_open_stops_a_leftover_server_and_says_so(store, paths, small_plan):
    session = _session(store, paths, small_plan)
    session.close()
    pid = _orphan()
    try:
        _record(store, session.id, pid, proc_start(pid))
        again = Session.open(store, paths, session.id)
        assert gone(pid)
        assert any(f"pid {pid}" in n and "stopped it (SIGTERM)" in n for n in again.notices), again.notices
        assert store.servers(session.id)[0].status == "stopped"
        again.close()
    finally:
        if not gone(pid, 0):
            os.kill(pid, signal.SIGKILL)


def test_a_reused_pid_is_never_signalled(store, paths, small_plan):
    session = _session(store, paths, small_plan)
    pid = _orphan()
    try:
        _record(store, session.id, pid, "1")  # the pid now belongs to a process started at another time
        _record(store, session.id, pid, None)  # a row without a start time cannot be checked at all
        notices = reap_leftovers(store, session.id, grace_s=0.1)
        assert not gone(pid, 0.3)
        assert "no longer running" in notices[0] and "left alone" in notices[1]
        assert [s.status for s in store.servers(session.id)] == ["stopped", "stopped"]
    finally:
        os.kill(pid, signal.SIGKILL)
    session.close()


def test_a_server_of_this_very_process_is_not_a_leftover(tmp_path, store, paths, small_plan):
    session = _session(store, paths, small_plan)
    server = _healthy(tmp_path, ledger=LedgerLink(store, session.id))
    server.start()
    try:
        assert reap_leftovers(store, session.id) == []
        assert server.alive() and store.servers(session.id)[0].status == "starting"
    finally:
        server.stop()
    session.close()


def test_once_pivot_is_stopping_no_server_process_is_started(store, paths, small_plan, tmp_path, monkeypatch):
    """A tool or an executor's task still running in its thread after SIGINT/SIGTERM (the main thread has said
    "interrupted") starts no process, and says so as an interruption, not as a server that failed to start."""
    from agent.errors import Interrupted

    session = _session(store, paths, small_plan)
    monkeypatch.setattr(process, "_stopping", True)
    server = _healthy(tmp_path, ledger=LedgerLink(store, session.id, paths=paths))
    with pytest.raises(Interrupted, match="pivot is stopping"):
        server.start()
    assert not server.started and store.servers(session.id) == [] and process.live_servers() == []
    session.close()


# ---------------------------------------------------------------------------------------------- pivot's exit

# A pivot-like program: launches a stand-in server recorded in the ledger, prints its pid, then ends as told.
_PROGRAM = """
import json, os, signal, sys, time
from pathlib import Path
from agent.store import Store
from tools.engines.process import LedgerLink, ManagedServer, free_port
how, db, session_id = sys.argv[1], sys.argv[2], sys.argv[3]
store = Store(db)
port = free_port()
server = ManagedServer([sys.executable, "-c", "import time; time.sleep(600)"], log_path=Path(db).parent / "s.log",
                       base_url=f"http://127.0.0.1:{port}", engine="command", stop_grace_s=5,
                       ledger=LedgerLink(store, session_id))
server.start()
print(json.dumps({"pid": server.pid}), flush=True)
if how == "exception":
    raise RuntimeError("boom")
if how == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
if how == "sigint":
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        sys.exit(130)
"""


@pytest.mark.parametrize(("how", "code"), [("normal", 0), ("exception", 1), ("sigterm", 143), ("sigint", 130)])
def test_no_server_outlives_pivot(how, code, store, paths, small_plan):
    session = _session(store, paths, small_plan)
    proc = subprocess.run([PY, "-c", _PROGRAM, how, str(paths.db_path), session.id], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert proc.returncode == code, proc.stderr
    pid = json.loads(proc.stdout.splitlines()[0])["pid"]
    assert gone(pid)
    assert store.servers(session.id)[0].status == "stopped"
    session.close()


def test_a_server_writes_its_temporary_files_in_a_directory_of_its_own_removed_when_it_stops(tmp_path):
    """vLLM leaves `vllm_dist_*` stores in the temp directory; a server's TMPDIR is its own and goes when it stops."""
    port = free_port()
    code = textwrap.dedent(HEALTHY).replace("PORT", str(port))
    code = code.replace('print("loading weights"', 'import tempfile; print("tmp", tempfile.mkstemp(prefix="vllm_dist_")[1]); print("loading weights"')  # fmt: skip
    server = ManagedServer([PY, "-c", code, "0"], log_path=tmp_path / "s.log", base_url=f"http://127.0.0.1:{port}",
                           engine="command", stop_grace_s=5)  # fmt: skip
    server.start()
    try:
        server.wait_ready(30)
        line = next(x for x in server.log_tail(10) if x.startswith("tmp "))
        left = Path(line.split(" ", 1)[1].strip())
        assert left.exists() and left.name.startswith("vllm_dist_")
        assert left.parent != Path(tempfile.gettempdir()) and left.parent.name.startswith("pivot-command-")
    finally:
        server.stop()
    assert not left.exists() and not left.parent.exists()
