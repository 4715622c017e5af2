"""Shared fixtures: every test gets its own PIVOT_HOME, real model requests are refused, no process outlives a test run."""

from __future__ import annotations

import os
from pathlib import Path

import pydantic_ai.models
import pytest

from agent.models import Plan
from agent.plans import parse_plan
from agent.session import Paths
from agent.store import Store

pydantic_ai.models.ALLOW_MODEL_REQUESTS = False

# tests/plugin_engine is a package of its own with its own tests: they run against its installed copy
# (tests/test_plugin_engine.py), not in this suite's process, which has not installed it.
collect_ignore = ["plugin_engine"]

SMALL_PLAN = """
name = "small"
title = "A small plan for tests"

[target]
model = "org/model-7b"
hardware = "h200"
gpus = 1
flags = "--tp-size 1"

[workload]
random_input_len = 128
random_output_len = 64
concurrency = [1, 8]

[[items]]
id = "01"
tier = 1
kind = "flag"
title = "Bigger batch"
flags = "--max-running-requests 64"
hypothesis = "More rows per step."
expected_impact = "+10% at 8"

[[items]]
id = "02"
tier = 2
kind = "code"
title = "A kernel"
change = "Write a kernel."
hypothesis = "Faster."
expected_impact = "+5%"
"""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--snapshot-update",
        action="store_true",
        help="Rewrite the TUI's SVG snapshots (tests/snapshot.py; never in CI).",
    )


def pytest_configure(config: pytest.Config) -> None:
    # [tool.pytest] is read only by pytest >= 9; if something downgraded pytest, say so instead of
    # running with the settings silently ignored.
    if config.getini("asyncio_mode") != "auto":
        raise pytest.UsageError(
            "pyproject's [tool.pytest] settings are not in force (asyncio_mode is not 'auto'): "
            "is pytest older than 9? Reinstall with `pip install -e '.[dev]'`."
        )


@pytest.fixture(autouse=True)
def pivot_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh PIVOT_HOME for every test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PIVOT_HOME", str(home))
    return home


@pytest.fixture
def paths(pivot_home: Path) -> Paths:
    return Paths.from_env()


@pytest.fixture
def store(paths: Paths):
    s = Store(paths.db_path)
    yield s
    s.close()


@pytest.fixture
def small_plan() -> Plan:
    return parse_plan(SMALL_PLAN, source="small.toml")


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


@pytest.fixture(scope="session", autouse=True)
def no_orphan_processes():
    """Fail the run if any process started by a test is still running at the end."""
    yield
    if not Path("/proc").is_dir():
        return
    left = _children(os.getpid())
    assert not left, f"processes left running by the tests: {left}"
