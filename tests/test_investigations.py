"""Sub-agent investigations: recorded in the ledger (question, tools, usage, report), cited in the status summaries,
deterministic under the autopilot, bounded in requests, callable by an LLM (a scripted one here)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pydantic_ai import UsageLimits

from agent import models as m
from agent.investigate import DETERMINISTIC, investigation_due, run_investigation
from agent.session import Session
from agent.store import MIGRATIONS, Store
from tests.twin_ledger import glm5_campaign
from tools.reports import SessionRef, headings, write_status_summary


@pytest.fixture
def crashed(store, paths):
    """The seeds' setting on the twin: the baseline and 07 (EP8), which crashes under load."""
    return glm5_campaign(store, paths, items=["07"])


def _investigate(store, paths, sid, question, **kw):
    with Session.open(store, paths, sid) as session:
        return asyncio.run(run_investigation(session, question, **kw))


def test_a_crash_investigation_reads_the_log_and_says_what_to_try(store, paths, crashed):
    with Session.open(store, paths, crashed) as session:
        due = investigation_due(session)
    assert due is not None and due[0] == "investigate" and due[1]["kind"] == "crash"
    eid = due[1]["experiment_id"]
    crash = next(e for e in store.experiments(crashed) if e.id == eid)
    assert crash.verdict == "crashed" and crash.plan_item == "07"
    inv = _investigate(store, paths, crashed, due[1]["question"], kind="crash", experiment_id=eid)
    assert inv.status == "done" and inv.model == DETERMINISTIC
    assert inv.tools_used == ["ledger_experiments", "server_log", "experiment_levels"]
    assert inv.requests == 4 and inv.input_tokens > 0  # three tool calls, then the report
    log_line = next(line for line in Path(crash.log_path).read_text().splitlines() if "CUDA error" in line)
    assert log_line.strip() in inv.report  # what the log says, verbatim
    assert "cuda-error" in inv.report and "What to try" in inv.report and "--max-running-requests" in inv.report
    [stored] = store.investigations(crashed)
    assert stored == inv
    with Session.open(store, paths, crashed) as session:
        assert investigation_due(session) is None  # crash done; the root cause waits for the analysis


def test_the_root_cause_investigation_cites_the_roofline_and_the_summary_lists_every_report(store, paths, crashed):
    from tools.analysis import analyze

    ref = SessionRef(store, paths, crashed)
    analyze(ref)  # the best configuration's analysis, as the autopilot runs before a summary
    with Session.open(store, paths, crashed) as session:
        kinds = []
        while (due := investigation_due(session)) is not None:
            kinds.append(due[1]["kind"])
            asyncio.run(run_investigation(session, due[1]["question"], kind=due[1]["kind"],
                                          experiment_id=due[1]["experiment_id"]))  # fmt: skip
    assert kinds == ["crash", "root_cause"]
    root = store.investigations(crashed)[-1]
    assert root.tools_used == ["ledger_experiments", "analysis", "gemm_evidence", "profile_traces"]
    assert "Roofline at concurrency" in root.report and "% of peak" in root.report
    assert "no GEMM micro-benchmark recorded" in root.report
    doc = write_status_summary(ref)
    text = (paths.home / doc.path).read_text()
    assert "Investigations" in [h for _, h in headings(text)]
    section = text.split("## Investigations", 1)[1].split("\n## ", 1)[0]
    for number, inv in enumerate(store.investigations(crashed), 1):
        assert f"**Investigation {number}**" in section and inv.question in section
        assert inv.report.splitlines()[0] in section
    assert "Read with ledger_experiments, server_log, experiment_levels; model investigator" in section


def test_an_investigation_is_bounded_and_its_limit_recorded(store, paths, crashed):
    eid = next(e.id for e in store.experiments(crashed) if e.verdict == "crashed")
    inv = _investigate(store, paths, crashed, "why?", kind="crash", experiment_id=eid,
                       limits=UsageLimits(request_limit=2))  # fmt: skip
    assert inv.status == "limit" and "request_limit" in inv.report
    assert inv.tools_used == ["ledger_experiments", "server_log"]
    assert store.investigations(crashed)[0].status == "limit"


