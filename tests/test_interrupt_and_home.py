"""Ctrl-C says how to go on (the resume command, never click's bare "Aborted!"), and `--home` works after the
subcommand as well as before it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import cli
from agent.session import Paths
from agent.store import Store
from tests.procs import one_big_level_plan

ROOT = Path(__file__).resolve().parent.parent
PIVOT = [sys.executable, "-m", "agent.cli"]


@pytest.mark.slow
def test_ctrl_c_during_a_run_prints_the_resume_command(tmp_path, pivot_home):
    plan = one_big_level_plan(tmp_path)  # Ctrl-C inside the twin's seconds-long prediction of the baseline
    proc = subprocess.Popen([*PIVOT, "run", str(plan)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)  # fmt: skip
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "launch_server(baseline=True)" in line:
                break
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (summary,) = Store(Paths.from_env().db_path).session_summaries()
    tail = [line for line in rest.splitlines() if line.strip()][-2:]
    assert proc.returncode == 130, rest
    assert "Aborted!" not in rest and "Traceback" not in rest
    assert tail[0].startswith(f"error: interrupted: session {summary.id} stopped"), tail
    assert tail[1] == f"hint: pivot resume {summary.id} goes on where it stopped", tail


def test_home_works_after_the_subcommand(tmp_path, monkeypatch):
    monkeypatch.delenv("PIVOT_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "elsewhere"
    store = Store(Paths.from_env(home).db_path)
    from agent import models as m
    from agent.plans import load_plan

    store.create_session(m.Session(id="home01", name="far", plan=load_plan("llama70b-fp8-h200x1"), engine="sim"))
    for argv in (["--home", str(home), "sessions"], ["sessions", "--home", str(home)],
                 ["show", "home01", "--home", str(home)], ["plan", "check", "llama70b-fp8-h200x1", "--home", str(home)]):  # fmt: skip
        result = CliRunner().invoke(cli, argv, catch_exceptions=False)
        assert result.exit_code == 0, (argv, result.output)
        if argv[0] in ("sessions", "--home"):
            assert "home01" in result.stdout, argv
    assert not (tmp_path / "state").exists()  # nothing went to the current directory
    assert os.environ.get("PIVOT_HOME") is None
