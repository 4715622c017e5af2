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


def pytest_configure(config: pytest.Config) -> None:
    # [tool.pytest] is read only by pytest >= 9; if something downgraded pytest, say so instead of
    # running with the settings silently ignored.
    if config.getini("asyncio_mode") != "auto":
        raise pytest.UsageError(
            "pyproject's [tool.pytest] settings are not in force (asyncio_mode is not 'auto'): "
            "is pytest older than 9? Reinstall with `pip install -e '.[dev]'`."
        )


@pytest.fixture(autouse=True)
def pivot_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Path:
    """A fresh PIVOT_HOME for every test; outside the real-engine stage, a cache of its own and no vLLM of the
    shell's (a test judges flags against the shipped catalogs, not whatever $PIVOT_VLLM_PYTHON has)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PIVOT_HOME", str(home))
    if request.node.get_closest_marker("real_engine") is None:
        monkeypatch.setenv("PIVOT_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("PIVOT_VLLM_PYTHON", raising=False)
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
