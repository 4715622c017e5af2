"""The agent loop driven by pydantic-ai's test models: assertions on the ledger, not only on replies."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.messages import ModelMessage, RetryPromptPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from agent import loop
from agent import models as m
from agent.plans import parse_plan
from agent.session import Paths, Session
from agent.store import Store
from tests.test_agent import TEST_PLAN


def _session(store: Store, paths: Paths) -> Session:
    plan = parse_plan(TEST_PLAN, source="test.toml")
    t = plan.target
    settings = m.SessionSettings(engine_options={"model_profile": t.model_profile, "hardware": t.hardware, "gpus": 1})
    return Session.create(store, paths, plan, engine_name="sim", model="test", settings=settings)


class Script:
    """A FunctionModel that plays tool calls in order, then a text; it records what came back."""

    def __init__(self, steps: list[tuple[str, dict[str, Any]] | str]) -> None:
        self.steps = steps
        self.i = 0
        self.seen: list[Any] = []
        self.tools: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.tools = [t.name for t in info.function_tools]
        self.seen.append(messages[-1])
        step = self.steps[self.i]
        self.i += 1
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        name, args = step
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{self.i}")])

    def returns(self) -> list[Any]:
        """Tool results, successful or not, in order."""
        return [
            p
            for msg in self.seen
            for p in getattr(msg, "parts", [])
            if isinstance(p, (ToolReturnPart, RetryPromptPart))
        ]

    def retried(self) -> list[Any]:
        """The errors sent back to the model (pydantic-ai 2.68: tool returns with outcome "retried")."""
        return [p for p in self.returns() if isinstance(p, RetryPromptPart) or getattr(p, "outcome", None) == "retried"]


async def test_a_model_that_calls_every_tool_leaves_the_expected_rows(store, paths):
    script = Script(
        [
            ("plan_read", {"item_id": "02"}),
            ("write_improvement_doc", {"plan_item": "01"}),
            ("write_improvement_doc", {"plan_item": "03"}),
            ("write_improvement_doc", {"plan_item": "04"}),
            (
                "todo_write",
                {
                    "todos": [
                        {"content": "baseline", "status": "in_progress", "priority": "high"},
                        {"content": "FP8 KV", "plan_item": "02"},
                    ]
                },
            ),
            ("todo_read", {}),
            ("write_improvement_doc", {"plan_item": "02"}),
            ("audit_flags", {}),
            ("launch_server", {"baseline": True}),
            ("server_status", {}),
            ("run_benchmark", {}),
            ("read_power", {}),
            ("server_metrics", {}),
            ("profile", {}),
            ("analyze", {}),
            ("stop_server", {}),
            ("run_experiments", {"experiments": [{"experiment_id": 1}]}),  # its second run, through the executor
            ("record_verdict", {"experiment_id": 1, "verdict": "baseline", "reason": "the reference"}),
            ("search_candidates", {}),
            ("microbench", {}),
            ("investigate", {"question": "What bounds the baseline?", "kind": "root_cause", "experiment_id": 1}),
            ("write_status_summary", {"question": "Go on with Tier 2?", "options": ["yes", "no"]}),
            ("ask_user", {"question": "Go on with Tier 2?", "options": ["yes", "no"]}),
        ]
    )
    with _session(store, paths) as s:
        outcome = await loop.run_async(s, model=FunctionModel(script))
    assert outcome.status == "pivot" and outcome.pivot is not None
    called = {step[0] for step in script.steps if not isinstance(step, str)}
    assert set(script.tools) <= called, f"tools nobody called: {set(script.tools) - called}"
    sid = s.id
    assert [t.content for t in store.todos(sid)] == ["baseline", "FP8 KV"]
    (e,) = store.experiments(sid)
    assert e.kind == "baseline" and e.verdict == "baseline" and e.status == "finished"
    run, again = store.bench_results(e.id)  # launch_server + run_benchmark, then run_experiments
    for r in (run, again):
        assert [lv.max_concurrency for lv in r.levels] == [1, 32, 128] and r.source == "simulated"
    assert again.placement is not None and again.placement.executor == "local"
    assert len(store.telemetry(e.id)) == 6
    assert store.findings(sid, experiment_id=e.id)  # analyze and profile recorded evidence
    docs = store.documents(sid)
    assert {d.kind for d in docs} == {"improvement", "status"}
    pivot = store.open_pivot(sid)
    assert pivot is not None and pivot.tool_call_id == "c23" and pivot.summary_path.endswith("status-001.md")
    assert store.servers(sid, running_only=True) == [] and s.live is None
    assert store.messages(sid)  # the conversation is in the ledger
    errors = script.retried()
    assert not errors, errors


async def test_bad_arguments_come_back_as_errors_and_the_model_recovers(store, paths):
    docs = [("write_improvement_doc", {"plan_item": i}) for i in ("01", "02", "03", "04")]
    script = Script(
        [
            *docs,
            ("launch_server", {"plan_item": "02"}),  # no baseline yet: refused with why
            ("launch_server", {"baseline": "yes please"}),  # not a bool: the schema says so
            ("launch_server", {"baseline": True}),
            ("run_benchmark", {"concurrency": [0]}),
            ("run_benchmark", {}),
            ("launch_server", {"experiment_id": 1}),  # the baseline's second run: its noise
            ("run_benchmark", {}),
            ("record_verdict", {"experiment_id": 1, "verdict": "adopted", "reason": "looks fast"}),
            ("record_verdict", {"experiment_id": 1, "verdict": "baseline", "reason": "the reference"}),
            ("record_verdict", {"plan_item": "02", "verdict": "ruled_out", "reason": "meh"}),  # its flags are fine
            ("record_verdict", {"plan_item": "01", "verdict": "ruled_out", "reason": "removed flag"}),
            "done",
        ]
    )
    with _session(store, paths) as s:
        outcome = await loop.run_async(s, model=FunctionModel(script))
    assert outcome.status in ("waiting", "finished") and outcome.message == "done"
    retries = script.retried()
    text = " | ".join(str(p.content) for p in retries)
    assert len(retries) == 5, text
    assert "baseline" in text and "bool" in text.lower() and "positive" in text and "is the baseline" in text
    assert "pass the audit" in text
    exps = store.experiments(s.id)
    assert [(e.kind, e.plan_item, e.verdict) for e in exps] == [
        ("baseline", None, "baseline"),
        ("change", "01", "ruled_out"),
    ]
    assert exps[1].failure == "unrecognized-argument" and store.bench_results(exps[1].id) == []


async def test_a_model_that_asks_the_user_is_resumed_with_the_answer(store, paths):
    script = Script(
        [
            ("ask_user", {"question": "Which tier first?", "options": ["Tier 1", "Tier 2"]}),
            "you said 2",
        ]
    )
    with _session(store, paths) as s:
        first = await loop.run_async(s, model=FunctionModel(script))
        assert first.status == "pivot" and first.pivot.question == "Which tier first?"
        assert store.get_session(s.id).status == "waiting"
        second = await loop.run_async(s, model=FunctionModel(script), answer="2")
    assert second.message == "you said 2"
    returns = [p for p in script.returns() if p not in script.retried()]
    assert returns[-1].tool_name == "ask_user" and returns[-1].content == "2"
    (pivot,) = store.pivots(s.id)
    assert pivot.answer == "2" and pivot.answered_at is not None
    history = loop.load_history(s)
    assert [msg.kind for msg in history][-2:] == ["request", "response"]


async def test_a_run_killed_while_a_tool_ran_is_resumed_with_an_interrupted_result(store, paths):
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    with _session(store, paths) as s:
        dangling = [
            ModelRequest(parts=[UserPromptPart("go")]),
            ModelResponse(parts=[ToolCallPart("launch_server", {"baseline": True}, tool_call_id="k1")]),
        ]
        store.append_messages(s.id, [loop._dump(x) for x in dangling])
        script = Script(["ok"])
        outcome = await loop.run_async(s, model=FunctionModel(script))
    assert outcome.message == "ok"
    (ret,) = [p for p in script.returns() if isinstance(p, ToolReturnPart)]
    assert ret.tool_call_id == "k1" and ret.content.startswith("interrupted")
    assert store.experiments(s.id) == []  # the interrupted call was not run again behind the model's back


async def test_pydantic_ais_test_model_can_drive_every_tool_without_breaking_the_ledger(store, paths):
    """TestModel calls every tool with made-up arguments: errors go back to it as retries; nothing is corrupted."""
    with _session(store, paths) as s:
        try:
            await loop.run_async(s, model=TestModel())
        except Exception as e:  # the made-up arguments may exhaust a tool's retries: that must be a clean error
            assert "retries" in str(e).lower() or "exceeded" in str(e).lower(), e
    assert store.get_session(s.id).plan.name == "written-in-a-test"
    assert store.servers(s.id, running_only=True) == []
    assert store.pivots(s.id) == []  # its question "a" is refused by the method: no pivot asks nonsense
    assert store.experiments(s.id) == []  # nor does anything launch before the documents


@pytest.fixture
def no_key(monkeypatch):
    for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)


def test_a_model_without_its_key_is_a_clear_error(store, paths, no_key):
    from agent.errors import PivotError

    with _session(store, paths) as s:
        s.record = s.record.model_copy(update={"model": "anthropic:claude-sonnet-4-5"})
        with pytest.raises(PivotError, match=r"API key|ANTHROPIC"):
            loop.resolve_model(s)
        s.record = s.record.model_copy(update={"model": "openai-chat:qwen", "model_base_url": "http://127.0.0.1:9/v1"})
        model = loop.resolve_model(s)
        assert type(model).__name__ == "GuardedModel" and model.model_name == "qwen"  # agent/model_limits.py
        assert type(model.wrapped).__name__ == "OpenAIChatModel"


async def test_a_pivot_asked_beside_another_tool_call_is_answered_in_place(store, paths):
    """An LLM may write the summary and ask in one response: the answer still resumes the deferred call."""
    from pydantic_ai import ModelResponse as Resp

    calls = iter(
        [
            Resp(
                parts=[
                    ToolCallPart("todo_read", {}, tool_call_id="a"),
                    ToolCallPart(
                        "ask_user", {"question": "Go on with Tier 2?", "options": ["yes", "no"]}, tool_call_id="b"
                    ),
                ]
            ),
            Resp(parts=[TextPart("went on")]),
        ]
    )
    seen: list[Any] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> Resp:
        seen.append(messages)
        return next(calls)

    with _session(store, paths) as s:
        first = await loop.run_async(s, model=FunctionModel(model))
        assert first.status == "pivot"
        second = await loop.run_async(s, model=FunctionModel(model), answer="yes")
    assert second.message == "went on"
    returns = {
        p.tool_call_id: p.content
        for msg in seen[-1]
        for p in getattr(msg, "parts", [])
        if isinstance(p, ToolReturnPart)
    }
    assert returns["b"] == "yes" and "a" in returns  # answered as the tool's result, the other call not run again
    assert len(store.pivots(s.id)) == 1
