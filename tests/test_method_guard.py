"""The method's guard (tools/method.py MethodGuard), driven by the scripted model (`--model script:FILE.jsonl`).

Every refusal is proven the same way: a script makes the call a model could make, the ledger then holds the
refusal (a retry with the rule and the numbers) and nothing else: no new experiment, no server, no verdict, no
pivot. The autopilot's own campaign trips no rule (tests/test_agent.py runs it whole).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic_ai.messages import RetryPromptPart, ToolReturnPart

from agent import loop
from agent import models as m
from agent.plans import parse_plan
from agent.session import Paths, Session
from agent.store import Store
from tools.method import RULES, Method, Moves, method_text
from tools.method.compute import moves_of

# GLM-5 on the twin: 02 (EP8) starts and crashes under load at 1024, as in the seeds.
PLAN = """
name = "guarded"
title = "GLM-5 under the guard"

[target]
model = "lukealonso/GLM-5-NVFP4"
model_profile = "glm-5-nvfp4"
hardware = "rtx-pro-6000-blackwell"
gpus = 8
flags = "--tp-size 8 --trust-remote-code"

[workload]
endpoint = "generate"
dataset_name = "random-ids"
random_input_len = 256
random_output_len = 256
random_range_ratio = 0.0
concurrency = [1, 1024]
seed = 42

[tiers]
1 = "Flags"
2 = "Config"

[[items]]
id = "01"
tier = 1
kind = "flag"
title = "Bigger prefill chunks"
flags = "--chunked-prefill-size 16384"
hypothesis = "Fewer prefill steps."
expected_impact = "+2% output tok/s"

[[items]]
id = "02"
tier = 1
kind = "config"
title = "Expert parallelism EP8"
flags = "--ep-size 8"
hypothesis = "Wider expert GEMMs."
expected_impact = "+20-50% output tok/s"

[[items]]
id = "03"
tier = 2
kind = "config"
title = "Fewer running requests"
flags = "--max-running-requests 512"
hypothesis = "Less KV pressure."
expected_impact = "+1% output tok/s"

