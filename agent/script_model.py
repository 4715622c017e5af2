"""The scripted model: `--model script:FILE.jsonl` replays a file of steps, one per model response.

Each line of the file is one response: `{"tool": NAME, "args": {...}}` calls a tool, `{"text": "..."}` is a final
answer. Tool results (and the method's refusals) are recorded in the ledger as for any model, and the next line
is the next response whatever they said. When the file ends, the run ends with a final answer saying so (the
session stays resumable). Resuming with the same file goes on from the line after the last one replayed: the
responses this file already gave are counted in the ledger.

For users, a scripted session is a reproducible way to drive pivot step by step; for tests, a way to make any call
a model could make and check what the method does with it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic_ai import ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent.errors import PivotError
from agent.session import Session

PREFIX = "script:"
MAX_SCRIPT_BYTES = 64 * 2**20  # a script is steps a person or a test wrote, not a dump


def parse_steps(path: Path) -> list[dict[str, Any]]:
    """The file's steps, checked: every line a JSON object with `tool` (and optional `args`) or `text`."""
    hint = 'a script is JSON lines: {"tool": NAME, "args": {...}} or {"text": "..."}'
    try:
        if path.stat().st_size > MAX_SCRIPT_BYTES:
            raise PivotError(f"the script {path} is larger than {MAX_SCRIPT_BYTES // 2**20} MiB", hint=hint)
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise PivotError(f"cannot read the script {path}: {e.strerror or e}", hint="--model script:FILE.jsonl") from e
    except UnicodeDecodeError as e:
        raise PivotError(f"the script {path} is not UTF-8 text (byte {e.start}: {e.reason})", hint=hint) from e
    steps: list[dict[str, Any]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            step = json.loads(line)
        except RecursionError as e:
            raise PivotError(f"{path}:{n}: nested too deeply to be a step", hint=hint) from e
        except ValueError as e:
            raise PivotError(
                f"{path}:{n}: not JSON: {e}", hint='each line: {"tool": NAME, "args": {...}} or {"text": "..."}'
            ) from e
        if not isinstance(step, dict) or not (isinstance(step.get("tool"), str) or isinstance(step.get("text"), str)):
            raise PivotError(
                f"{path}:{n}: a step is an object with 'tool' (a name) or 'text'",
                hint='each line: {"tool": NAME, "args": {...}} or {"text": "..."}',
            )
        if "tool" in step and not isinstance(step.get("args", {}), dict):
            raise PivotError(f"{path}:{n}: 'args' must be an object")
        steps.append(step)
    return steps


def script_path(name: str) -> Path:
    return Path(name[len(PREFIX) :]).expanduser()


class ScriptModel:
    """Replays a script's steps behind pydantic-ai's FunctionModel (see the module docstring)."""

    def __init__(self, name: str, session: Session | None = None) -> None:
        self.path = script_path(name)
        self.steps = parse_steps(self.path)
        self.model_name = f"{PREFIX}{self.path.name}"
        self.position = _replayed(session, self.model_name) if session is not None else 0

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self.respond, model_name=self.model_name)

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = self.position
        self.position += 1
        if n >= len(self.steps):
            return ModelResponse(parts=[TextPart(f"The script {self.path.name} ended after {len(self.steps)} steps.")])
        step = self.steps[n]
        if "tool" not in step:
            return ModelResponse(parts=[TextPart(str(step["text"]))])
        args = step.get("args") or {}
        call_id = "script-" + hashlib.sha256(f"{self.model_name}:{n}".encode()).hexdigest()[:12]
        return ModelResponse(parts=[ToolCallPart(step["tool"], args, tool_call_id=call_id)])


def _replayed(session: Session, model_name: str) -> int:
    """How many responses this script already gave in the session (its next step is the one after)."""
    count = 0
    for text in session.store.messages(session.id):
        if '"model_name"' not in text or model_name not in text:
            continue
        for message in ModelMessagesTypeAdapter.validate_json("[" + text + "]"):
            if isinstance(message, ModelResponse) and message.model_name == model_name:
                count += 1
    return count
