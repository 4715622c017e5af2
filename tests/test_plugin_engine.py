"""A plugin engine in its own package is a first-class citizen: tests/plugin_engine (llama.cpp's llama-server, with
`-m` for its model, its own catalog shipped as package data and its own argument types) is pip-installed into a
throwaway directory, as CONTRIBUTING.md says, and driven through `pivot audit-flags`, `pivot plan check` and
`pivot launch-bench`; its own test suite passes against the installed copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tests" / "plugin_engine"
FAKE = f"{sys.executable} {PACKAGE / 'tests' / 'fake_llama_server.py'}"

PLAN = """
name = "llama-h200"
title = "Llama 3.3 70B Q8 on one H200 with llama-server"

[target]
model = "/models/llama-3.3-70b-q8_0.gguf"
model_profile = "llama-3.3-70b-fp8"
hardware = "h200"
gpus = 1
engine = "llama-server"
flags = "-c 8192 -ngl all"

[workload]
random_input_len = 16
random_output_len = 8
concurrency = [1, 4]

[[items]]
id = "01"
tier = 1
kind = "flag"
title = "Four slots"
flags = "-np 4"
hypothesis = "Four requests decode at once."
expected_impact = "+100% throughput at 4"

[[items]]
id = "02"
tier = 1
kind = "flag"
title = "F32 KV cache, the old way"
flags = "--memory-f32"
hypothesis = "A flag llama.cpp removed."
expected_impact = "none"
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example package installed with pip into a directory of its own (from a copy: the source stays clean)."""
    root = tmp_path_factory.mktemp("plugin")
    source = root / "src"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = root / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
           "--target", str(target), str(source)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "pivot_llamacpp" / "llama-server-b4000.json").is_file()  # the catalog went in as package data
    return target


def _env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def _pivot(site: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True,
                          env=_env(site), cwd=cwd, timeout=240)  # fmt: skip


@pytest.mark.slow
def test_audit_flags_uses_the_plugins_own_catalog_and_types(site):
    proc = _pivot(site, "audit-flags", "--json", "--engine", "llama-server", "--",
                  "-m", "x.gguf", "-ngl", "all", "-c", "8192", "-fa", "maybe", "--memory-f32")  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # -fa maybe and --memory-f32 would stop llama-server
    rows = {r["flag"]: r for r in json.loads(proc.stdout)}
    assert rows["-ngl"]["status"] == "ok"  # its own -ngl type reads "all"
    assert rows["-fa"]["status"] == "invalid" and "invalid choice: 'maybe'" in rows["-fa"]["message"]
    assert rows["--memory-f32"]["status"] == "unknown" and "--cache-type-k f32" in rows["--memory-f32"]["message"]
    ok = _pivot(site, "audit-flags", "--engine", "llama-server", "--", "-m", "x.gguf", "-ngl", "12")
    assert ok.returncode == 0 and "shipped catalog of llama-server b4000" in ok.stderr


@pytest.mark.slow
def test_plan_check_audits_the_plan_with_the_plugins_audit_and_its_model_flag(site, tmp_path):
    plan = tmp_path / "llama.toml"
    plan.write_text(PLAN)
    proc = _pivot(site, "plan", "check", "--json", str(plan))
    assert proc.returncode == 1, proc.stderr  # item 02's flag is one llama-server removed
    problems = json.loads(proc.stdout)["problems"]
    audit = [p for p in problems if p["check"] == "audit"]
    assert [(p["where"], p["flag"]) for p in audit if p["severity"] == "error"] == [("item 02", "--memory-f32")]
    assert "--memory-f32: unknown in llama-server b4000" in audit[0]["message"]
    assert any("flags audited by shipped catalog of llama-server b4000" in p["message"] for p in audit)
    assert not any("--model-path" in p["message"] for p in problems)  # the model is -m: no flag the user never wrote


@pytest.mark.slow
def test_launch_bench_runs_it_and_a_bad_option_is_one_line(site, tmp_path):
    bad = _pivot(site, "launch-bench", "--engine", "llama-server", "-o", "port=abc", "--", "-m", "x.gguf")
    assert bad.returncode == 1
    assert bad.stderr.splitlines()[0] == (
        "error: engine 'llama-server': option port='abc': Input should be a valid integer, unable to parse string "
        "as an integer"
    )
    assert "Traceback" not in bad.stderr and "llama-server's options: command" in bad.stderr
    proc = _pivot(site, "launch-bench", "--engine", "llama-server", "-o", f"command={FAKE}", "--json",
                  "--concurrency", "1,4", "--num-prompts", "8", "--input-len", "16", "--output-len", "8",
                  "--", "-m", "qwen.gguf", "-np", "4", "--metrics")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    levels = json.loads(proc.stdout)
    assert [lv["max_concurrency"] for lv in levels] == [1, 4]
    assert all(lv["completed"] == 8 and lv["failed"] == 0 for lv in levels)
    assert "launched llama-server:" in proc.stderr and " -m qwen.gguf -np 4 --metrics --host 127.0.0.1 --port " in (
        proc.stderr
    )


@pytest.mark.slow
def test_the_plugins_own_tests_pass_against_the_installed_copy(site):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PACKAGE / "tests")],
                          capture_output=True, text=True, env=_env(site), cwd=PACKAGE, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.splitlines()[-1]
