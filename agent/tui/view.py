"""What the TUI shows, as plain data and text: tool calls in one line, the todo and experiment rows, the chat
entries of a stored conversation. No textual here, so every line of it can be tested without a terminal."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from agent import models as m

TODO_MARKS = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]", "cancelled": "[-]"}
HIDDEN_ARGS = ("todos", "options", "question", "reason", "hypothesis")
SPARK = "▁▂▃▄▅▆▇█"

EntryKind = Literal["user", "agent", "tool", "notice", "warning", "error"]


@dataclass
class Entry:
    """One item of the chat log: a message (Markdown), a tool call with its result (one line), or a notice."""

    kind: EntryKind
    text: str
    key: str | None = None  # a tool call's id, so its result can complete the line


@dataclass
class TodoRow:
    mark: str
    content: str
    priority: str


@dataclass
class ExperimentRow:
    id: str
    item: str
    change: str
    best: str
    verdict: str


@dataclass
class Board:
    """The side panel and the header of one session, read from the ledger."""

    session_id: str
    title: str
    status: str
    todos: list[TodoRow] = field(default_factory=list)
    experiments: list[ExperimentRow] = field(default_factory=list)
    pivot: m.Pivot | None = None
    summary_path: str | None = None


def short(text: str, width: int) -> str:
    """`text` on one line within `width`, cut at a word (a number is never cut into another: 2048 is not "20…")."""
    text = " ".join(str(text).split())
    if len(text) <= width:
        return text
    cut = text[: max(width - 1, 0)]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "…"


def _plain(content: Any) -> Any:
    """A tool's return value as JSON-like data: live results are models, stored ones are already dicts."""
    if isinstance(content, BaseModel):
        return content.model_dump(mode="json")
    if isinstance(content, list):
        return [_plain(c) for c in content]
    return content


def _args_text(args: dict[str, Any]) -> str:
    shown = [f"{k}={v}" for k, v in args.items() if k not in HIDDEN_ARGS and v not in (None, "", [], False)]
    return ", ".join(shown)


def _levels_text(levels: list[int]) -> str:
    if not levels:
        return ""
    return str(levels[0]) if len(levels) == 1 else f"{min(levels)}..{max(levels)}"


def call_text(tool: str, args: dict[str, Any] | None) -> str:
    """The call part of a tool line: the tool and the arguments that say what it works on."""
    args = args or {}
    if tool == "run_benchmark":
        return f"run_benchmark {_levels_text(sorted(args.get('concurrency') or []))}".rstrip()
    if tool == "launch_server" and args.get("baseline"):
        rest = _args_text({k: v for k, v in args.items() if k != "baseline"})
        return f"launch_server baseline{', ' + rest if rest else ''}"
    shown = _args_text(args)
    return f"{tool} {short(shown, 60)}" if shown else tool


