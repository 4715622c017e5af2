"""Shared fixtures: every test gets its own PIVOT_HOME, real model requests are refused, no process outlives a test run."""

from __future__ import annotations

import os
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers start with COLUMNS=80 and LINES=24 set (execnet's); rich would pin every console of
    # pivot to 80 columns at import, while a plain run (and a user's terminal) sizes them when they print.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

import signal

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # a suite started in the background by a non-interactive shell (`cmd &`) inherits SIGINT ignored, and so would
    # every process a test starts: the tests that press Ctrl-C on pivot would see it ignored. Run as in a terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)

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


# Tests that must not run beside each other on the workers (pytest-xdist): each local Ray instance takes the host's
# cores and fake GPUs, so the Ray tests run one after another on one worker.
SERIAL_GROUPS = {"test_ray_campaign": "ray", "test_ray_executor": "ray"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (--dist loadgroup), keep together on one worker the tests that share a module- or
    class-scoped fixture (an installed plugin, a campaign's ledger, a server), so it is built once, not once per
    worker; and the tests of a serial group (SERIAL_GROUPS), which are the longest run of the suite, first: a
    worker takes them at the start while the others share the rest, instead of the suite waiting on them at its end."""
    items.sort(key=lambda item: (item.module.__name__.rsplit(".", 1)[-1] if item.module else "") not in SERIAL_GROUPS)
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        group = SERIAL_GROUPS.get(module)
        if group is None:
            info = getattr(item, "_fixtureinfo", None)
            defs = info.name2fixturedefs.values() if info is not None else []
            if any(d.scope in ("module", "class", "package") for fixturedefs in defs for d in fixturedefs):
                group = module
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


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
