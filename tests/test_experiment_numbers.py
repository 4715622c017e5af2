"""Experiments are numbered per session where a user or a model reads them (documents, summaries, the CLI, the TUI,
tool calls and results), while the ledger's row ids, shared by every session of a home, stay internal: a second
session starts at experiment 1, and "rerun experiment 1" in it names its own first experiment."""

from __future__ import annotations

import json

from click.testing import CliRunner

from agent import loop
from agent.cli import cli
from agent.session import Session
from tests.test_method_guard import BASELINE, DOCS, Ledger, _new
from tools.numbering import Numbering


def _two_sessions(tmp_path) -> tuple[Ledger, Ledger]:
    """Two sessions of one home, each with its documents and its baseline measured twice (by a script that names
    experiment 1: in the second session that is its own first experiment, ledger id 2)."""
    first = _new(tmp_path)
    first.run(DOCS + BASELINE)
    second = _new(tmp_path)
    second.run(DOCS + BASELINE)
    return first, second


def test_a_second_session_numbers_its_experiments_from_1_and_the_model_speaks_numbers(tmp_path):
    first, second = _two_sessions(tmp_path)
    (a,) = first.store.experiments(first.sid)
    (b,) = second.store.experiments(second.sid)
    assert (a.id, a.number) == (1, 1) and (b.id, b.number) == (2, 1)
    # the script's `launch_server experiment_id=1` reran the second session's own baseline, not the first's
    assert len(second.store.bench_results(b.id)) == 2 and len(first.store.bench_results(a.id)) == 2
    assert b.verdict is None  # a third run is due (the noise band): the guard's test below reads that move
    # what the model was told names the session's number
    with Session.open(second.store, second.paths, second.sid) as s:
        history = loop.load_history(s)
    returns = [p.content for msg in history for p in msg.parts if getattr(p, "tool_name", "") == "launch_server"
               and hasattr(p, "content")]  # fmt: skip
    assert returns and all(json.loads(json.dumps(r, default=str)).get("experiment_id") == 1 for r in returns)
    assert "experiment 1" in loop.state_text(s) and "experiment 2" not in loop.state_text(s)


def test_reports_and_the_cli_show_the_sessions_numbers(tmp_path):
    _, second = _two_sessions(tmp_path)
    runner = CliRunner(env={"PIVOT_HOME": str(tmp_path)})
    summary = runner.invoke(cli, ["summary", second.sid], catch_exceptions=False)
    assert summary.exit_code == 0, summary.output
    text = summary.stdout
    assert "| #1 |" in text or "#1 " in text
    assert "#2" not in text  # the ledger's id of the second session's baseline is internal
    shown = runner.invoke(cli, ["show", second.sid, "--json"], catch_exceptions=False)
    (e,) = json.loads(shown.stdout)["experiments"]
    assert (e["number"], e["id"]) == (1, 2)
    analysed = runner.invoke(cli, ["analyze", second.sid, "--experiment", "1"], catch_exceptions=False)
    assert analysed.exit_code == 0 and "experiment #1" in analysed.stdout, analysed.output
    missing = runner.invoke(cli, ["analyze", second.sid, "--experiment", "2"], catch_exceptions=False)
    assert missing.exit_code == 1 and "has no experiment 2" in missing.stderr
    docs = [d for d in second.store.documents(second.sid) if d.kind == "improvement"]
    assert all("#2" not in (tmp_path / d.path).read_text() for d in docs)


def test_the_mapping_goes_both_ways_and_refuses_a_number_the_session_lacks(tmp_path):
    import pytest
    from pydantic_ai import ModelRetry

    first, second = _two_sessions(tmp_path)
    numbering = Numbering(second.store, second.sid)
    assert numbering.to_ids({"experiments": [{"experiment_id": 1, "runs": 2}]}) == {
        "experiments": [{"experiment_id": 2, "runs": 2}]
    }
    assert numbering.to_numbers(
        {"experiment_id": 2, "judgement": {"base_experiment_id": 2}, "experiment_ids": [2]}
    ) == {
        "experiment_id": 1,
        "judgement": {"base_experiment_id": 1},
        "experiment_ids": [1],
    }
    with pytest.raises(ModelRetry, match="no experiment 5 in this session; its experiments: 1"):
        numbering.to_ids({"experiment_id": 5})
    assert second.store.experiment_by_number(second.sid, 1).id == 2
    assert second.store.experiment_by_number(second.sid, 2) is None
    assert first.store.get_experiment(2).number == 1


