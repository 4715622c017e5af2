"""Plugins come from entry points: a third-party distribution installed with pip shows up in `pivot tools`."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent import plugins
from agent.errors import PluginError

HELLO_MODULE = '''
"""A third-party pivot plugin, made by a test."""
from pydantic_ai import FunctionToolset, RunContext

toolset = FunctionToolset(id="hello")


@toolset.tool
def say_hello(ctx: RunContext, name: str) -> str:
    """Greet someone by name."""
    return f"hello {name}"


from tools.engines.base import BaseEngine


class HelloEngine(BaseEngine):
    """An engine that serves greetings."""

    name = "hello"

    def __init__(self, **options):
        self.options = options

    def validate(self, config):
        return []

    def launch(self, config, log_path, *, ledger=None, force=False):
        raise NotImplementedError
'''


def _write_dist(root: Path, name: str, module: str, code: str, entry_points: str) -> Path:
    src = root / name
    src.mkdir(parents=True)
    (src / f"{module}.py").write_text(code)
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=70.1"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{name}"
            version = "0.0.1"

            [tool.setuptools]
            py-modules = ["{module}"]
            """
        )
        + entry_points
    )
    return src


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """Two throwaway distributions, installed with pip into their own directory: one good, one broken."""
    root = tmp_path_factory.mktemp("dists")
    site = root / "site"
    good = _write_dist(
        root,
        "pivot-hello",
        "pivot_hello",
        HELLO_MODULE,
        '\n[project.entry-points."pivot.tools"]\nhello = "pivot_hello:toolset"\n'
        '\n[project.entry-points."pivot.engines"]\nhello = "pivot_hello:HelloEngine"\n',
    )
    broken = _write_dist(
        root,
        "pivot-broken",
        "pivot_broken",
        "raise ImportError('needs libfoo, which is not installed')\n",
        '\n[project.entry-points."pivot.tools"]\nbroken = "pivot_broken:toolset"\n',
    )
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--target",
        str(site),
        str(good),
        str(broken),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return site


def _pivot(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.slow
def test_pivot_tools_lists_an_installed_third_party_plugin(plugin_site):
    proc = _pivot(plugin_site, "tools", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    by_name = {row["plugin"]: row for row in data["tools"]}
    assert by_name["hello"]["distribution"] == "pivot-hello 0.0.1"
    assert by_name["hello"]["tools"] == [{"name": "say_hello", "description": "Greet someone by name."}]
    assert "todo" in by_name  # the built-in plugin, through the same entry points
    assert {
        "engine": "hello",
        "distribution": "pivot-hello 0.0.1",
        "entry_point": "pivot_hello:HelloEngine",
        "description": "An engine that serves greetings.",
        "options": [],  # it declares no Options: they are its own business
    } in data["engines"]
    sim_http = next(row for row in data["engines"] if row["engine"] == "sim-http")
    time_scale = next(o for o in sim_http["options"] if o["name"] == "time_scale")
    assert time_scale["default"] == "20.0" and time_scale["description"] == "Simulated seconds per wall second."
    # the broken plugin is named in a warning on stderr and the rest still loaded
    assert "plugin 'broken' (from pivot-broken 0.0.1)" in proc.stderr
    assert "ImportError: needs libfoo" in proc.stderr
    assert any("broken" in f for f in data["failed"])

    text = _pivot(plugin_site, "tools")
    assert text.returncode == 0
    assert "say_hello" in text.stdout and "hello" in text.stdout and "warning:" in text.stderr


@pytest.mark.slow
def test_load_one_names_the_plugin_and_cause(plugin_site):
    code = textwrap.dedent(
        """
        from agent import plugins
        from agent.errors import PluginError
        from agent.contracts import load_engine
        names = [p.name for p in plugins.available("pivot.tools")]
        import sys
        assert "pivot_broken" not in sys.modules and "pivot_hello" not in sys.modules, "listing must not import"
        print(sorted(names))
        try:
            plugins.load("pivot.tools", "broken")
        except PluginError as e:
            print("ERR", e.message)
        engine = load_engine("hello", color="blue")
        print("ENGINE", engine.name, engine.options)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(plugin_site)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    listed = ast.literal_eval(lines[0])
    assert {"broken", "hello", "todo", "server", "bench", "docs", "pivot"} <= set(listed)  # third-party beside built-in
    assert lines[1].startswith(
        "ERR plugin 'broken' (from pivot-broken 0.0.1) in pivot.tools failed to load: ImportError"
    )
    assert lines[2] == "ENGINE hello {'color': 'blue'}"


def test_unknown_plugin_and_group_are_clear_errors():
    with pytest.raises(PluginError, match=r"no plugin 'nope' in pivot\.engines"):
        plugins.load(plugins.ENGINES_GROUP, "nope")
    with pytest.raises(PluginError, match="unknown plugin group"):
        plugins.available("pivot.other")


def test_builtin_todo_toolset_is_registered():
    loaded = plugins.load_all(plugins.TOOLS_GROUP)
    assert "todo" in loaded.plugins
    names = [n for n, _ in plugins.describe_tools(loaded.plugins["todo"])]
    assert names == ["todo_read", "todo_write", "plan_read"]
