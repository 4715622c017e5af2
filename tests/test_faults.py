"""The fault suite: the faults found when pivot was attacked (issue 18), each held closed by a test here.

Every test fails without its fix. Kills happen at named points ($PIVOT_FAULT_KILL_AT, agent/servers.fault_point),
never by timing luck.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

from agent import models as m
from agent.servers import FAULT_VAR
from agent.session import Session

PIVOT = [sys.executable, "-m", "agent.cli"]
ROOT = Path(__file__).resolve().parent.parent


def _tagged(tag: str) -> list[int]:
    """Running processes whose environment carries TEST_TAG=tag (the test's own way to find what it started)."""
    needle = f"TEST_TAG={tag}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X"):
            out.append(int(entry.name))
    return out


def _kill_tagged(tag: str) -> None:
    for pid in _tagged(tag):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def _wait_gone(tag: str, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _tagged(tag):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------------------------------------- 1


LAUNCHER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from agent.session import Paths
    from agent.store import Store
    from tools.engines.process import LedgerLink, ManagedServer
    paths = Paths.from_env()
    store = Store(paths.db_path)
    store.acquire_session(sys.argv[1])
    server = ManagedServer(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        log_path=paths.logs_dir(sys.argv[1]) / "x.log", base_url="http://127.0.0.1:9", engine="command",
        env={"TEST_TAG": sys.argv[2]}, ledger=LedgerLink(store, sys.argv[1], None, paths),
    )
    server.start()
    print("not killed", flush=True)
    server.stop(grace_s=1)
    """
)


def test_1_server_spawned_by_a_pivot_killed_before_recording_it_is_stopped_on_next_open(paths, store, small_plan):
    store.create_session(m.Session(id="kill01", name="k", plan=small_plan, engine="command"))
    tag = uuid.uuid4().hex
    try:
        proc = subprocess.run(
            [sys.executable, "-c", LAUNCHER, "kill01", tag],
            env={**os.environ, FAULT_VAR: "spawned"},
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert store.servers("kill01") == []  # the ledger never heard of it
        assert _tagged(tag), "the spawned server should still run: nothing stopped it"
        session = Session.open(store, paths, "kill01")
        session.close()
        assert any("never recorded" in n for n in session.notices), session.notices
        assert _wait_gone(tag), "the unrecorded server was left running"
    finally:
        _kill_tagged(tag)