[[items]]
id = "04"
tier = 2
kind = "code"
title = "A kernel for you"
change = "Write it."
hypothesis = "Faster."
expected_impact = "+5%"
"""

DOCS = [{"tool": "write_improvement_doc", "args": {"plan_item": i}} for i in ("01", "02", "03", "04")]
BASELINE = [
    {"tool": "launch_server", "args": {"baseline": True}},
    {"tool": "run_benchmark", "args": {}},
    {"tool": "launch_server", "args": {"experiment_id": 1}},
    {"tool": "run_benchmark", "args": {}},
    {"tool": "stop_server", "args": {}},
]
RERUN_BASELINE = [
    {"tool": "launch_server", "args": {"experiment_id": 1}},
    {"tool": "run_benchmark", "args": {}},
    {"tool": "stop_server", "args": {}},
]
JUDGE_BASELINE = [
    {"tool": "record_verdict", "args": {"experiment_id": 1, "verdict": "baseline", "reason": "measured twice"}}
]


class Ledger:
    """A session driven by scripts, one file per run."""

    def __init__(self, home: Path, sid: str) -> None:
        self.home, self.sid, self.runs = home, sid, 0
        self.paths = Paths.from_env(home)
        self.store = Store(self.paths.db_path)

    def run(self, steps: list[dict], answer: str | None = None) -> loop.RunOutcome:
        self.runs += 1
        script = self.home / f"script-{self.home.name}-{self.runs}.jsonl"  # a new file: replayed from its start
        script.write_text("".join(json.dumps(s) + "\n" for s in steps))
        self.store.set_session_model(self.sid, f"script:{script}")
        with Session.open(self.store, self.paths, self.sid) as s:
            return loop.run(s, answer=answer)

    def moves(self) -> Moves:
        with Session.open(self.store, self.paths, self.sid) as s:
            return moves_of(s)

    def snapshot(self) -> dict:
        exps = self.store.experiments(self.sid)
        return {
            "experiments": [
                (e.id, e.plan_items, e.status, e.verdict, len(self.store.bench_results(e.id))) for e in exps
            ],
            "servers": len(self.store.servers(self.sid)),
            "running": len(self.store.servers(self.sid, running_only=True)),
            "pivots": [(p.question, p.answer) for p in self.store.pivots(self.sid)],
        }

    def refusals(self) -> list[str]:
        with Session.open(self.store, self.paths, self.sid) as s:
            history = loop.load_history(s)
        return [
            str(p.content)
            for msg in history
            for p in msg.parts
            if isinstance(p, (ToolReturnPart, RetryPromptPart)) and "refused by the method" in str(p.content)
        ]

    def refused(self, steps: list[dict], rule: str, answer: str | None = None) -> str:
        """Run `steps` (the refused call first) and return the refusal; nothing may have changed."""
        before = self.snapshot()
        seen = len(self.refusals())
        self.run(steps, answer=answer)
        after = self.snapshot()
        assert after == before, (before, after)
        new = self.refusals()[seen:]
        assert len(new) == 1, new
        assert f"refused by the method ({rule})" in new[0], new[0]
        return new[0]


def _new(home: Path) -> Ledger:
    paths = Paths.from_env(home)
    store = Store(paths.db_path)
    plan = parse_plan(PLAN, "guarded.toml")
    t = plan.target
    options = {"model_profile": t.model_profile, "hardware": t.hardware, "gpus": t.gpus, "noise": 0.015}
    with Session.create(store, paths, plan, engine_name="sim", settings=m.SessionSettings(engine_options=options)) as s:
        sid = s.id
    store.close()
    return Ledger(home, sid)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, str]:
    """A session with its documents and its baseline measured twice and judged (copied for each test)."""
    home = tmp_path_factory.mktemp("measured")
    ledger = _new(home)
    ledger.run(DOCS + BASELINE)
    while 1 in ledger.moves().reruns:  # a noise band too wide for the plan's effects asks for more runs
        ledger.run(RERUN_BASELINE)
    ledger.run(JUDGE_BASELINE)
    base = ledger.store.experiments(ledger.sid)[0]
    assert base.verdict == "baseline" and len(ledger.store.bench_results(base.id)) >= 2
    ledger.store.close()
    return home, ledger.sid


@pytest.fixture
def ledger(measured, tmp_path) -> Ledger:
    home, sid = measured
    shutil.copytree(home, tmp_path / "copy")
    return Ledger(tmp_path / "copy", sid)


def test_the_method_text_is_made_of_the_enforced_rules():
    text = method_text()
    for rule in RULES:
        assert rule.text in text
    assert method_text() in loop.METHOD
    assert text.count("[enforced]") == sum(r.enforced for r in RULES) >= 6


def test_no_experiment_before_the_documents(tmp_path):
    ledger = _new(tmp_path)
    why = ledger.refused([{"tool": "launch_server", "args": {"baseline": True}}], "documents")
    assert "4 of 4 missing" in why


def test_no_change_before_the_baseline_is_rerun(tmp_path):
    ledger = _new(tmp_path)
    ledger.run(DOCS + BASELINE[:2] + [{"tool": "stop_server", "args": {}}])
    why = ledger.refused([{"tool": "launch_server", "args": {"plan_item": "01"}}], "baseline")
    assert "1 run of the 2" in why and "experiment_id=1" in why


def test_an_item_of_a_tier_not_released_is_refused(ledger):
    why = ledger.refused([{"tool": "launch_server", "args": {"plan_item": "03"}}], "released")
    assert "03 (tier 2)" in why and "released tiers: 1" in why


def test_extra_flags_are_refused(ledger):
    why = ledger.refused(
        [{"tool": "launch_server", "args": {"plan_item": "01", "flags": "--cuda-graph-max-bs 256"}}], "one_change"
    )
    assert "--tp-size 8" in why and "--cuda-graph-max-bs 256" in why  # the best configuration, the flags refused
    ledger.refused([{"tool": "launch_server", "args": {"flags": "--chunked-prefill-size 8192"}}], "one_change")
    ledger.refused([{"tool": "launch_server", "args": {"baseline": True, "flags": "--ep-size 8"}}], "one_change")


def test_a_bounded_retry_after_a_crash_under_load_is_the_one_exception(ledger):
    ep8 = [
        {"tool": "launch_server", "args": {"plan_item": "02"}},
        {"tool": "run_benchmark", "args": {}},
        {"tool": "stop_server", "args": {}},
    ]
    capped = {"tool": "launch_server", "args": {"plan_item": "02", "flags": "--max-running-requests 512"}}
    # before the crash, the capped flags are extra flags like any other
    ledger.refused([capped], "one_change")
    ledger.run(ep8)
    crashed = ledger.store.experiments(ledger.sid)[-1]
    assert crashed.plan_items == ["02"] and crashed.failure is not None
    why = ledger.refused([capped], "judge_first")  # its verdict first
    assert f"record_verdict experiment_id={crashed.id} verdict=crashed" in why
    ledger.run([{"tool": "record_verdict", "args": {"experiment_id": crashed.id, "verdict": "crashed", "reason": "x"}}])
    why = ledger.refused([capped], "pivot_after_tier")  # a promising item crashed: the user decides first
    assert "02 crashed" in why
    question = "02 Expert parallelism EP8 crashed at 1024. How should pivot go on?"
    assert pivot(ledger, question, ["retry 02 with --max-running-requests 512", "stop"]).status == "pivot"
    ledger.run([{"tool": "todo_read", "args": {}}], answer="continue")
    why = ledger.refused(
        [{"tool": "launch_server", "args": {"plan_item": "02", "flags": "--max-running-requests 2048"}}],
        "one_change",
    )
    assert "below 1024" in why
    ledger.refused(
        [{"tool": "launch_server", "args": {"plan_item": "02", "flags": "--max-running-requests 512 --tp-size 4"}}],
        "one_change",
    )
    refused = len(ledger.refusals())
    ledger.run([capped])
    retry = ledger.store.experiments(ledger.sid)[-1]
    assert retry.id != crashed.id and "--max-running-requests 512" in str(retry.config)
    assert len(ledger.refusals()) == refused  # the capped retry itself ran
    assert ledger.store.servers(ledger.sid, running_only=True) == []  # the run's end stopped it
    # the retry was cut before its benchmark (a cancel, Escape in the TUI): it is still the retry on offer, and runs
    assert ledger.store.bench_results(retry.id) == []
    ledger.run([capped, {"tool": "run_benchmark", "args": {}}])
    assert len(ledger.refusals()) == refused, ledger.refusals()[-1:]
    assert [e for e in ledger.store.experiments(ledger.sid) if ledger.store.bench_results(e.id)][-1].plan_items == [
        "02"
    ]


def test_a_verdict_that_contradicts_the_numbers_is_refused(ledger):
    ledger.run(
        [
            {"tool": "launch_server", "args": {"plan_item": "01"}},
            {"tool": "run_benchmark", "args": {}},
            {"tool": "stop_server", "args": {}},
        ]
    )
    e = ledger.store.experiments(ledger.sid)[-1]
    before = ledger.snapshot()
    ledger.run([{"tool": "record_verdict", "args": {"experiment_id": e.id, "verdict": "crashed", "reason": "x"}}])
    assert ledger.snapshot() == before
    assert ledger.store.get_experiment(e.id).verdict is None


def pivot(ledger: Ledger, question: str, options: list[str]) -> loop.RunOutcome:
    return ledger.run(
        [
            {"tool": "write_status_summary", "args": {"question": question, "options": options}},
            {"tool": "ask_user", "args": {"question": question, "options": options}},
        ]
    )


def judge_all(ledger: Ledger) -> None:
    """Record every measured experiment's verdict by its numbers (rerun first where the judgement asks)."""
    for e in ledger.store.experiments(ledger.sid)[1:]:
        if e.verdict is not None:
            continue
        j = Method.read(ledger.store, ledger.sid).judge(e)
        while j.suggestion == "rerun":
            ledger.run([{"tool": "launch_server", "args": {"experiment_id": e.id}}, {"tool": "run_benchmark"}])
            j = Method.read(ledger.store, ledger.sid).judge(e)
        ledger.run(
            [{"tool": "record_verdict", "args": {"experiment_id": e.id, "verdict": j.suggestion, "reason": j.text}}]
        )


