"""The method's moves (tools/method/moves.py): tier ends recorded when they happen, verdicts exactly as the numbers
permit, reverts built from the chain of adopted changes, what a model is shown, and a campaign that never dies of
its own method (crash reports, no retry loops, no documents rewritten forever, no pivot that offers only stop).

Campaigns run on the formula engine (tests/formula_engine.py), whose formula is its own predictor; ledgers built by
hand where a state is the point."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic_ai import ModelRetry
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent import loop
from agent import models as m
from agent.questions import question
from agent.session import Paths, Session
from agent.store import Store
from tests.factories import baseline_and_change, bench_level
from tests.formula_engine import Effect, Formula, FormulaEngine, FormulaPredictor, formula_plan
from tools import reports, search
from tools.method import Method, Moves, decision, permitted
from tools.method.compute import moves_of


@pytest.fixture(autouse=True)
def quick_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Status summaries without their HTML and charts (tests/test_reports.py covers those)."""
    monkeypatch.setattr("tools.reports.status.write_status_html", lambda *a, **k: None)


class Campaign:
    """A formula campaign driven by the autopilot through the real loop."""

    def __init__(self, home: Path, effects, tiers, monkeypatch, expected=None, noise=0.0, hook=None, **settings):
        self.formula = Formula(effects)
        self.plan = formula_plan(effects, tiers, expected)
        monkeypatch.setattr(search, "predictor_for", lambda method: FormulaPredictor(self.formula))
        self.engine = FormulaEngine(self.formula, noise=noise, hook=hook)
        self.paths = Paths.from_env(home)
        self.paths.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(self.paths.db_path)
        with Session.create(self.store, self.paths, self.plan, engine=self.engine,
                            settings=m.SessionSettings(**settings)) as s:  # fmt: skip
            self.sid = s.id

    def run(self, answer: str | None = None) -> loop.RunOutcome:
        with Session.open(self.store, self.paths, self.sid, engine=self.engine) as s:
            return loop.run(s, answer=answer)

    def moves(self) -> Moves:
        with Session.open(self.store, self.paths, self.sid, engine=self.engine) as s:
            return moves_of(s)

    def experiments(self) -> list[m.Experiment]:
        return self.store.experiments(self.sid)

    def tool_calls(self, tool: str) -> list[dict]:
        with Session.open(self.store, self.paths, self.sid, engine=self.engine) as s:
            history = loop.load_history(s)
        return [p.args_as_dict() for x in history for p in x.parts if getattr(p, "tool_name", None) == tool
                and p.part_kind == "tool-call"]  # fmt: skip


def to_the_end(c: Campaign, answers: list[str]) -> loop.RunOutcome:
    out = c.run()
    for a in answers:
        if out.status != "pivot":
            break
        out = c.run(answer=a)
    return out


# ---- tier ends


def test_a_combined_step_across_tiers_after_continue_never_reopens_the_first_tier(tmp_path, monkeypatch):
    """Issue #24's abort: 02 (Tier 1) pays only with 03 (Tier 2); after `continue`, the search combines them in one
    step, Tier 1 stays closed by the pivot that closed it, and the campaign goes on to its end."""
    effects = {
        "01": Effect("--knob-1 1", factor=1.08),
        "02": Effect("--knob-2 1", factor=1.0, with_item="03", pair_factor=1.15),
        "03": Effect("--knob-3 1", factor=1.0),
        "04": Effect("--knob-4 1", factor=1.001),
    }
    c = Campaign(tmp_path, effects, {"01": 1, "02": 1, "03": 2, "04": 2}, monkeypatch)
    first = c.run()
    assert first.status == "pivot" and "Tier 1" in first.message
    assert c.store.pivots(c.sid)[-1].closes_tiers == [1]
    out = c.run(answer="continue")
    combined = [e for e in c.experiments() if e.plan_items == ["02", "03"]]
    assert combined and combined[0].verdict == "adopted"
    moves = c.moves()
    assert moves.decision.closed >= {1} and 2 in moves.decision.released
    while out.status == "pivot":
        out = c.run(answer="continue")
    assert out.status == "finished", out.message
    assert [p.closes_tiers for p in c.store.pivots(c.sid)] == [[1], [2]][: len(c.store.pivots(c.sid))]


