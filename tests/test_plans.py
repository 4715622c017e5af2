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
        ("gpus = 1\n", "", "[target]", 1, "target.gpus"),  # target.hardware may be left out: pivot detects it
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
    # the seeds' plan has two errors pivot knows before any launch: a flag SGLang 0.5.23 removed (02) and a
    # memory fraction lowered to get more KV cache (05); the no-op flag of 01 is a warning
    assert proc.returncode == 1, proc.stderr
    assert "Piecewise CUDA graphs" in proc.stdout and "prior results: 4" in proc.stdout
    assert "2 errors, 1 warning" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "plan", "list", "--json"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    assert any(row["name"] == GLM5 and row["items"] == 11 for row in __import__("json").loads(proc.stdout))


BAD_PLAN = """
name = "hand-written"
title = "Written by hand"

[target]
model = "org/m"
model_profile = "no-such-model"
hardware = "b300"
gpus = 8
flags = "--tp-size 8 --no-such-flag"

[[items]]
id = "01"
tier = 1
kind = "flag"
title = "Graphs up to 512"
flags = "--cuda-graph-max-bs 512"
hypothesis = "Bigger graphs."
expected_impact = "+5%"

[[items]]
id = "02"
tier = 1
kind = "flag"
title = "Continuous decode steps"
flags = "--num-continuous-decode-steps 4"
hypothesis = "Fewer launches."
expected_impact = "+5%"
"""


def test_plan_check_runs_everything_knowable_before_a_launch(tmp_path):
    from tools.preflight import preflight

    problems = preflight(parse_plan(BAD_PLAN, source="bad.toml"))
    found = {(p.severity, p.where, p.check, p.flag) for p in problems}
    assert ("error", "target.model_profile", "profile", None) in found
    assert ("error", "target.hardware", "profile", None) in found
    assert ("error", "target.flags", "audit", "--no-such-flag") in found
    assert ("error", "item 01", "audit", "--cuda-graph-max-bs") in found  # ambiguous in 0.5.23
    assert ("warning", "item 02", "audit", "--num-continuous-decode-steps") in found  # a no-op
    assert not any(p.where == "target.flags" and p.flag == "--tp-size" for p in problems)
    missing = next(p for p in problems if p.where == "target.model_profile")
    assert "glm-5-nvfp4" in missing.message and "llama-3.3-70b-fp8" in missing.message  # the ones that exist
    hardware = next(p for p in problems if p.where == "target.hardware")
    assert "h200" in hardware.message and "rtx-pro-6000-blackwell" in hardware.message

    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_PLAN)
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "plan", "check", "--json", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    data = __import__("json").loads(proc.stdout)
    assert data["name"] == "hand-written" and sum(p["severity"] == "error" for p in data["problems"]) == 4


def test_plan_check_passes_a_clean_plan():
    from tools.preflight import preflight

    plan = parse_plan(SMALL_PLAN.replace('hardware = "h200"', 'hardware = "h200"\nmodel_profile = "llama-3.3-70b-fp8"'))
    assert [p for p in preflight(plan) if p.severity == "error"] == []


def test_the_readmes_model_profile_example_loads_and_adds_up(tmp_path):
    from tools.preflight import preflight
    from tools.profiles import load_model

    readme = (Path(__file__).resolve().parent.parent / "docs" / "plans.md").read_text()
    block = next(b for b in readme.split("```toml\n")[1:] if b.startswith('name = "qwen2.5-7b"')).split("```")[0]
    path = tmp_path / "qwen2.5-7b.toml"
    path.write_text(block)
    profile = load_model(str(path))
    assert profile.kind == "dense" and 7.5e9 < profile.total_params < 7.7e9
    gemms = sum(g.n * g.k for g in profile.dense_gemms) * profile.layers
    assert abs(gemms - sum(p.params for p in profile.parts if p.name in ("attention", "mlp"))) / gemms < 0.01
    plan = parse_plan(SMALL_PLAN.replace('hardware = "h200"', f'hardware = "h200"\nmodel_profile = "{path}"'))
    assert [p for p in preflight(plan) if p.severity == "error"] == []