def test_an_item_of_another_tier_after_a_finished_tier_needs_a_pivot(ledger):
    asked = pivot(ledger, "The baseline is measured (noise 1%). Which item first?", ["continue", "03 test it next"])
    assert asked.status == "pivot"
    assert ledger.store.pivots(ledger.sid)[-1].closes_tiers == []  # Tier 1's work was not done: it closes nothing
    for i, item in enumerate(("01", "02")):  # the model finishes Tier 1 first, then turns to 03 (asked for)
        steps = [
            {"tool": "launch_server", "args": {"plan_item": item}},
            {"tool": "run_benchmark", "args": {}},
            {"tool": "stop_server", "args": {}},
        ]
        ledger.run(steps, answer="2" if i == 0 else None)
        judge_all(ledger)
    assert [e.plan_items for e in ledger.store.experiments(ledger.sid) if e.verdict] == [[], ["01"], ["02"]]
    why = ledger.refused([{"tool": "launch_server", "args": {"plan_item": "03"}}], "pivot_after_tier")
    assert "Tier 1 (Flags) is finished" in why
    # the end of the tier is recorded when it happens: a retest in it waits for the pivot too
    ledger.refused([{"tool": "launch_server", "args": {"plan_item": "01"}}], "pivot_after_tier")
    question = "Tier 1 done: 01 gave no gain, 02 crashed at 1024. Which way next?"
    assert pivot(ledger, question, ["continue: Tier 2", "stop: write the final summary"]).status == "pivot"
    assert ledger.store.pivots(ledger.sid)[-1].closes_tiers == [1]
    ledger.run([{"tool": "launch_server", "args": {"plan_item": "03"}}], answer="1")  # 03, asked for, now goes
    assert ledger.store.experiments(ledger.sid)[-1].plan_items == ["03"]


