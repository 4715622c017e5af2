"""What a model is sent each step: the method and the session's state (the instructions), and the recent exchanges;
older tool results become one-line digests and the oldest exchanges are left out. The ledger keeps every message
(nothing is removed from it) with each part within MAX_PART_CHARS (`cap_message`: a 10 MB tool call is kept as a
note of its size), and this shapes the request.

It is a pydantic-ai capability (`before_model_request`) that replaces the request's messages, not the run's
history, so the history persisted step by step stays whole. Tool calls and their results stay paired: the window
starts at a model response whose results follow it, and every call kept keeps its result (digested or whole).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel
from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext

RECENT = 6  # the last messages, sent whole (the last three steps with their results)
WINDOW = 24  # messages sent at most; older ones are in the ledger and summed up by the state in the instructions
DIGEST_CHARS = 160
ARGS_CHARS = 240


def _plain(content: Any) -> Any:
    if isinstance(content, BaseModel):
        return content.model_dump(mode="json", exclude_none=True)
    return content


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def digest(content: Any, limit: int = DIGEST_CHARS) -> str:
    """One line for a tool result: its scalar fields (a dict or model), its length (a list), or its first words."""
    value = _plain(content)
    if isinstance(value, dict):
        fields = []
        for k, v in value.items():
            if isinstance(v, (str, int, float, bool)) and v != "":
                fields.append(f"{k}={_short(str(v), 60)}")
            elif isinstance(v, list):
                fields.append(f"{k}: {len(v)}")
        text = ", ".join(fields)
    elif isinstance(value, list):
        text = f"{len(value)} items"
    else:
        text = str(value)
    return "(digest) " + _short(text, limit)


def _digest_args(part: ToolCallPart) -> ToolCallPart:
    args = part.args_as_dict() if part.args else {}
    if len(json.dumps(args, default=str)) <= ARGS_CHARS:
        return part
    small = {
        k: (v if isinstance(v, (int, float, bool)) or v is None else _short(json.dumps(v, default=str), 80))
        for k, v in args.items()
    }
    return replace(part, args=small)


def _digest_message(message: ModelMessage) -> ModelMessage:
    if isinstance(message, ModelResponse):
        parts: list[Any] = []
        for p in message.parts:
            if isinstance(p, ToolCallPart):
                parts.append(_digest_args(p))
            elif isinstance(p, TextPart):
                parts.append(replace(p, content=_short(p.content, 400)))
            else:
                parts.append(p)
        return replace(message, parts=parts)
    out: list[Any] = []
    for p in message.parts:
        if isinstance(p, ToolReturnPart) and getattr(p, "outcome", None) == "retried":
            out.append(replace(p, content=_short(str(p.content), 300)))  # a refusal: its reason, shortened
        elif isinstance(p, ToolReturnPart):
            out.append(replace(p, content=digest(p.content)))
        elif isinstance(p, RetryPromptPart):
            out.append(replace(p, content=_short(str(p.content), 300)))
        else:
            out.append(p)
    return replace(message, parts=out, instructions=None)  # a provider sends only the current instructions


MAX_PART_CHARS = 64 * 1024  # a tool call's arguments, a text, a tool result: kept and sent up to this size


def _cut(text: str, limit: int = MAX_PART_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit:,} characters cut by pivot]"


def cap_message(message: ModelMessage, limit: int = MAX_PART_CHARS) -> ModelMessage:
    """`message` with every part larger than `limit` cut down (a tool call's arguments replaced by a note of their
    size): what the ledger stores and a model is sent again, so a model that repeats a 10 MB call costs neither
    gigabytes of ledger nor megabytes per request. A message within the limit is returned as it is."""
    parts: list[Any] = []
    changed = False
    for p in message.parts:
        new = p
        if isinstance(p, ToolCallPart):
            size = len(p.args) if isinstance(p.args, str) else len(json.dumps(p.args or {}, default=str))
            if size > limit:
                new = replace(p, args={"cut_by_pivot": f"the arguments of this call were {size:,} characters"})
        elif isinstance(p, (TextPart, UserPromptPart)) and isinstance(p.content, str):
            if len(p.content) > limit:
                new = replace(p, content=_cut(p.content, limit))
        elif isinstance(p, RetryPromptPart):  # a validation error echoes the input it refused
            text = p.content if isinstance(p.content, str) else json.dumps(p.content, default=str)
            if len(text) > limit:
                new = replace(p, content=_cut(text, limit))
        elif isinstance(p, ToolReturnPart):
            text = p.content if isinstance(p.content, str) else json.dumps(_plain(p.content), default=str)
            if len(text) > limit:
                new = replace(p, content=_cut(text, limit))
        changed = changed or new is not p
        parts.append(new)
    return replace(message, parts=parts) if changed else message


def compact(messages: list[ModelMessage], *, recent: int = RECENT, window: int = WINDOW) -> list[ModelMessage]:
    """The messages to send: at most `window`, the last `recent` whole (each part within MAX_PART_CHARS), the
    others digested (see the docstring)."""
    messages = [cap_message(x) for x in messages]
    if len(messages) <= recent:
        return messages
    start = max(0, len(messages) - window)
    if start > 0:
        while start < len(messages) - recent and not isinstance(messages[start], ModelResponse):
            start += 1
    tail_at = len(messages) - recent
    kept = [_digest_message(x) if i < tail_at else x for i, x in enumerate(messages) if i >= start]
    if start == 0:
        return kept
    left_out = start
    first = next((p for x in messages for p in x.parts if isinstance(p, UserPromptPart)), None)
    opening = first.content if first is not None and isinstance(first.content, str) else "Work through the plan."
    note = (
        f"{opening}\n\n({left_out} earlier messages of this session are left out here; the ledger keeps them and "
        "the session's state in the instructions sums them up: the experiments, verdicts, pivots and answers.)"
    )
    answers = [
        p.content
        for x in messages[:start]
        for p in x.parts
        if isinstance(p, UserPromptPart) and isinstance(p.content, str) and p is not first
    ]
    if answers:
        note += "\nThe user's words so far: " + " | ".join(_short(a, 200) for a in answers[-5:])
    return [ModelRequest(parts=[UserPromptPart(note)]), *kept]


@dataclass
class CompactHistory(AbstractCapability[Any]):
    """Sends each request the compacted messages (the run's history itself is untouched)."""

    recent: int = RECENT
    window: int = WINDOW

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        request_context.messages = compact(list(request_context.messages), recent=self.recent, window=self.window)
        return request_context