def test_continue_releases_the_next_tier_only_when_the_last_one_is_closed(store, paths, small_plan):
    plan = small_plan.model_copy(update={"tiers": {1: "one", 2: "two"}})
    with Session.create(store, paths, plan, engine_name="sim") as s:
        store.add_pivot(s.id, m.Pivot(question="A stall in tier 1. Go on?", answer="continue", closes_tiers=[],
                                      answered_at=m.utcnow()))  # fmt: skip
        d = decision(Method.read(store, s.id))
        assert d.released == {1} and d.closed == set()
        store.add_pivot(s.id, m.Pivot(question="Tier 1 done. Which way?", answer="continue", closes_tiers=[1],
                                      answered_at=m.utcnow()))  # fmt: skip
        d = decision(Method.read(store, s.id))
        assert d.released == {1, 2} and d.closed == {1} and d.open == {2}


# ---- verdicts


def _measured(store, s, items, config, base, *values, workload=None):
    e = store.add_experiment(
        s.id,
        m.Experiment(plan_items=items, kind="change" if items else "baseline", config=config,
                     base_experiment_id=base.id if base else None, workload=workload or s.plan.workload),
    )  # fmt: skip
    for v in values:
        store.add_bench_result(
            e.id or 0,
            m.BenchResult(spec=s.plan.workload, engine="sim", source="simulated", levels=[bench_level(1, 10), bench_level(8, v)]),
        )  # fmt: skip
    return store.update_experiment(e.model_copy(update={"status": "finished"}))


def test_a_measured_regression_is_regressed_and_nothing_else(store, paths, small_plan):
    from tools.docs import record_verdict

    with Session.create(store, paths, small_plan, engine_name="sim") as s:
        base = _measured(store, s, [], small_plan.target.base_config(), None, 1000, 1000)
        store.update_experiment(base.model_copy(update={"verdict": "baseline"}))
        config = small_plan.item("01").apply(base.config)
        e = _measured(store, s, ["01"], config, base, 130, 131)
        method = Method.read(store, s.id)
        assert permitted(method, e, method.judge(e)) == ("regressed",)

        class Ctx:
            deps = s

        for verdict in ("no_gain", "measured", "inconclusive", "adopted", "crashed"):
            with pytest.raises(ModelRetry, match="permit regressed"):
                record_verdict(Ctx(), verdict, "the model says so", experiment_id=e.id)  # type: ignore[arg-type]
        done = record_verdict(Ctx(), "regressed", "-87%", experiment_id=e.id)  # type: ignore[arg-type]
        assert done.verdict == "regressed"
        with pytest.raises(ModelRetry, match="already has its verdict"):
            record_verdict(Ctx(), "regressed", "again", experiment_id=e.id)  # type: ignore[arg-type]


# ---- reverts


def test_the_best_without_an_item_is_rebuilt_from_the_chain_of_adopted_changes(store, paths):
    effects = {"01": Effect("--max-running-requests 160"), "02": Effect("--knob-2 1"), "03": Effect("--knob-3 1")}
    plan = formula_plan(effects, {"01": 1, "02": 1, "03": 1})
    plan = plan.model_copy(update={"target": plan.target.model_copy(update={"flags": m.ServerConfig.parse(
        "--tp-size 1 --max-running-requests 256")})})  # fmt: skip
    with Session.create(store, paths, plan, engine_name="sim") as s:
        base = _measured(store, s, [], plan.target.base_config(), None, 1000, 1000)
        store.update_experiment(base.model_copy(update={"verdict": "baseline"}))
        capped = plan.item("01").apply(base.config)
        e1 = _measured(store, s, ["01"], capped, base, 1100, 1100)
        store.update_experiment(e1.model_copy(update={"verdict": "adopted"}))
        retry = plan.item("02").apply(capped).with_flags("--knob-9 3")  # a bounded retry's extra flag
        e2 = _measured(store, s, ["02"], retry, e1, 1200, 1200)
        store.update_experiment(e2.model_copy(update={"verdict": "adopted"}))
        method = Method.read(store, s.id)
        assert method.rebuild() == method.best_config() == retry
        assert method.active_items() == ["01", "02"]
        without = method.rebuild(drop={"01"})
        assert (
            str(without) == "--model-path org/formula-70b --tp-size 1 --max-running-requests 256 --knob-2 1 --knob-9 3"
        )
        e3 = _measured(store, s, [], without, e2, 1300, 1300)
        store.update_experiment(e3.model_copy(update={"verdict": "adopted", "reverts": ["01"]}))
        method = Method.read(store, s.id)
        assert method.active_items() == ["02"] and method.best_config() == without
        assert method.adopted_by("01") is None and method.adopted_by("02").id == e2.id


