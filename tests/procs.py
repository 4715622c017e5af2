"""Helpers the tests share for processes: waiting for one to end (or for anything), a plan whose level takes seconds (to signal inside
it), and `pivot` run inside the test's own process where a process of its own proves nothing more."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from agent.servers import pid_alive

ROOT = Path(__file__).resolve().parent.parent


# Deadlines of the waits below are only there to stop a hang: a wait ends as soon as its event happens, so a long
# deadline costs nothing when all is well and keeps a busy host (two CPU-bound processes beside the suite) from
# failing a test. SLACK multiplies every deadline given here.
SLACK = float(os.environ.get("PIVOT_TEST_SLACK", "6"))


def gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether `pid` has exited (a zombie counts as exited) within `within_s` (times SLACK)."""
    deadline = time.monotonic() + within_s * SLACK
    while time.monotonic() < deadline:
        if not pid_alive(pid, None):
            return True
        time.sleep(0.05)
    return False


def until(predicate: Callable[[], object], within_s: float, every_s: float = 0.1) -> bool:
    """Whether `predicate()` held within `within_s` times SLACK (polled every `every_s`, and once more at the
    deadline)."""
    deadline = time.monotonic() + within_s * SLACK
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return bool(predicate())


def one_big_level_plan(folder: Path) -> Path:
    """The GLM-5 plan cut to one code item (nothing for the search to foresee) with one level of 150000 requests
    at concurrency 2048: the twin takes seconds to foresee the baseline's level (when it is launched) and seconds
    again to measure it ("benchmarking levels"), so a signal sent a moment after either line lands inside it."""
    text = (ROOT / "plans" / "glm5-nvfp4-rtxpro6000x8.toml").read_text()
    head, items = text.split("[[items]]", 1)
    head = head.replace("concurrency = [1, 256, 512, 1024, 2048]", "concurrency = [2048]")
    head = head.replace("prompts_per_concurrency = 1.0\n", "num_prompts = 150000\n")
    code_item = next(item for item in items.split("[[items]]") if 'kind = "code"' in item)
    assert "num_prompts = 150000" in head and "[2048]" in head
    plan = folder / "big.toml"
    plan.write_text(f"{head}[[items]]{code_item}")
    return plan


def pivot_here(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`pivot ARGS` run inside this process (click's CliRunner, with `env` set for the call): the exit code, stdout
    and stderr a subprocess would give, without an interpreter that imports pivot again (a `pivot run` process
    spends about 1.5 s of CPU on its imports). For commands that need no process of their own: nothing here
    signals or kills them, and they leave this process's SIGINT/SIGTERM handlers as they found them."""
    from click.testing import CliRunner

    from agent.cli import cli
    from tools.engines import process

    saved = process.handle_signals, process._pinned
    process.handle_signals = False  # pytest owns this process's signals
    try:
        result = CliRunner().invoke(cli, list(args), env=dict(env or {}), catch_exceptions=False)
    finally:
        process.handle_signals, process._pinned = saved
    return subprocess.CompletedProcess(["pivot", *args], result.exit_code, result.stdout, result.stderr)