def test_a_scripted_llm_calls_investigate_and_the_investigator_model_is_its_own(store, paths, crashed, tmp_path):
    from agent import loop

    eid = next(e.id for e in store.experiments(crashed) if e.verdict == "crashed")
    sub = tmp_path / "sub.jsonl"
    sub.write_text(json.dumps({"tool": "server_log", "args": {"experiment_id": eid}}) + "\n"
                   + json.dumps({"text": "The log names a CUDA error."}) + "\n")  # fmt: skip
    main = tmp_path / "main.jsonl"
    main.write_text(json.dumps({"tool": "investigate", "args": {"question": "What did the crash log say?",
                                                                "kind": "crash", "experiment_id": eid}})
                    + "\n" + json.dumps({"text": "done"}) + "\n")  # fmt: skip
    record = store.get_session(crashed)
    settings = record.settings.model_copy(update={"investigator_model": f"script:{sub}"})
    store.set_session_settings(crashed, settings)
    store.set_session_model(crashed, f"script:{main}")
    with Session.open(store, paths, crashed) as session:
        outcome = loop.run(session)
    assert outcome.status in ("waiting", "finished")
    [inv] = store.investigations(crashed)
    assert inv.model == f"script:{sub}" and inv.tools_used == ["server_log"]
    assert inv.report == "The log names a CUDA error." and inv.experiment_id == eid
    returned = [t for t in store.messages(crashed) if '"tool_name":"investigate"' in t and "tool-return" in t]
    assert returned and "The log names a CUDA error." in returned[0]


def test_a_ledger_from_before_investigations_gets_the_table(paths, small_plan):
    with Store(paths.db_path, migrations=[x for x in MIGRATIONS if x[0] != "013_investigations"]) as old:
        assert "investigations" not in old.db.table_names()
        old.create_session(m.Session(id="old013", name="before", plan=small_plan, engine="sim"))
    with Store(paths.db_path) as s:
        assert s.applied == ["013_investigations"]
        inv = s.add_investigation("old013", m.Investigation(question="q?", model="investigator", report="r"))
        assert s.investigations("old013") == [inv]


async def test_an_mcp_client_can_ask_for_an_investigation(store, paths, crashed):
    from fastmcp import Client

    from agent.mcp.server import build_server

    eid = next(e.id for e in store.experiments(crashed) if e.verdict == "crashed")
    async with Client(build_server(paths, store)) as client:
        got = await client.call_tool(
            "investigate", {"session": crashed, "question": "Why the crash?", "kind": "crash", "experiment_id": eid}
        )
    inv = got.structured_content
    assert inv["status"] == "done" and "cuda-error" in inv["report"] and inv["tools_used"][0] == "ledger_experiments"
    assert [i.question for i in store.investigations(crashed)] == ["Why the crash?"]
    assert store.session_lock(crashed) is None


def test_the_gemm_evidence_of_a_plan_without_a_hardware_profile_says_so(store, paths, crashed):
    """A plan may name no hardware profile (the tiny vLLM CPU plan): the investigator's tool says there is none to
    read against, it does not fail (it called load_hardware(None))."""
    from types import SimpleNamespace

    from tools.investigation import gemm_evidence

    with Session.open(store, paths, crashed) as session:
        target = session.target.model_copy(update={"hardware": None})
        got = gemm_evidence(SimpleNamespace(deps=SimpleNamespace(target=target, store=session.store)))
        assert got["hardware"] is None and got["microbench"] == [] and "names no hardware profile" in got["note"]
        full = gemm_evidence(SimpleNamespace(deps=session))
        assert full["hardware"] == session.target.hardware


def test_investigations_are_numbered_in_their_session_not_across_the_ledger(store, paths, crashed):
    other = glm5_campaign(store, paths, items=["07"])
    for sid in (crashed, other):
        eid = next(e.id for e in store.experiments(sid) if e.verdict == "crashed")
        _investigate(store, paths, sid, "why?", kind="crash", experiment_id=eid)
    assert store.investigations(other)[0].id == 2  # the ledger's second
    text = (paths.home / write_status_summary(SessionRef(store, paths, other)).path).read_text()
    assert "**Investigation 1** (crash" in text and "**Investigation 2**" not in text
