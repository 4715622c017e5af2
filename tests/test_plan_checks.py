"""The plan checks run before any launch and in every summary; `pivot plan check` runs everything knowable
before a launch."""

from __future__ import annotations

import pytest

from agent import loop, reports
from agent import models as m
from agent.plans import load_plan
from agent.session import Session


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