def result_text(tool: str, content: Any) -> tuple[str | None, str]:
    """(a better call part, or None; the result in a few words) for a tool's return value."""
    data = _plain(content)
    if isinstance(data, str):
        first = data.strip().splitlines()[0] if data.strip() else "(empty)"
        if tool == "ask_user":
            return None, f"answer: {short(first, 80)}"
        return None, short(first, 100)
    if not isinstance(data, dict):
        return None, short(json.dumps(data, default=str), 100) if data is not None else "done"
    if tool == "run_benchmark" and data.get("levels"):
        levels = data["levels"]
        held = [lv for lv in levels if not lv.get("failed") and not lv.get("refused")] or levels
        top = max(held, key=lambda lv: lv.get("concurrency") or 0)  # the highest level that held, as it is judged
        text = f"{top['output_tok_s']:,.0f} tok/s at {top['concurrency']}"
        failed = [str(lv["concurrency"]) for lv in levels if lv.get("failed")]
        if failed:
            text += f"; failed at {', '.join(failed)} ({data.get('failure') or 'unknown'})"
        call = f"run_benchmark {_levels_text([lv['concurrency'] for lv in levels])}"
        return call, f"{text} (exp {data.get('experiment_id')} run {data.get('run')})"
    if tool == "launch_server" and "status" in data:
        eid = data.get("experiment_id")
        if data["status"] == "ready":
            noop = f"; no-op: {', '.join(data['noop_flags'])}" if data.get("noop_flags") else ""
            url = str(data.get("base_url") or "")
            at = f" at {url}" if url.startswith("http") else ""  # the in-process twin's sim:// says nothing
            return None, f"exp {eid} ready{at}{noop}"
        return None, f"exp {eid} {data['status']} ({data.get('failure') or 'unknown'})"
    if tool in ("stop_server", "server_status") and "running" in data:
        if data["running"]:
            return None, f"exp {data.get('experiment_id')} running at {data.get('base_url')}"
        return None, "no server running"
    if tool == "audit_flags" and "would_start" in data:
        if not data["would_start"]:
            bad = [f"{i.get('flag')}: {i.get('status')}" for i in data.get("issues", [])]
            return None, "refused: " + short("; ".join(bad), 80)
        noop = f" (no-op: {', '.join(data['noop_flags'])})" if data.get("noop_flags") else ""
        return None, f"ok{noop}"
    if tool == "record_verdict" and "verdict" in data:
        reason = str(data.get("reason", ""))
        if reason.startswith(f"{data['verdict'].replace('_', ' ')}: "):  # "not launched: ..." after "not launched"
            reason = reason.split(": ", 1)[1]
        return None, f"exp {data.get('experiment_id')}: {data['verdict']}: {short(reason, 80)}"
    if tool == "investigate" and "report" in data:  # an InvestigationReport: its first words, not its JSON
        return None, (
            f"investigation {data.get('investigation_id')} {data.get('status', '')}: {short(data['report'], 100)}"
        )
    if "path" in data and "status" in data:  # a DocumentRef: its file name (the folder is the session's)
        return None, f"{str(data['path']).rsplit('/', 1)[-1]} ({data['status']})"
    if "todos" in data and "pending" in data:  # a TodoList
        return None, (
            f"{len(data['todos'])} todos: {data.get('completed', 0)} done, "
            f"{data.get('in_progress', 0)} in progress, {data.get('pending', 0)} pending"
        )
    if tool == "analyze" and "bottleneck" in data:
        return None, f"exp {data.get('experiment_id')}: {data.get('bottleneck') or 'no verdict'}"
    if tool == "profile" and "share_pct" in data:
        shares = sorted(data["share_pct"].items(), key=lambda kv: -kv[1])
        return None, ", ".join(f"{k} {v:.0f}%" for k, v in shares[:3])
    if "gpus" in data and "source" in data:  # Telemetry
        watts = [g.get("power_w_mean") for g in data["gpus"] if g.get("power_w_mean") is not None]
        if watts:
            return None, f"{len(watts)} GPUs, {sum(watts) / len(watts):,.0f} W mean ({data['source']})"
        return None, f"no readings ({data.get('error') or data['source']})"
    return None, short(json.dumps(data, default=str), 100)


def tool_line(tool: str, args: dict[str, Any] | None, content: Any = None, *, done: bool = False) -> str:
    """One line for a tool call: 'run_benchmark 1..2048 -> best 2,095 tok/s at 2048 (exp 1 run 1)'."""
    call = call_text(tool, args)
    if not done:
        return f"{call} ..."
    better, result = result_text(tool, content)
    return f"{better or call} -> {result}"


def retry_text(content: Any) -> str:
    """A tool's retry prompt (bad arguments, a ModelRetry) in one line."""
    if isinstance(content, list):
        content = "; ".join(str(c.get("msg", c)) if isinstance(c, dict) else str(c) for c in content)
    return "retry: " + short(str(content), 100)


# ---------------------------------------------------------------------------------------------- the ledger