def test_pivot_show_and_the_tui_give_each_experiment_at_its_judged_level(store, small_plan, paths):
    """The highest level both an experiment and its base completed, not its maximum over levels: an adopted change
    (572 at 64) read worse than the baseline (603 at 8) when each showed its own peak."""
    from agent import models as m
    from agent.tui import view
    from tests.factories import bench_level
    from tools.reports import Ledger

    store.create_session(m.Session(id="judged", name="x", plan=small_plan, engine="sim"))
    spec = small_plan.workload
    base = store.add_experiment("judged", m.Experiment(kind="baseline", config=small_plan.target.base_config(),
                                                       workload=spec, status="finished", verdict="baseline"))  # fmt: skip
    change = store.add_experiment("judged", m.Experiment(plan_item="01", config=small_plan.target.base_config(),
                                                         base_experiment_id=base.id, workload=spec,
                                                         status="finished", verdict="adopted"))  # fmt: skip
    for e, levels in ((base, {1: 100.0, 8: 603.0, 64: 500.0}), (change, {1: 100.0, 8: 580.0, 64: 572.0})):
        result = m.BenchResult(spec=spec, engine="sim", source="simulated",
                               levels=[bench_level(c, v) for c, v in levels.items()])  # fmt: skip
        store.add_bench_result(e.id, result)
    ledger = Ledger.read(store, "judged")
    assert ledger.figure(ledger.experiment(base.id))[:2] == (500.0, 64)
    assert ledger.figure(ledger.experiment(change.id))[:2] == (572.0, 64)
    rows = view.board(store, "judged").experiments
    assert [(r.id, r.best) for r in rows] == [("1", "500 @64 (1 run)"), ("2", "572 @64 (1 run)")]
    shown = CliRunner().invoke(cli, ["show", "judged"], catch_exceptions=False)
    assert "572 @64" in shown.stdout and "603" not in shown.stdout


def test_what_the_guard_tells_the_model_names_the_sessions_numbers(tmp_path):
    """The moves' lines, the tool schema's allowed values and the guard's refusals speak the numbers the model gives
    (the guard reads ledger ids: tools/numbering.py turns the model's numbers into them first)."""
    from pydantic_ai.tools import ToolDefinition

    from tools.method import guard
    from tools.method.compute import moves_of

    _, second = _two_sessions(tmp_path)  # its baseline: ledger id 2, number 1, waiting for a third run
    with Session.open(second.store, second.paths, second.sid) as s:
        mv = moves_of(s)
        assert set(mv.reruns) == {2}
        assert "launch_server experiment_id=1 (" in " ".join(mv.allowed_text())
        assert "experiment_id=2" not in " ".join(mv.allowed_text())
        assert "rerun experiment 1 (launch_server experiment_id=1" in mv.why
        schema = {"type": "object", "properties": {"experiment_id": {"type": "integer"}}}
        shown = guard._restrict(ToolDefinition(name="launch_server", parameters_json_schema=schema), mv, False)
        assert shown.parameters_json_schema["properties"]["experiment_id"]["enum"] == [1]
        why = guard.refusal(s, "record_verdict", {"experiment_id": 2, "verdict": "baseline"})
        assert why is not None and "experiment 1 " in why and "experiment 2" not in why, why


def test_the_autopilot_in_a_second_session_of_a_home_is_never_refused(tmp_path):
    """The demo's autopilot in a home whose ledger ids run on from another session: what it sends (numbers) is what
    the tools read, so it reaches its pivot with its baseline rerun and every verdict recorded."""
    from agent.plans import load_plan
    from tests.test_agent import new_session

    first = _new(tmp_path)
    first.run(DOCS + BASELINE)
    with new_session(first.store, first.paths, load_plan("glm5-nvfp4-rtxpro6000x8")) as s:
        sid = s.id
    with Session.open(first.store, first.paths, sid) as s:
        outcome = loop.run(s)
    assert outcome.status == "pivot", outcome.message
    exps = first.store.experiments(sid)
    assert exps[0].id == 2 and [e.number for e in exps] == list(range(1, len(exps) + 1))
    assert len(first.store.bench_results(exps[0].id)) >= 2 and all(e.verdict is not None for e in exps)
    pivot = first.store.open_pivot(sid)
    assert pivot is not None and pivot.question
    assert "AutopilotRefused" not in outcome.message