def test_a_change_a_later_one_turns_into_a_brake_is_taken_back(tmp_path, monkeypatch):
    effects = {
        "01": Effect("--knob-1 1", factor=1.08, with_item="03", pair_factor=0.8),  # the cap: a brake with 03
        "02": Effect("--knob-2 1", factor=1.0),
        "03": Effect("--knob-3 1", factor=1.4),
    }
    c = Campaign(tmp_path, effects, {"01": 1, "02": 1, "03": 2}, monkeypatch, expected={"03": "+20-50% output tok/s"})
    out = to_the_end(c, ["continue"] * 4)
    assert out.status == "finished", out.message
    method = Method.read(c.store, c.sid)
    assert method.active_items() == ["03"] and "--knob-1" not in str(method.best_config())
    back = [e for e in c.experiments() if e.reverts == ["01"]]
    assert back and back[0].verdict == "adopted" and "03 Knob 03" in (back[0].revert_why or "")
    ledger = reports.Ledger.read(c.store, c.sid)
    assert reports.item_status(ledger, c.plan.item("01"))[0].startswith("adopted, then taken back")
    todos = {t.plan_item: t.content for t in c.store.todos(c.sid)}
    assert todos["01"].endswith(": adopted, then taken back") and todos["03"].endswith(": adopted"), todos
    summary = reports.render_status(ledger, 9, "q?", ["stop"]).markdown
    assert "a brake: dropped, +" in summary and " -01 |" in summary


# ---- what a model sees


def test_a_model_is_shown_only_the_verdicts_and_items_allowed(tmp_path, monkeypatch):
    effects = {"01": Effect("--knob-1 1", factor=1.2), "02": Effect("--knob-2 1", factor=1.0)}
    c = Campaign(tmp_path, effects, {"01": 1, "02": 2}, monkeypatch, request_limit=14)
    c.run()  # stops after 14 requests: the documents, the baseline and the first change, measured
    seen: list[dict] = []

    def look(messages, info: AgentInfo) -> ModelResponse:
        seen.extend(
            {"name": t.name, "schema": t.parameters_json_schema, "text": t.description or ""}
            for t in info.function_tools
        )
        return ModelResponse(parts=[TextPart("looked")])

    moves = c.moves()
    with Session.open(c.store, c.paths, c.sid, engine=c.engine) as s:
        asyncio.run(loop.build_agent().run("look", deps=s, model=FunctionModel(look)))
    tools = {t["name"]: t for t in seen}
    if moves.phase == "judge":
        (eid, verdicts), *_ = moves.verdicts.items()
        props = tools["record_verdict"]["schema"]["properties"]
        assert eid in str(props["experiment_id"]) and props["verdict"]["enum"] == sorted(set(verdicts))
        assert "plan_item" not in props
        assert tools["launch_server"]["text"].startswith("NOT ALLOWED NOW") or moves.reruns
    else:
        props = tools["launch_server"]["schema"]["properties"]
        assert "remove_flags" not in props and "02" not in str(props.get("plan_item", ""))  # tier 2 is not released
    assert "Allowed now" in tools["launch_server"]["text"] + tools["record_verdict"]["text"]


# ---- a campaign never dies of its own method