def board(store: Any, session_id: str) -> Board:
    """The session's todos, experiments (change, best output tok/s, verdict), open pivot and latest summary."""
    from tools.reports import Ledger

    ledger = Ledger.read(store, session_id)
    record = ledger.record
    todos = [TodoRow(TODO_MARKS.get(t.status, "[?]"), short(t.content, 40), t.priority) for t in store.todos(record.id)]
    experiments = [
        ExperimentRow(
            id=str(e.number),
            item=e.plan_item or e.kind,
            change=short(ledger.change_text(e), 28),
            best=ledger.figure_text(e),
            verdict=e.verdict or e.status,
        )
        for e in ledger.experiments
    ]
    status_docs = [d for d in ledger.documents if d.kind == "status"]
    latest = max(status_docs, key=lambda d: d.number or 0).path if status_docs else None
    t = record.plan.target
    title = f"{record.name} ({record.id}): {t.model} on {record.hardware_text}, engine {record.engine}"
    return Board(
        session_id=record.id,
        title=title,
        status=record.status,
        todos=todos,
        experiments=experiments,
        pivot=store.open_pivot(record.id),
        summary_path=latest,
    )


def pivot_markdown(pivot: m.Pivot, *, options: bool = False) -> str:
    """The question (and its numbered options), as the agent's message in the chat log; while the pivot is open
    its panel shows the options as buttons."""
    lines = [f"**Pivot:** {pivot.question}"]
    if options:
        lines += ["", *(f"{i}. {option}" for i, option in enumerate(pivot.options, start=1))]
    return "\n".join(lines)


def answer_text(pivot: m.Pivot | None, answer: str) -> str:
    """The user's answer as the chat log shows it: an option's number with the option's words."""
    if pivot is not None and answer.isdigit() and 1 <= int(answer) <= len(pivot.options):
        return f"**Answer {answer}:** {pivot.options[int(answer) - 1]}"
    return answer


UNFINISHED = {"ask_user": "asked: the question is below"}


def unfinished_text(tool: str, args: dict[str, Any] | None, *, cancelled: bool) -> str:
    """A tool line whose result never came: the pivot's question (a deferred call), or a step that ended."""
    why = UNFINISHED.get(tool) or ("cancelled" if cancelled else "no result")
    return f"{call_text(tool, args)} -> {why}"


def outcome_entry(status: str, message: str) -> Entry:
    """How a step ended, as a chat entry (a pivot is shown with its panel; this is everything else)."""
    if status in ("finished", "waiting"):
        return Entry("agent", message or f"({status})")
    if status == "failed":
        return Entry("error", message)
    return Entry("notice", message)


def history_entries(messages: list[Any], *, limit: int = 300) -> list[Entry]:
    """The chat log of a stored conversation (pydantic-ai messages): the user's prompts, the agent's text, and
    each tool call with its result in one line. The last `limit` entries."""
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    entries: list[Entry] = []
    calls: dict[str, tuple[int, str, dict[str, Any]]] = {}
    for message in messages:
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, TextPart) and part.content.strip():
                    entries.append(Entry("agent", part.content))
                elif isinstance(part, ToolCallPart):
                    args = part.args_as_dict() if part.args else {}
                    calls[part.tool_call_id] = (len(entries), part.tool_name, args)
                    entries.append(Entry("tool", tool_line(part.tool_name, args), key=part.tool_call_id))
        elif isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    entries.append(Entry("user", part.content))
                elif isinstance(part, ToolReturnPart) and part.tool_call_id in calls:
                    index, tool, args = calls[part.tool_call_id]
                    entries[index].text = tool_line(tool, args, part.content, done=True)
                elif isinstance(part, RetryPromptPart) and part.tool_call_id in calls:
                    index, tool, args = calls[part.tool_call_id]
                    entries[index].text = f"{call_text(tool, args)} -> {retry_text(part.content)}"
    return entries[-limit:]


# ---------------------------------------------------------------------------------------------- power


def sparkline(values: list[float], top: float | None = None) -> str:
    """Block characters for `values`, scaled to `top` (default: their maximum)."""
    if not values:
        return ""
    top = top or max(values) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, max(0, round(v / top * (len(SPARK) - 1))))] for v in values)


def power_readings(t: m.Telemetry | None) -> dict[int, tuple[float, float | None]]:
    """GPU index -> (watts, limit) from one telemetry reading (power mean over its window)."""
    if t is None:
        return {}
    return {g.gpu: (g.power_w_mean, g.power_limit_w) for g in t.gpus if g.power_w_mean is not None}
