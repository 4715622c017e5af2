"""What a model is sent (agent/context.py): recent steps whole, older results digested, calls and results paired."""

from __future__ import annotations

from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from agent.context import compact, digest


def history(steps: int) -> list:
    out: list = [ModelRequest(parts=[UserPromptPart("Work through the plan.")])]
    for i in range(steps):
        out.append(ModelResponse(parts=[ToolCallPart("todo_write", {"todos": ["x" * 50] * 40}, tool_call_id=f"c{i}")]))
        if i == steps - 6:  # a refusal inside the window, before the recent steps
            refusal = ToolReturnPart("todo_write", "refused: " + "y" * 900, tool_call_id=f"c{i}", outcome="retried")
            out.append(ModelRequest(parts=[refusal]))
        else:
            out.append(
                ModelRequest(
                    parts=[ToolReturnPart("todo_write", {"n": i, "rows": list(range(300))}, tool_call_id=f"c{i}")]
                )
            )
        if i == 3:
            out[-1].parts.append(UserPromptPart("the user's answer: 1"))
    return out


def paired(messages: list) -> bool:
    """Every call kept has its result in the next message, and every result answers a call of the previous one."""
    for i, msg in enumerate(messages):
        if isinstance(msg, ModelResponse):
            calls = {p.tool_call_id for p in msg.parts if isinstance(p, ToolCallPart)}
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            got = {getattr(p, "tool_call_id", None) for p in (nxt.parts if nxt else [])}
            if not calls <= got:
                return False
        elif i > 0:
            prev = messages[i - 1]
            calls = {p.tool_call_id for p in prev.parts if isinstance(p, ToolCallPart)}
            results = {p.tool_call_id for p in msg.parts if isinstance(p, (ToolReturnPart, RetryPromptPart))}
            if not results <= calls:
                return False
    return True


def test_a_short_history_is_sent_as_it_is():
    h = history(2)
    assert compact(h, recent=6, window=24) == h


def test_a_long_history_is_windowed_digested_and_still_paired():
    h = history(40)
    before = [repr(x) for x in h]
    sent = compact(h, recent=6, window=24)
    assert [repr(x) for x in h] == before  # the history itself is untouched
    assert isinstance(sent[0], ModelRequest) and isinstance(sent[1], ModelResponse)
    assert "earlier messages of this session are left out" in sent[0].parts[0].content
    assert "the user's answer: 1" in sent[0].parts[0].content  # the user's words are not lost
    assert len(sent) <= 1 + 24 and sent[-6:] == h[-6:]  # the recent steps whole, the last request itself
    assert paired(sent)
    older = [p for x in sent[1:-6] for p in x.parts if isinstance(p, ToolReturnPart)]
    assert older and all(len(str(p.content)) <= 300 for p in older)
    digested = [p for p in older if p.outcome != "retried"]
    assert all(str(p.content).startswith("(digest) ") for p in digested) and len(digested) < len(older)
    assert any(p.outcome == "retried" and str(p.content).startswith("refused: ") for p in older)
    assert len(repr(sent)) < len(repr(h)) / 5


def test_every_window_start_keeps_the_pairs():
    h = history(30)
    for window in range(7, 40):
        assert paired(compact(h, recent=6, window=window)), window


def test_a_digest_is_one_line_of_scalars():
    text = digest({"experiment_id": 3, "status": "ready", "config": "--tp-size 8", "issues": [1, 2], "deep": {"a": 1}})
    assert text == "(digest) experiment_id=3, status=ready, config=--tp-size 8, issues: 2"