def test_an_unexpected_failure_leaves_the_session_resumable_with_a_crash_report(tmp_path, monkeypatch):
    secret = "sk-thisisasecretkey12345"
    monkeypatch.setenv("SOME_PROVIDER_API_KEY", secret)
    failed = []

    def hook(event, obj):
        if event == "benchmark" and "--knob-1" in str(obj.config) and not failed:  # the first change's benchmark
            failed.append(obj)
            raise RuntimeError(f"the driver fell over (key {secret})")

    effects = {"01": Effect("--knob-1 1", factor=1.2), "02": Effect("--knob-2 1", factor=1.0)}
    c = Campaign(tmp_path, effects, {"01": 1, "02": 1}, monkeypatch, hook=hook)
    out = c.run()
    assert out.status == "failed" and "crash report: state/" in out.message and secret not in out.message
    assert f"pivot resume {c.sid}" in (out.hint or "")
    assert c.store.get_session(c.sid).status == "waiting"
    cut = [e for e in c.experiments() if e.status == "interrupted"]
    assert len(cut) == 1 and cut[0].plan_items == ["01"]
    (report,) = (c.paths.session_state_dir(c.sid) / "crashes").iterdir()
    text = report.read_text()
    assert "RuntimeError: the driver fell over" in text and "Traceback" in text and secret not in text
    again = to_the_end(c, ["continue", "continue"])
    assert again.status in ("finished", "pivot"), again.message
    relaunched = c.store.get_experiment(cut[0].id or 0)
    assert relaunched.verdict is not None and c.store.bench_results(cut[0].id or 0)  # relaunched in place


def test_a_call_the_method_refuses_ends_the_autopilot_at_once(tmp_path, monkeypatch):
    from agent.autopilot import Autopilot
    from agent.steps import Call

    effects = {"01": Effect("--knob-1 1", factor=1.2), "02": Effect("--knob-2 1", factor=1.0)}
    c = Campaign(tmp_path, effects, {"01": 1, "02": 2}, monkeypatch)
    original = Autopilot.call_for

    def wrong(self, moves, last):
        call = original(self, moves, last)
        if moves.phase == "work":
            return Call("launch_server", {"plan_item": "02"})  # Tier 2 is not released
        return call

    monkeypatch.setattr(Autopilot, "call_for", wrong)
    out = c.run()
    assert out.status == "failed" and "AutopilotRefused" in out.message and "released" in out.message
    assert len(c.tool_calls("launch_server")) <= 4  # the baseline's runs, then one refused call: no retry loop


def test_a_document_edited_by_hand_is_not_written_again_and_again(tmp_path, monkeypatch):
    effects = {"01": Effect("--knob-1 1", factor=1.2), "02": Effect("--knob-2 1", factor=1.0)}
    c = Campaign(tmp_path, effects, {"01": 1, "02": 2}, monkeypatch)
    assert c.run().status == "pivot"
    doc = next(d for d in c.store.documents(c.sid) if d.plan_item == "02")
    path = c.paths.home / doc.path
    path.write_text(path.read_text() + "\nMy own notes.\n")
    before = len(c.tool_calls("write_improvement_doc"))
    out = to_the_end(c, ["continue", "continue"])
    assert out.status == "finished", out.message
    writes = c.tool_calls("write_improvement_doc")[before:]
    assert len([w for w in writes if w["plan_item"] == "02"]) <= 2
    assert "My own notes." in path.read_text() and path.with_name(path.stem + ".new.md").exists()


def test_the_last_tier_ends_without_a_pivot_that_offers_only_stop(tmp_path, monkeypatch):
    effects = {"01": Effect("--knob-1 1", factor=1.2), "02": Effect("--knob-2 1", noop=True)}
    c = Campaign(tmp_path, effects, {"01": 1, "02": 1}, monkeypatch)
    out = c.run()
    assert out.status == "finished", out.message  # one tier, nothing left to offer: finished, no pivot
    assert c.store.pivots(c.sid) == []
    for p in c.store.pivots(c.sid):
        assert len(p.options) > 1


# ---- no predictor, a refused benchmark, wide noise


