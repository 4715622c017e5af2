"""The README's quick start and CI agree, and a built wheel carries the plans."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_test_one():
    run_cmd, test_cmd = _quick_start()
    assert "\n" not in run_cmd and "\n" not in test_cmd
    assert "pivot" in run_cmd and "'.[dev]'" in test_cmd
    ci = (ROOT / ".ci" / "run").read_text()
    for step in test_cmd.split(" && "):
        assert step.replace("pip install", "pip install --quiet --disable-pip-version-check") in ci or step in ci, step


def test_the_quick_start_pivot_commands_succeed():
    run_cmd, _ = _quick_start()
    for step in run_cmd.split(" && "):
        argv = shlex.split(step)
        if not argv[0].endswith("bin/pivot"):
            continue
        proc = subprocess.run(
            [sys.executable, "-m", "agent.cli", *argv[1:]], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, (step, proc.stderr)
        assert "warning" not in proc.stderr.lower(), proc.stderr


@pytest.mark.slow
def test_wheel_ships_the_plans_and_the_entry_points(tmp_path):
    cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
           "-w", str(tmp_path), str(ROOT)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("pivot_serving-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "agent/bundled_plans/glm5-nvfp4-rtxpro6000x8.toml" in names
    assert {"tools/profiles/hardware/rtx-pro-6000-blackwell.toml", "tools/profiles/hardware/h200.toml",
            "tools/profiles/models/glm-5-nvfp4.toml", "tools/profiles/models/llama-3.3-70b-fp8.toml",
            "tools/engines/catalog/sglang-0.5.23.json"} <= names  # fmt: skip
    assert {
        "agent/store/__init__.py",
        "agent/store/migrations.py",
        "agent/cli/__init__.py",
        "agent/loop.py",
        "agent/autopilot.py",
        "tools/todo.py",
    } <= names
    assert not any(n.startswith(("tests/", "state/", "docs_out/", "benchmarks/")) for n in names)
    tools = entry_points.split("[pivot.tools]\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert {f"{name} = tools.{name}:toolset" for name in ("todo", "server", "bench", "docs", "pivot")} <= set(tools)
    engines = entry_points.split("[pivot.engines]\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert {
        "sim = tools.engines.sim.engine:SimEngine",
        "sglang = tools.engines.sglang:SGLangEngine",
        "sim-http = tools.engines.sim.http_engine:SimHttpEngine",
        "command = tools.engines.command:CommandEngine",
    } <= set(engines)
    assert "[console_scripts]\npivot = agent.cli:main" in entry_points


def test_every_package_directory_is_listed_in_pyproject():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("agent", "tools")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert "agent.bundled_plans" in listed
