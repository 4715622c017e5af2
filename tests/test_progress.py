"""A campaign's progress on stderr (agent/cli/progress.py): a line per event, and while a step runs without news a
heartbeat line when piped (a spinner on a terminal), never a long silence; --quiet keeps warnings only."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from agent import models as m
from agent.cli import progress as p

WAIT_S = 60  # the deadline of the event waited for, only to stop a hang


def piped() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=200, highlight=False), buf


def wait_for(buf: io.StringIO, text: str) -> bool:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if text in buf.getvalue():
            return True
        done.wait(0.01)
    return False


def test_a_step_without_news_gets_heartbeat_lines_naming_it(monkeypatch):
    monkeypatch.setattr(p, "HEARTBEAT_S", 0.0)
    monkeypatch.setattr(p, "TICK_S", 0.01)
    console, buf = piped()
    progress = p.Progress(console=console)
    with progress.running():
        progress(m.Event(kind="tool_call", message="write_status_summary {}"))
        assert wait_for(buf, "still running: write_status_summary {}")
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith("-> write_status_summary {}")
    assert all(line.startswith("[") for line in lines)


def test_quiet_keeps_warnings_only_and_no_heartbeat(monkeypatch):
    monkeypatch.setattr(p, "HEARTBEAT_S", 0.0)
    monkeypatch.setattr(p, "TICK_S", 0.01)
    console, buf = piped()
    progress = p.Progress(quiet=True, console=console)
    with progress.running():
        progress(m.Event(kind="tool_call", message="launch_server {}"))
        progress(m.Event(kind="warning", message="the host is busy"))
        assert wait_for(buf, "the host is busy")
        threading.Event().wait(0.1)
    assert buf.getvalue().count("\n") == 1 and "launch_server" not in buf.getvalue()


def test_on_a_terminal_a_spinner_says_what_runs_and_is_gone_after(monkeypatch):
    monkeypatch.setattr(p, "TICK_S", 0.01)
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100)
    progress = p.Progress(console=console)
    with progress.running():
        progress(m.Event(kind="tool_call", message="run_benchmark {}"))
        assert progress._status is not None and "run_benchmark {}" in progress.still()
    assert progress._status is None