def test_without_a_predictor_the_search_measures_in_the_plans_expected_order(tmp_path, monkeypatch):
    effects = {
        "01": Effect("--knob-1 1", factor=1.01),
        "02": Effect("--knob-2 1", factor=1.3),
        "03": Effect("--knob-3 1", factor=1.02),
    }
    expected = {"01": "+1-2% output tok/s", "02": "+20-40% output tok/s", "03": "+5-10% output tok/s"}
    c = Campaign(tmp_path, effects, {"01": 1, "02": 1, "03": 1}, monkeypatch, expected=expected)
    monkeypatch.setattr(search, "predictor_for", lambda method: None)
    out = c.run()
    launched = [e.plan_items[0] for e in c.experiments() if e.kind == "change" and c.store.bench_results(e.id or 0)]
    assert launched[:3] == ["02", "03", "01"]  # by the plan's expected impact: nothing is predicted
    assert not any(e.verdict == "predicted" for e in c.experiments())
    assert out.status == "finished"
    assert all("twin predicts" not in (e.prediction or "") for e in c.experiments())
    assert any("no predictions for this target" in (e.prediction or "") for e in c.experiments())


def test_a_benchmark_the_server_refused_owes_a_pivot_that_says_what_to_fix(store, paths, small_plan):
    with Session.create(store, paths, small_plan, engine_name="sim") as s:
        reports.write_improvement_docs(s)
        store.add_experiment(
            s.id,
            m.Experiment(kind="baseline", config=small_plan.target.base_config(), workload=small_plan.workload,
                         status="failed", failure="benchmark-refused", verdict="crashed",
                         failure_detail="HTTP 400: Token id 11465 is out of vocabulary"),
        )  # fmt: skip
        moves = moves_of(s)
        assert moves.phase == "pivot" and moves.pivot is not None and moves.pivot.kind == "benchmark"
        q, options = question(moves)
        assert "out of vocabulary" in q and "[workload]" in q and "--plan FILE" in q
        assert options[0].startswith("continue") and options[-1].startswith("stop")
        assert not moves.launches


def test_a_noise_band_too_wide_for_the_plan_adds_baseline_runs_and_the_summary_says_so(tmp_path, monkeypatch):
    effects = {"01": Effect("--knob-1 1", factor=1.3), "02": Effect("--knob-2 1", factor=1.0)}
    c = Campaign(tmp_path, effects, {"01": 1, "02": 2}, monkeypatch, noise=0.08)
    c.run()
    base = c.experiments()[0]
    runs = len(c.store.bench_results(base.id or 0))
    method = Method.read(c.store, c.sid)
    assert 2 <= runs <= 4
    ledger = reports.Ledger.read(c.store, c.sid)
    summary = reports.render_status(ledger, 9, "q?", ["stop"]).markdown
    assert f"Noise band: {method.band_pct():.1f}%" in summary and "twice the standard error" in summary


def test_the_noise_statistic_narrows_with_runs_and_is_the_spread_for_two() -> None:
    assert m.BenchLevel.noise_pct([100.0, 104.0]) == pytest.approx(4 / 102 * 100)
    four = m.BenchLevel.noise_pct([100.0, 104.0, 100.0, 104.0])
    assert four is not None and four < 4 / 102 * 100
    assert m.BenchLevel.noise_pct([100.0]) is None


def test_the_demo_plan_keeps_two_baseline_runs(store, paths) -> None:
    """Where the noise is small next to the plan's effects (the demo's 3.5% against a typical +10%), the baseline
    runs twice, as before; the same noise against a plan of +2% effects asks for a third run."""
    from agent.plans import load_plan
    from tools.method import baseline_runs_needed

    demo = load_plan("glm5-nvfp4-rtxpro6000x8")
    small = demo.model_copy(
        update={"items": [it.model_copy(update={"expected_impact": "+1-3% output tok/s"}) for it in demo.items]}
    )
    for plan, runs in ((demo, 2), (small, 3)):
        with Session.create(store, paths, plan, engine_name="sim") as s:
            base = store.add_experiment(
                s.id, m.Experiment(kind="baseline", config=plan.target.base_config(), workload=plan.workload)
            )
            for v in (2082.0, 2011.0):  # the demo's two runs: a spread of 3.5%
                store.add_bench_result(base.id or 0, m.BenchResult(spec=plan.workload, engine="sim", source="simulated",
                                                                   levels=[bench_level(2048, v)]))  # fmt: skip
            method = Method.read(store, s.id)
            assert method.noise_pct() == pytest.approx(3.5, abs=0.05)
            assert baseline_runs_needed(method) == runs


