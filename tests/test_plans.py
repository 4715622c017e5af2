"""Plan files: the shipped plans load from anywhere, and a broken plan names the file, the line and the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import PlanError
from agent.plans import bundled_plans, key_lines, load_plan, parse_plan
from tests.conftest import SMALL_PLAN

GLM5 = "glm5-nvfp4-rtxpro6000x8"


def test_the_glm5_plan_has_three_tiers_of_eleven_items_and_prior_results():
    plan = load_plan(GLM5)
    assert plan.item_ids() == [f"{i:02d}" for i in range(1, 12)]
    assert [it.id for it in plan.tier_items(1)] == ["01", "02", "03", "04"]
    assert [it.id for it in plan.tier_items(3)] == ["09", "10", "11"]
    assert all(it.kind == "code" for it in plan.tier_items(3))
    assert plan.item("02").flags.argv() == ["--enable-piecewise-cuda-graph"]  # as the seeds had it
    assert plan.prior[0].title == "TP4+PP2"
    assert plan.target.base_config().argv()[:4] == ["--model-path", "lukealonso/GLM-5-NVFP4", "--tp-size", "8"]


def test_shipped_plans_are_found_from_any_directory(tmp_path):
    assert GLM5 in bundled_plans()
    code = f"from agent.plans import load_plan; print(load_plan({GLM5!r}).name)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == GLM5


def _error(text: str) -> str:
    with pytest.raises(PlanError) as info:
        parse_plan(text, source="plans/bad.toml")
    return info.value.message


def _line_of(text: str, needle: str, nth: int = 1) -> int:
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    return hits[nth - 1]


def test_toml_syntax_error_names_file_and_line():
    text = SMALL_PLAN.replace("gpus = 1", "gpus = = 1")
    msg = _error(text)
    assert msg.startswith("plans/bad.toml: not valid TOML") and f"line {_line_of(text, 'gpus = = 1')}" in msg


@pytest.mark.parametrize(
    ("old", "new", "needle", "nth", "field"),
    [
        ("gpus = 1", 'gpus = "eight"', "gpus =", 1, "target.gpus"),
        ('kind = "code"', 'kind = "magic"', 'kind = "magic"', 1, "items[1].kind"),
        ('change = "Write a kernel."', 'chnage = "Write a kernel."', "chnage", 1, "items[1].chnage"),
        ("concurrency = [1, 8]", "concurrency = [1, 0]", "concurrency", 1, "workload.concurrency"),
        ('flags = "--max-running-requests 64"\n', "", "[[items]]", 1, "items[0]"),
        ('id = "02"', 'id = "01"', "[[items]]", 1, "items"),
        ('id = "02"', 'id = "two"', 'id = "two"', 1, "items[1].id"),
        ('hardware = "h200"\n', "", "[target]", 1, "target.hardware"),
    ],
    ids=[
        "wrong-type",
        "bad-choice",
        "typo-key",
        "bad-level",
        "flag-item-without-flags",
        "duplicate-id",
        "bad-id",
        "missing-field",
    ],
)
def test_validation_error_names_file_line_and_field(old, new, needle, nth, field):
    assert old in SMALL_PLAN
    text = SMALL_PLAN.replace(old, new, 1)
    msg = _error(text)
    line = _line_of(text, needle, nth)
    assert msg.startswith(f"plans/bad.toml:{line}: {field}:"), msg


def test_key_lines_handles_multiline_strings_and_arrays():
    text = 'a = """\n[not.a.table]\nx = 1\n"""\nb = [\n  1,\n  2,\n]\n[t]\nc = "[" # ]\nd = 2\n[[u]]\ne = 1\n[[u]]\ne = 2\n'
    lines = key_lines(text)
    assert lines[("a",)] == 1 and ("not", "a", "table") not in lines and ("x",) not in lines
    assert lines[("b",)] == 5 and lines[("t",)] == 9 and lines[("t", "c")] == 10 and lines[("t", "d")] == 11
    assert lines[("u", 0, "e")] == 13 and lines[("u", 1, "e")] == 15


def test_missing_plan_file_lists_the_shipped_plans(tmp_path):
    with pytest.raises(PlanError, match="no plan file") as info:
        load_plan(tmp_path / "nope.toml")
    assert GLM5 in info.value.hint


def test_cli_plan_check_reports_file_line_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL_PLAN.replace("gpus = 1", "gpus = 0"))
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "plan", "check", str(bad)], capture_output=True, text=True, timeout=60
    )
    line = _line_of(bad.read_text(), "gpus = 0")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{bad}:{line}: target.gpus: Input should be greater than or equal to 1" in proc.stderr.replace("\n", "")


def test_cli_plan_check_and_list_on_shipped_plans():
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "plan", "check", GLM5],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path("/"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Piecewise CUDA graphs" in proc.stdout and "prior results: 4" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "plan", "list", "--json"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    assert any(row["name"] == GLM5 and row["items"] == 11 for row in __import__("json").loads(proc.stdout))
