"""A plan whose target has an error is refused before any session exists, wherever a session is started from it
(`pivot run`, `pivot demo`'s path, the TUI's new session, `pivot serve --plan`, `pivot import --plan`); an item's
error does not stop a campaign (the campaign handles it) but is said once."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import cli
from agent.errors import PlanError
from agent.plans import load_plan
from agent.store import Store
from tools.preflight import blocks_run, check_runnable, item_errors_note, preflight

ROOT = Path(__file__).resolve().parent.parent
LLAMA = (ROOT / "plans" / "llama70b-fp8-h200x1.toml").read_text()


def _plan(tmp_path: Path, old: str, new: str) -> Path:
    assert old in LLAMA
    path = tmp_path / "bad.toml"
    path.write_text(LLAMA.replace(old, new, 1))
    return path


BAD_TARGETS = {
    "hardware": ('hardware = "h200"', 'hardware = "h20"', "no hardware profile 'h20'"),
    "base-flag": ('flags = "', 'flags = "--no-such-flag ', "--no-such-flag"),
    "model-profile": ('model_profile = "llama-3.3-70b-fp8"', 'model_profile = "nope.toml"', "nope.toml"),
}


def _sessions(pivot_home: Path) -> list:
    db = pivot_home / "state" / "pivot.db"
    return Store(db).session_summaries() if db.exists() else []


@pytest.mark.parametrize("case", list(BAD_TARGETS))
def test_pivot_run_refuses_a_plan_whose_target_has_an_error_before_any_session(case, tmp_path, pivot_home):
    old, new, needle = BAD_TARGETS[case]
    path = _plan(tmp_path, old, new)
    result = CliRunner().invoke(cli, ["run", str(path)], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert "cannot run" in result.stderr and needle in result.stderr and "no session was recorded" in result.stderr
    assert "pivot plan check" in result.stderr
    assert _sessions(pivot_home) == []
    plan_check = CliRunner().invoke(cli, ["plan", "check", str(path)], catch_exceptions=False)
    assert plan_check.exit_code == 1 and "`pivot run` refuses this plan" in plan_check.stdout


@pytest.mark.parametrize("args", [["serve", "--engine", "sim-http", "--plan", "PLAN", "--", "--tp-size", "1"],
                                  ["import", "new-session", "FILE", "--label", "x", "--plan", "PLAN"]])  # fmt: skip
def test_every_command_that_creates_a_session_from_a_plan_refuses_it_too(args, tmp_path, pivot_home):
    path = _plan(tmp_path, 'hardware = "h200"', 'hardware = "h20"')
    results = tmp_path / "results.jsonl"
    results.write_text("{}\n")
    argv = [str(path) if a == "PLAN" else str(results) if a == "FILE" else a for a in args]
    result = CliRunner().invoke(cli, argv, catch_exceptions=False)
    assert result.exit_code == 1 and "cannot run" in result.stderr, result.output
    assert _sessions(pivot_home) == []


def test_the_tuis_new_session_refuses_it_before_a_session_exists(tmp_path, paths, store):
    from agent.tui.controller import ChatController

    path = _plan(tmp_path, 'hardware = "h200"', 'hardware = "h20"')
    controller = ChatController(paths, store)
    with pytest.raises(PlanError, match="cannot run"):
        controller.create(str(path))
    assert controller.session is None and store.session_summaries() == []


def test_an_engine_option_the_engine_refuses_is_refused_before_a_session(pivot_home):
    for args in (["--engine", "command"], ["--engine", "sim-http", "-o", "time_scale=nan"]):
        result = CliRunner().invoke(cli, ["run", "llama70b-fp8-h200x1", *args], catch_exceptions=False)
        assert result.exit_code == 1 and result.stderr.startswith("error: "), result.output
    assert _sessions(pivot_home) == []


def test_item_errors_do_not_stop_a_campaign_and_are_said_in_one_line():
    plan = load_plan("glm5-nvfp4-rtxpro6000x8")  # the seeds' plan: 02's removed flag, 05's direction
    problems = check_runnable(plan)
    assert [p.where for p in problems if p.severity == "error"] == ["item 02", "item 05"]
    assert not any(blocks_run(p) for p in preflight(plan))
    note = item_errors_note(plan, problems)
    assert note is not None and "02 (flags the engine refuses: ruled out before any launch)" in note
    assert "05 (a physics or direction error" in note and "pivot plan check glm5-nvfp4-rtxpro6000x8" in note
    assert item_errors_note(load_plan("llama70b-fp8-h200x1"), check_runnable(load_plan("llama70b-fp8-h200x1"))) is None


def test_plan_check_says_nothing_of_a_fraction_an_item_does_not_change(tmp_path):
    """Before: "--mem-fraction-static 0.80 -> 0.80 shrinks the KV pool from 144,759 to 144,759" for every item."""
    path = _plan(tmp_path, 'flags = "--tp-size 1"', 'flags = "--tp-size 1 --mem-fraction-static 0.80"')
    problems = preflight(load_plan(path))
    fraction = [p for p in problems if "--mem-fraction-static" in p.message]
    assert [p.where for p in fraction] == ["item 05"]  # the one item that sets it (0.80 -> 0.92)
    assert "0.80 -> 0.92 grows the KV pool" in fraction[0].message


@pytest.mark.parametrize("value", ["1.5", "0", "-0.2", "nan", "inf"])
def test_a_fraction_outside_0_1_is_an_error_in_an_item_and_stops_a_run_in_the_base_flags(value, tmp_path, pivot_home):
    item = _plan(tmp_path, "--mem-fraction-static 0.92", f"--mem-fraction-static {value}")
    (error,) = [p for p in preflight(load_plan(item)) if p.severity == "error"]
    assert error.where == "item 05" and "lies in (0, 1]" in error.message and not blocks_run(error)
    base = _plan(tmp_path, 'flags = "--tp-size 1"', f'flags = "--tp-size 1 --mem-fraction-static {value}"')
    result = CliRunner().invoke(cli, ["run", str(base)], catch_exceptions=False)
    assert result.exit_code == 1 and "lies in (0, 1]" in result.stderr and _sessions(pivot_home) == []


def test_ray_local_with_a_simulated_engine_offers_the_plans_gpus():
    """Before: 0 GPUs unless --ray-gpus was given, and the baseline was "unschedulable" on a host without GPUs."""
    from agent.defaults import session_settings

    target = load_plan("glm5-nvfp4-rtxpro6000x8").target  # 8 GPUs
    method = {"ray": "local", "parallel": 2, "ray_gpus": None}
    assert session_settings(target, "sim", {}, None, method).ray_gpus == 16
    assert session_settings(target, "sim-http", {}, None, {**method, "parallel": 1}).ray_gpus == 8
    assert session_settings(target, "sim", {}, None, {**method, "ray_gpus": 4}).ray_gpus == 4  # as given
    assert session_settings(target, "sglang", {}, None, method).ray_gpus is None  # real GPUs: Ray detects them
    assert session_settings(target, "sim", {}, None, {**method, "ray": "auto"}).ray_gpus is None  # a cluster's own
