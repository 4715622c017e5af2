"""The plan checks run before any launch and in every summary; `pivot plan check` runs everything knowable
before a launch."""

from __future__ import annotations

import pytest

from agent import loop
from agent import models as m
from agent.plans import load_plan
from agent.session import Session
from tools import reports


def test_the_first_document_written_carries_the_plan_check_before_any_launch(store, paths):
    from tools.docs import write_improvement_doc

    plan = load_plan("glm5-nvfp4-rtxpro6000x8")
    with Session.create(store, paths, plan, engine_name="sim") as s:

        class Ctx:
            deps = s

        ref = write_improvement_doc(Ctx(), "05")  # type: ignore[arg-type]
        assert store.experiments(s.id) == []
    text = (paths.home / ref.path).read_text()
    assert "## Plan check" in text and "error: Item 05 lowers --mem-fraction-static from 0.83" in text


@pytest.fixture
def first_pivot(store, paths):
    plan = load_plan("glm5-nvfp4-rtxpro6000x8")
    t = plan.target
    options = {"model_profile": t.model_profile, "hardware": t.hardware, "gpus": t.gpus, "noise": 0.015}
    with Session.create(store, paths, plan, engine_name="sim", settings=m.SessionSettings(engine_options=options)) as s:
        outcome = loop.run(s)
        sid = s.id
    assert outcome.status == "pivot"
    return sid


def test_a_direction_error_is_in_the_document_before_any_launch_and_in_the_first_summary(store, paths, first_pivot):
    sid = first_pivot
    docs = store.documents(sid)
    ledger = reports.Ledger.read(store, sid)
    warnings = reports.plan_warnings(ledger)
    assert warnings["05"][0].startswith("error: Item 05 lowers --mem-fraction-static")
    status = next(d for d in docs if d.kind == "status" and d.path.endswith(".md"))
    summary = (paths.home / status.path).read_text()
    step = next(line for line in summary.splitlines() if "**05 " in line and line[:1].isdigit())
    assert "Plan check error: Item 05 lowers --mem-fraction-static" in step


EDITABLE = """
name = "edited-by-hand"
title = "A plan fixed after its baseline failed"

[target]
model = "org/dense-70b"
model_profile = "llama-3.3-70b-fp8"
hardware = "h200"
gpus = 1
flags = "--tp-size 1 --mem-fraction-static 0.3"

[workload]
random_input_len = 128
random_output_len = 64
concurrency = [1, 16]

[[items]]
id = "01"
tier = 1
kind = "flag"
title = "FP8 KV cache"
flags = "--kv-cache-dtype fp8_e4m3"
hypothesis = "Half the KV bytes."
expected_impact = "+5% output tok/s"
"""


def _cli(home, *args):
    from tests.procs import pivot_here

    return pivot_here(*args, env={"PIVOT_HOME": str(home)})


def test_a_failed_baseline_is_fixed_by_editing_the_plan(tmp_path):
    import json

    from agent.session import Paths
    from agent.store import Store

    home = tmp_path / "home"
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(EDITABLE)
    first = _cli(home, "run", str(plan_file), "--json", "-q")
    outcome = json.loads(first.stdout)
    assert outcome["status"] == "pivot" and "baseline did not start (oom" in outcome["question"], first.stderr
    sid = outcome["session"]

    # another target is refused, and nothing changes
    other = tmp_path / "other.toml"
    other.write_text(EDITABLE.replace('hardware = "h200"', 'hardware = "rtx-pro-6000-blackwell"'))
    refused = _cli(home, "resume", sid, "--plan", str(other), "--answer", "continue")
    assert refused.returncode == 1 and "another target" in refused.stderr and "Traceback" not in refused.stderr

    # the plan file edited by hand: `continue` takes it, records the change and measures the new baseline
    plan_file.write_text(EDITABLE.replace(" --mem-fraction-static 0.3", ""))
    again = _cli(home, "resume", sid, "--answer", "continue", "--json", "-q")
    assert json.loads(again.stdout)["status"] in ("pivot", "finished"), again.stderr
    assert "goes on with the edited plan" in again.stderr
    with Store(Paths.from_env(home).db_path) as store:
        (change,) = store.plan_changes(sid)
        assert change.changes == ["base flags: --tp-size 1 --mem-fraction-static 0.3 -> --tp-size 1"]
        assert str(store.get_session(sid).plan.target.flags) == "--tp-size 1"
        bases = [e for e in store.experiments(sid) if e.kind == "baseline"]
        assert "--mem-fraction-static" in bases[0].config and bases[0].verdict == "crashed"
        assert "--mem-fraction-static" not in bases[-1].config and store.bench_results(bases[-1].id or 0)
    shown = json.loads(_cli(home, "show", sid, "--json").stdout)
    assert shown["plan_changes"][0]["changes"] == change.changes

    # --plan with an edited item: recorded, and the method uses it
    plan_file.write_text(
        EDITABLE.replace(" --mem-fraction-static 0.3", "").replace('"+5% output tok/s"', '"+5-10% output tok/s"')
    )
    third = _cli(home, "resume", sid, "--plan", str(plan_file), "--json", "-q")
    assert third.returncode == 0, third.stderr
    with Store(Paths.from_env(home).db_path) as store:
        assert [c.changes for c in store.plan_changes(sid)][-1] == ["item 01 changed (expected_impact)"]


def test_a_plan_argument_too_long_for_the_file_system_is_one_line_not_echoed_whole():
    from agent.plans import PlanError, load_plan

    for ref in ("a" * 5000, "x/" * 3000 + "p.toml", "nul\x00byte.toml"):
        with pytest.raises(PlanError) as info:
            load_plan(ref)
        assert len(info.value.message) < 300, len(info.value.message)


def test_plan_check_says_which_calibration_scalars_were_fitted_on_the_gpu_and_which_borrowed():
    """[silicon]: plan check says where each of the twin's scalars comes from: the H200's host overhead is the
    engine's (it was the RTX PRO 6000 fit's), its GEMMs fitted on the H200 (info); the H100's GEMM model is borrowed
    from the H200's fit (a warning)."""
    from agent.plans import load_plan
    from tools.preflight import preflight

    plan = load_plan("llama70b-fp8-h200x1")
    problems = preflight(plan)
    [note] = [p for p in problems if "the twin's calibration of h200" in p.message]
    assert note.severity == "info"
    assert "the engine's, not this GPU's: host_ms_per_step, host_us_per_request" in note.message
    assert "fitted on this GPU: gemm_m_half" in note.message and "rtx-pro-6000" not in note.message
    h100 = plan.model_copy(update={"target": plan.target.model_copy(update={"hardware": "h100-sxm"})})
    [note] = [p for p in preflight(h100) if "the twin's calibration of h100-sxm" in p.message]
    assert note.severity == "warning" and "borrowed from h200: gemm_m_half" in note.message
    rtx = [p for p in preflight(load_plan("glm5-nvfp4-rtxpro6000x8")) if "calibration of" in p.message]
    assert rtx and rtx[0].severity == "info" and "borrowed" not in rtx[0].message