def test_a_combined_step_with_an_earlier_tiers_item_does_not_reopen_that_tier(ledger):
    """The abort of issue #24: after `continue` at Tier 1's pivot, a combined step of a Tier 1 item with a Tier 2
    item is judged; Tier 1 stays closed (its end is the pivot that closed it), and a Tier 2 item goes on."""
    for item in ("01", "02"):
        ledger.run([{"tool": "launch_server", "args": {"plan_item": item}}, {"tool": "run_benchmark"}])
        judge_all(ledger)
    question = "Tier 1 done: 01 gave no gain, 02 crashed at 1024. Which way next?"
    assert pivot(ledger, question, ["continue: Tier 2", "stop: write the final summary"]).status == "pivot"
    assert ledger.store.pivots(ledger.sid)[-1].closes_tiers == [1]
    ledger.run([{"tool": "launch_server", "args": {"plan_items": ["01", "03"]}}, {"tool": "run_benchmark"}], "1")
    judge_all(ledger)
    assert ledger.store.experiments(ledger.sid)[-1].plan_items == ["01", "03"]
    moves = ledger.moves()
    assert moves.decision.closed == {1} and moves.decision.released == {1, 2}
    assert moves.pivot is None or moves.pivot.closes == (2,)  # Tier 1 is never finished again


@pytest.mark.parametrize(
    "args",
    [
        {"question": "a", "options": ["a"]},
        {"question": "Tier 1 is done. Which way next?", "options": []},
        {"question": "Tier 1 is done. Which way next?", "options": ["go", "go"]},
        {"question": "Go on?", "options": ["yes", "no"]},
    ],
)
def test_a_question_that_is_not_a_question_is_refused(ledger, args):
    ledger.refused([{"tool": "ask_user", "args": args}], "question")
    assert ledger.store.open_pivot(ledger.sid) is None


def test_the_script_ends_cleanly_and_resumes_where_it_stopped(ledger):
    outcome = ledger.run([{"tool": "todo_read", "args": {}}])
    assert outcome.status in ("waiting", "finished") and "ended after 1 steps" in outcome.message
    assert ledger.store.get_session(ledger.sid).status == "waiting"


def test_the_autopilot_works_the_plan_to_the_end_without_a_refusal(tmp_path):
    ledger = _new(tmp_path)
    ledger.store.set_session_model(ledger.sid, "autopilot")
    with Session.open(ledger.store, ledger.paths, ledger.sid) as s:
        outcome = loop.run(s)
    for answer in ("1", "continue", "1", "1", "1"):
        if outcome.status != "pivot":
            break
        with Session.open(ledger.store, ledger.paths, ledger.sid) as s:
            outcome = loop.run(s, answer=answer)
    assert outcome.status == "finished", outcome.message
    assert ledger.refusals() == []
    items = {i for e in ledger.store.experiments(ledger.sid) for i in e.plan_items}
    assert items == {"01", "02", "03"}  # every item with something to run (04 is code)