def test_asking_for_an_item_the_engine_refused_says_so_once(tmp_path, monkeypatch):
    effects = {"01": Effect("--knob-1 1", refused=True), "02": Effect("--knob-2 1", factor=1.2)}
    c = Campaign(tmp_path, effects, {"01": 1, "02": 2}, monkeypatch, request_limit=80)
    assert c.run().status == "pivot"
    out = c.run(answer="01")
    assert out.status == "pivot" and "Item 01 cannot be run" in out.message and "unrecognized" in out.message
    assert [e.plan_items for e in c.experiments() if e.verdict == "ruled_out"] == [["01"]]
    assert c.run(answer="continue").status in ("pivot", "finished")


def test_a_refused_change_keeps_the_engines_own_words_in_its_verdict(store, paths, small_plan):
    from tools.method.reading import engine_words

    words = "Value error, max_model_len (8192) is greater than the derived max_model_len (2048)"
    assert engine_words(f"vllm exited while starting (exit code 1): argument-validation ({words})") == words
    assert engine_words(words) == words and engine_words(None) == ""
    with Session.create(store, paths, small_plan, engine_name="sim") as s:
        base = store.add_experiment(s.id, m.Experiment(kind="baseline", config=small_plan.target.base_config(),
                                                       workload=small_plan.workload, status="finished"))  # fmt: skip
        store.add_bench_result(base.id or 0, m.BenchResult(spec=small_plan.workload, engine="sim",
                                                          source="simulated", levels=[bench_level(8, 100.0)]))  # fmt: skip
        for failure, detail, what in (
            ("argument-validation", words, "the engine refused the flags (argument-validation): " + words),
            ("unsupported-hardware", "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX",
             "the engine cannot run it on this hardware (unsupported-hardware): NotImplementedError: FP8 KV cache"),
        ):  # fmt: skip
            e = store.add_experiment(s.id, m.Experiment(kind="change", config=small_plan.target.base_config(),
                                                        workload=small_plan.workload, status="failed",
                                                        failure=failure, failure_detail=detail,
                                                        base_experiment_id=base.id))  # fmt: skip
            j = Method.read(store, s.id).judge(e)
            assert j.suggestion == "ruled_out" and j.text.startswith(what), j.text


def test_a_change_whose_own_runs_disagree_is_judged_against_their_spread_not_the_baselines(store, paths, small_plan):
    """A null control measured at 473 and 221 tok/s against a baseline steady at 400: not 'regressed -15%' on a 4%
    band, but inside its own spread."""
    with Session.create(store, paths, small_plan, engine_name="sim") as s:
        base, change = baseline_and_change(store, s.id, small_plan)
        top = max(small_plan.workload.concurrency)
        for eid, values in ((base.id, (400.0, 404.0)), (change.id, (473.0, 221.0))):
            for v in values:
                store.add_bench_result(eid or 0, m.BenchResult(spec=small_plan.workload, engine="sim",
                                                               source="measured", levels=[bench_level(top, v)]))  # fmt: skip
        j = Method.read(store, s.id).judge(change)
        assert j.suggestion in ("rerun", "no_gain"), j.text
        assert "its own 2 runs spread" in j.text and j.band_pct > 50
        steady = store.add_experiment(s.id, change.model_copy(update={"id": None}))
        for v in (350.0, 352.0):
            store.add_bench_result(steady.id or 0, m.BenchResult(spec=small_plan.workload, engine="sim",
                                                                 source="measured", levels=[bench_level(top, v)]))  # fmt: skip
        waits = Method.read(store, s.id).judge(steady)  # measured runs: a decisive change waits for its base again
        assert waits.suggestion == "rebase" and "measured again after it before the verdict" in waits.text
        store.add_bench_result(base.id or 0, m.BenchResult(spec=small_plan.workload, engine="sim", source="measured",
                                                           levels=[bench_level(top, 400.0)]))  # fmt: skip
        j = Method.read(store, s.id).judge(steady)
        assert j.suggestion == "regressed" and "(A/B/A" in j.text, j.text  # tight runs: the session's band
