"""The todo toolset driven through a real pydantic-ai agent run, asserting on the ledger."""

from __future__ import annotations

from pydantic_ai import Agent, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent.session import Session
from tools.todo import toolset


def _agent(script):
    return Agent(FunctionModel(script), deps_type=Session, toolsets=[toolset])


def _returns(messages):
    return [p for p in messages[-1].parts if p.part_kind in ("tool-return", "retry-prompt")]


def test_model_writes_and_reads_the_todo_list(store, paths, small_plan):
    def script(messages, info: AgentInfo) -> ModelResponse:
        step = sum(msg.kind == "response" for msg in messages)
        if step == 0:
            assert {t.name for t in info.function_tools} == {"todo_read", "todo_write", "plan_read"}
            todos = [
                {"content": "Write improvement docs 01-02", "status": "in_progress", "priority": "medium"},
                {"content": "Baseline", "priority": "high"},
                {"content": "Try 01", "priority": "high", "plan_item": "01"},
            ]
            return ModelResponse(parts=[ToolCallPart("todo_write", {"todos": todos}), ToolCallPart("plan_read", {})])
        if step == 1:
            (ret, plan_ret) = _returns(messages)
            assert ret.content.pending == 2 and ret.content.in_progress == 1
            assert plan_ret.content.name == "small"
            return ModelResponse(parts=[ToolCallPart("plan_read", {"item_id": "02"}), ToolCallPart("todo_read", {})])
        (item, todos) = _returns(messages)
        assert item.content.kind == "code"
        return ModelResponse(parts=[TextPart(f"{len(todos.content.todos)} todos")])

    with Session.create(store, paths, small_plan, engine_name="sim") as session:
        result = _agent(script).run_sync("plan the work", deps=session)
        assert result.output == "3 todos"
        stored = store.todos(session.id)
    assert [(t.content, t.status, t.priority, t.plan_item) for t in stored] == [
        ("Write improvement docs 01-02", "in_progress", "medium", None),
        ("Baseline", "pending", "high", None),
        ("Try 01", "pending", "high", "01"),
    ]


def test_bad_arguments_come_back_to_the_model_which_recovers(store, paths, small_plan):
    seen = []

    def script(messages, info: AgentInfo) -> ModelResponse:
        step = sum(msg.kind == "response" for msg in messages)
        if step == 0:  # two in progress, and a status that does not exist
            return ModelResponse(
                parts=[
                    ToolCallPart(
                        "todo_write",
                        {
                            "todos": [
                                {"content": "a", "status": "in_progress"},
                                {"content": "b", "status": "in_progress"},
                            ]
                        },
                    )
                ]
            )
        if step == 1:
            seen.append(str(_returns(messages)[0].content))
            return ModelResponse(parts=[ToolCallPart("todo_write", {"todos": [{"content": "a", "status": "doing"}]})])
        if step == 2:
            seen.append(str(_returns(messages)[0].content))
            return ModelResponse(
                parts=[
                    ToolCallPart(
                        "todo_write", {"todos": [{"content": "a", "status": "in_progress", "plan_item": "07"}]}
                    )
                ]
            )
        if step == 3:
            seen.append(str(_returns(messages)[0].content))
            return ModelResponse(
                parts=[ToolCallPart("todo_write", {"todos": [{"content": "a", "status": "in_progress"}]})]
            )
        return ModelResponse(parts=[TextPart("ok")])

    with Session.create(store, paths, small_plan, engine_name="sim") as session:
        assert _agent(script).run_sync("go", deps=session).output == "ok"
        assert [(t.content, t.status) for t in store.todos(session.id)] == [("a", "in_progress")]
    assert "keep at most one" in seen[0]
    assert "status" in seen[1] and "in_progress" in seen[1]
    assert "unknown plan item(s) 07" in seen[2]
