"""One settings object (agent/settings.py): every default reads it, the environment overrides it, a bad value is one
line naming the variable, and the commands say so without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import PivotError, redact
from agent.settings import Settings, settings

ROOT = Path(__file__).resolve().parent.parent


def test_the_defaults_and_the_environment(monkeypatch, tmp_path):
    for name in ("PIVOT_MODEL", "PIVOT_ENGINE", "PIVOT_MODEL_RETRIES", "CI"):
        monkeypatch.delenv(name, raising=False)
    s = settings()
    assert (s.model, s.engine, s.serve_engine, s.model_retries, s.ci) == ("autopilot", "sim", "sim-http", 3, False)
    monkeypatch.setenv("PIVOT_MODEL_RETRIES", "7")
    monkeypatch.setenv("PIVOT_ENGINE", "sim-http")
    monkeypatch.setenv("CI", "true")
    s = settings(model="script:x.jsonl")  # a command's option over the environment
    assert (s.model_retries, s.engine, s.model, s.ci) == (7, "sim-http", "script:x.jsonl", True)
    assert s.home == Path(os.environ["PIVOT_HOME"])  # the suite's own home: the autouse fixture sets it


def test_every_field_says_what_it_is():
    assert all(f.description for f in Settings.model_fields.values())


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        ("PIVOT_MODEL_RETRIES", "abc", "PIVOT_MODEL_RETRIES='abc': Input should be a valid integer"),
        ("PIVOT_MODEL_RETRIES", "-1", "PIVOT_MODEL_RETRIES='-1': Input should be greater than or equal to 0"),
        ("PIVOT_MODEL_TIMEOUT_S", "0", "PIVOT_MODEL_TIMEOUT_S='0': Input should be greater than 0"),
        ("PIVOT_DEMO_NOISE", "lots", "PIVOT_DEMO_NOISE='lots': Input should be a valid number"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, name, value, line):
    monkeypatch.setenv(name, value)
    with pytest.raises(PivotError) as info:
        settings()
    assert info.value.message.startswith(line)
    assert f"Unset {name} for the default" in (info.value.hint or "")


def test_a_bad_option_is_named_as_the_option():
    with pytest.raises(PivotError, match=r"^--model=''"):
        settings(model="")


def test_the_command_line_says_one_line_for_a_bad_setting(tmp_path):
    env = {**os.environ, "PIVOT_HOME": str(tmp_path), "PIVOT_MODEL_RETRIES": "abc"}
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "demo"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0].startswith("error: PIVOT_MODEL_RETRIES='abc': Input should be a valid integer")
    assert "Traceback" not in proc.stderr


def test_the_model_key_stays_secret(monkeypatch):
    monkeypatch.setenv("PIVOT_MODEL_API_KEY", "abcd-1234-efgh-5678")
    s = settings()
    assert "abcd-1234" not in repr(s) and s.model_api_key is not None
    assert s.model_api_key.get_secret_value() == "abcd-1234-efgh-5678"
    assert redact("the server said: key abcd-1234-efgh-5678 is bad; Bearer abcdefgh12 sk-abcdefghijkl") == (
        "the server said: key [redacted] is bad; Bearer [redacted] sk-[redacted]"
    )


def test_no_module_reads_a_pivot_variable_but_the_settings():
    """PIVOT_* variables are read by agent/settings.py alone (the marks pivot puts on its own servers' environment
    and the fault suite's kill point are not settings: they travel to child processes)."""
    allowed = {"PIVOT_SERVER_OF", "PIVOT_TASK_OF", "PIVOT_LOCAL_RAY_OF", "PIVOT_FAULT_KILL_AT"}
    offenders = []
    for path in [*(ROOT / "agent").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]:
        text = path.read_text()
        for n, line in enumerate(text.splitlines(), 1):
            reads = ("os.environ" in line or "getenv(" in line) and "PIVOT_" in line
            if reads and not any(a in line for a in allowed):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders
