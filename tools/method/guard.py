"""The method's rules (RULES: the method as the model reads it) and MethodGuard: the rules enforced for every model
in one place, around every toolset of the agent. What is allowed is one value, the method's moves
(tools/method/moves.py): the guard refuses exactly what the moves do not contain, naming the moves that are
allowed, and shows the model only what they contain (tools that cannot be called now are hidden, and the plan
items, experiments and verdicts a tool may take are the only values its schema offers)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from agent.session import Session
from tools.method.checks import check
from tools.method.moves import Moves, baseline_runs_needed

Args = dict[str, Any]
Check = Callable[["Moves", Session, str, Args], "str | None"]

MIN_QUESTION_CHARS = 12
STEP_MEMBER = "__member_of_a_step"  # marks a run_experiments member checked by the launch rules
MIN_OPTIONS = 1


@dataclass(frozen=True)
class Rule:
    """One rule of the method: its text for the model, and how it is enforced (by the moves, a check here, a tool,
    or not at all)."""

    key: str
    text: str
    check: Check | None = None
    enforced_by: str | None = None

    @property
    def enforced(self) -> bool:
        return self.check is not None or self.enforced_by is not None


def _check_step(moves: Moves, session: Session, tool: str, args: Args) -> str | None:
    settings = moves.method.settings
    if tool == "launch_server" and settings.executor is not None and not args.get(STEP_MEMBER):
        return (
            f"this session's servers run on its executor ({settings.executor}), not in this process: "
            "run_experiments with this launch as its one member"
        )
    if tool != "run_experiments":
        return None
    members = [dict(x) for x in (args.get("experiments") or []) if isinstance(x, dict)]
    parallel = settings.parallel
    runs = sum(max(int(x.get("runs") or 1), 1) for x in members)
    if runs > parallel:
        return (
            f"{runs} runs in one step, but this session runs {parallel} at once (--parallel {parallel}): name at "
            f"most {parallel} (a member with runs=2 counts twice)"
        )
    seen: set[str] = set()
    for member in members:
        rerun = member.get("experiment_id")
        items = [f"experiment {moves.method.number(rerun) or rerun}"] if rerun is not None else [
            *(str(x) for x in member.get("plan_items") or []), *([str(member["plan_item"])] if member.get("plan_item") and not member.get("plan_items") else [])
        ]  # fmt: skip
        twice = [i for i in items if i in seen]
        if twice:
            return f"{', '.join(twice)} is named twice in one step: each member is its own experiment"
        seen.update(items)
    return None


def _check_question(moves: Moves, session: Session, tool: str, args: Args) -> str | None:
    if tool not in ("ask_user", "write_status_summary"):
        return None
    question = str(args.get("question") or "").strip()
    options = [str(o).strip() for o in (args.get("options") or []) if str(o).strip()]
    if len(question) < MIN_QUESTION_CHARS or len(question.split()) < 3:
        return (
            f"{question!r} is not a question the user can answer: say what was found (the numbers) and what to "
            f"decide, in at least three words and {MIN_QUESTION_CHARS} characters"
        )
    distinct = len({o.lower() for o in options}) == len(options)
    if tool == "ask_user" and (len(options) < MIN_OPTIONS or not distinct):
        return f"a pivot offers distinct options (what each would run, and 'stop'); got {options}"
    return None


MOVES = "moves"  # enforced by the method's moves (tools/method/moves.py)

RULES: list[Rule] = [
    Rule("todo", "Keep a todo list (todo_write) that follows the plan: read the plan with plan_read."),
    Rule(
        "step",
        "With an executor (pivot run --ray ADDRESS --parallel N) servers run on it, never through launch_server: "
        "run_experiments runs up to N experiments of one "
        "step at once, each one change on the best configuration (or a rerun by experiment_id), no item in two of "
        "them, runs=2 for a member's two runs at once (the baseline's noise, a change and its confirming run); each "
        "member obeys the rules of a launch. Judge the step when it is in: the largest gain first (it becomes "
        "the best); a gain it beat on the same base is recorded superseded; gains inside the noise are rerun "
        "together.",
        _check_step,
    ),
    Rule(
        "documents",
        "Write the improvement document of every plan item (write_improvement_doc) before the first experiment.",
        enforced_by=MOVES,
    ),
    Rule(
        "baseline",
        "Measure a baseline first (launch_server baseline=True, without flags; run_benchmark), then rerun it "
        "(launch_server with its experiment_id, run_benchmark): the runs measure the noise (twice the standard "
        "error of their mean; when that band is too wide to tell the plan's changes apart, the method asks for up "
        "to two more runs); record_verdict verdict=baseline. No change is launched before. An item that changes the "
        "workload gets its own baseline on it (baseline=True with that plan_item).",
        enforced_by=MOVES,
    ),
    Rule(
        "judge_first",
        "Record the verdict of every measured experiment (or rerun it when its judgement asks) before the next "
        "launch: the best configuration the next change builds on depends on it.",
        enforced_by=MOVES,
    ),
    Rule(
        "released",
        "Work only on items of the released tiers (the first tier at the start; the next one when the user "
        "answers 'continue' at the pivot that closed the last one) and on items the user asked for at a pivot; "
        "after 'stop', only items asked for since.",
        enforced_by=MOVES,
    ),
    Rule(
        "one_change",
        "One change at a time, on top of the best configuration so far: launch_server with plan_item (or "
        "plan_items for a combined step of several items), without extra flags; rerun an experiment with its "
        "experiment_id; nothing measured is launched again as a new experiment. Take an adopted item back with "
        "revert_items (the best configuration rebuilt from its adopted changes without it) when a later change "
        "made it a brake. The one exception to no extra flags: after an item crashed under load, retry it once "
        "capped, flags='--max-running-requests N' below the first level that failed. audit_flags first; if the "
        "engine would refuse the flags, record_verdict with plan_item and verdict ruled_out, without launching. If "
        "the engine is simulated and does not model the flags the item changes, record_verdict with plan_item and "
        "verdict not_measured, without launching (its numbers could not show the change: it needs a GPU). A code "
        "item is documented for the user; there is nothing to run.",
        enforced_by=MOVES,
    ),
    Rule(
        "verdict",
        "Record each verdict by the numbers run_benchmark returns (its judgement permits exactly one): adopted only "
        "beyond the noise band, a gain inside it rerun before it is called no_gain, regressed beyond the band the "
        "other way, crashed with the classified reason; name no-op flags in the reason. The change judged is the "
        "measured one, or, when the twin predicted it before launch and its errors on this campaign's measured "
        "changes stay under the band, the measured and the predicted change weighted by their precision (the "
        "judgement gives both numbers: put them in the reason; a document shows the measured change). "
        "stop_server after each.",
        enforced_by=MOVES,
    ),
    Rule(
        "profile",
        "A profile item: launch_server with that plan_item (the best configuration), run_benchmark, profile, "
        "stop_server, record_verdict measured.",
    ),
    Rule("docs_after", "After each verdict bring the item's document up to date (write_improvement_doc)."),
    Rule(
        "pivot_after_tier",
        "When the open tiers' work is done, stop at a pivot before anything else: write_status_summary with a "
        "question and numbered options, then ask_user with the same (that pivot closes those tiers). Stop at a "
        "pivot too after several changes in a row without gain, after a promising item crashed, and after a "
        "benchmark the server refused. Do what the answer says.",
        enforced_by=MOVES,
    ),
    Rule(
        "question",
        "A pivot's question says what was found and what to decide (three words at least); ask_user offers "
        "distinct numbered options, each saying what pivot would do (and 'stop').",
        _check_question,
    ),
    Rule(
        "finish",
        "When nothing is left to do in the opened tiers or the user said stop, write a final status summary and "
        "end with a short message; the method decides from the ledger whether the campaign is finished.",
        enforced_by=MOVES,
    ),
]


GUARDED_TOOLS = frozenset({"launch_server", "run_experiments", "record_verdict", "ask_user", "write_status_summary"})


def method_text() -> str:
    """The method as numbered rules, for the model's instructions (enforced ones marked)."""
    lines = []
    for i, rule in enumerate(RULES, start=1):
        mark = " [enforced]" if rule.enforced else ""
        lines.append(f"{i}. {rule.text}{mark}")
    return "\n".join(lines)


def refusal(session: Session, tool: str, args: Args, moves: Moves | None = None) -> str | None:
    """Why the method refuses this call, or None when it may run: the rule's checks, then the moves (read from the
    ledger afresh unless given)."""
    if tool not in GUARDED_TOOLS:
        return None  # reads and measurements of a running server change nothing the method rules on
    from tools.method.compute import moves_of  # the computation sits above the package this guard is exported from

    mv = moves or moves_of(session)
    calls = [(tool, args)]
    if tool == "run_experiments":  # the step's shape, then every member as the launch it stands for
        calls += [
            ("launch_server", {**x, STEP_MEMBER: True}) for x in (args.get("experiments") or []) if isinstance(x, dict)
        ]
    for name, call_args in calls:
        for rule in RULES:
            why = rule.check(mv, session, name, call_args) if rule.check is not None else None
            if why is not None:
                return f"refused by the method ({rule.key}): {why}"
        refused = check(mv, name, {k: v for k, v in call_args.items() if k != STEP_MEMBER})
        if refused is not None:
            return refused.text()
    return None


# ---- what the model sees: only the tools and the values the moves allow


def _enum(schema: dict[str, Any], values: list[Any]) -> dict[str, Any]:
    """`schema` (a property's) with its string, integer and array-of-those parts limited to `values`."""
    out = copy.deepcopy(schema)

    def limit(node: dict[str, Any]) -> None:
        kind = node.get("type")
        if kind in ("string", "integer"):
            node["enum"] = values
        elif kind == "array" and isinstance(node.get("items"), dict):
            limit(node["items"])
        for sub in node.get("anyOf", []):
            if isinstance(sub, dict):
                limit(sub)

    limit(out)
    return out


def _closed(tool_def: Any, moves: Moves, why: str) -> Any:
    """A tool that cannot be called now: no parameters to fill, and a description that says why and what can."""
    allowed = "; ".join(moves.allowed_text()) or "reads and documents"
    return replace(
        tool_def,
        parameters_json_schema={"type": "object", "properties": {}, "additionalProperties": True},
        description=f"NOT ALLOWED NOW: {why}. Allowed now: {allowed}.\n\n{tool_def.description or ''}",
    )


def _numbers(moves: Moves, experiment_ids: Any) -> list[int]:
    """The session's numbers of these experiments (ledger ids): the values a model may give (tools/numbering.py
    turns them back into ids before the guard reads them)."""
    return sorted(moves.method.number(i) or i for i in experiment_ids)


def _restrict(tool_def: Any, moves: Moves, executor: bool) -> Any:
    """The tool's definition as the moves allow it now: the plan items, experiments and verdicts it may take as
    the only values of its schema; a tool that cannot be called now says so (and why) and takes nothing."""
    name = tool_def.name
    schema = copy.deepcopy(tool_def.parameters_json_schema)
    props: dict[str, Any] = schema.get("properties", {})
    limits: dict[str, list[Any]] = {}
    if name == "launch_server":
        if executor:
            return _closed(tool_def, moves, "this session's servers run on its executor: use run_experiments")
        if not moves.launches:
            return _closed(tool_def, moves, moves.why or "no launch is among the moves")
        limits = {
            "plan_item": sorted(moves.items | moves.profiles | set(moves.retries) | moves.workload_baselines),
            "plan_items": sorted(moves.items) if len(moves.items) > 1 else [],
            "experiment_id": _numbers(moves, moves.reruns),
            "revert_items": sorted(moves.reverts),
        }
        if not (moves.baseline or moves.workload_baselines):
            props.pop("baseline", None)
        if not moves.retries:
            props.pop("flags", None)
        props.pop("remove_flags", None)
    elif name == "run_experiments":
        if not moves.launches:
            return _closed(tool_def, moves, moves.why or "no launch is among the moves")
    elif name == "record_verdict":
        if not (moves.verdicts or moves.settle):
            return _closed(tool_def, moves, moves.why or "no verdict is waiting")
        verdicts = {v for vs in moves.verdicts.values() for v in vs} | {v for vs in moves.settle.values() for v in vs}
        limits = {
            "experiment_id": _numbers(moves, moves.verdicts),
            "plan_item": sorted(moves.settle),
            "verdict": sorted(verdicts),
        }
    else:
        return tool_def
    for key, values in limits.items():
        if key not in props:
            continue
        if values:
            props[key] = _enum(props[key], values)
        else:
            props.pop(key)
    if "required" in schema:
        schema["required"] = [k for k in schema["required"] if k in props]
    allowed = "; ".join(line for line in moves.allowed_text() if line.startswith(name))
    description = (tool_def.description or "") + (f"\n\nAllowed now: {allowed}." if allowed else "")
    return replace(tool_def, parameters_json_schema=schema, description=description)


_STEP: dict[str, tuple[tuple, Moves]] = {}  # session id -> (run and step, its moves): one reading per step


def _step_moves(ctx: RunContext[Session]) -> Moves:
    """The moves for this step of the run, read once for all the toolsets the model is shown."""
    key = (ctx.run_id, ctx.run_step, len(ctx.messages))
    hit = _STEP.get(ctx.deps.id)
    if hit is not None and hit[0] == key and ctx.run_id is not None:
        return hit[1]
    from tools.method.compute import moves_of

    moves = moves_of(ctx.deps)
    _STEP[ctx.deps.id] = (key, moves)
    if len(_STEP) > 32:
        _STEP.pop(next(iter(_STEP)))
    return moves


@dataclass
class MethodGuard(WrapperToolset[Session]):
    """Wraps a toolset: the model sees the guarded tools as the method's moves allow them now (the values they may
    take; a tool that cannot be called says why and takes nothing), and every call goes through the moves first; a
    call that is not among them is refused as a retry that names the rule and the moves allowed, and the tool never
    runs."""

    async def get_tools(self, ctx: RunContext[Session]) -> dict[str, ToolsetTool[Session]]:
        tools = await super().get_tools(ctx)
        if not any(name in GUARDED_TOOLS for name in tools):
            return tools
        moves = _step_moves(ctx)
        executor = ctx.deps.settings.executor is not None
        out: dict[str, ToolsetTool[Session]] = {}
        for name, tool in tools.items():
            view = _restrict(tool.tool_def, moves, executor)
            out[name] = replace(tool, tool_def=view) if view is not tool.tool_def else tool
        return out

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Session], tool: ToolsetTool[Session]
    ) -> Any:
        why = refusal(ctx.deps, name, tool_args)
        if why is not None:
            ctx.deps.emit("warning", f"{name}: {why}")
            raise ModelRetry(why)
        return await super().call_tool(name, tool_args, ctx, tool)


__all__ = ["GUARDED_TOOLS", "RULES", "MethodGuard", "Rule", "baseline_runs_needed", "method_text", "refusal"]
