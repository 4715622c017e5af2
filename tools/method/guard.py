"""The method's rules (RULES), one check per rule, and MethodGuard: the rules enforced for every model in one
place, around every toolset of the agent; method_text() is the method as the model reads it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from agent.session import Session
from tools.method.reading import (
    Decision,
    Method,
)

# ---- the guard: the method's rules, enforced for every model in one place
#
# RULES is the method as the model reads it (agent/loop.py builds its METHOD text from these) and as MethodGuard
# enforces it: a rule with a `check` refuses a tool call that breaks it before the tool runs (so a refused call
# leaves no experiment, no server and no verdict behind), with the reason and the numbers as a retry for the
# model. A rule `enforced_by` a tool is checked inside that tool (record_verdict judges the numbers itself).

Args = dict[str, Any]
Check = Callable[["Method", Session, str, Args], "str | None"]

MIN_QUESTION_CHARS = 12
STEP_MEMBER = "__member_of_a_step"  # marks a run_experiments member checked by the launch rules
MIN_OPTIONS = 1


@dataclass(frozen=True)
class Rule:
    """One rule of the method: its text for the model, and how it is enforced (a check here, a tool, or not)."""

    key: str
    text: str
    check: Check | None = None
    enforced_by: str | None = None

    @property
    def enforced(self) -> bool:
        return self.check is not None or self.enforced_by is not None


def baseline_runs_needed(method: Method) -> int:
    """Runs of a baseline before any change is measured against it: two at least (their spread is the noise)."""
    return max(2, 1 + method.settings.reruns)


def _launch_items(method: Method, args: Args) -> list[str]:
    items = [str(x) for x in (args.get("plan_items") or [])]
    if not items and args.get("plan_item") is not None:
        items = [str(args["plan_item"])]
    return [i for i in items if i in method.plan.item_ids()]


def _is_rerun(args: Args) -> bool:
    return args.get("experiment_id") is not None


def _new_experiment(tool: str, args: Args) -> bool:
    """Whether the call records a new experiment: a launch that is not a rerun, or an item ruled out by id."""
    if tool == "launch_server":
        return not _is_rerun(args)
    return tool == "record_verdict" and args.get("experiment_id") is None and args.get("plan_item") is not None


def _check_documents(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if not _new_experiment(tool, args):
        return None
    written = {d.plan_item for d in session.store.documents(session.id) if d.kind == "improvement"}
    missing = [i for i in method.plan.item_ids() if i not in written]
    if not missing:
        return None
    return (
        f"write the improvement documents before the first experiment: {len(missing)} of "
        f"{len(method.plan.items)} missing ({', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''}); "
        "call write_improvement_doc for each"
    )


def _check_baseline_rerun(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if tool != "launch_server" or _is_rerun(args) or args.get("baseline"):
        return None
    items = _launch_items(method, args)
    workload = method.plan.item(items[0]).workload_for(method.plan.workload) if items else method.plan.workload
    base = method.baseline(workload)
    need = baseline_runs_needed(method)
    if base is None or method.run_count(base) == 0:
        how = f"baseline=True and plan_item={items[0]!r}" if items and method.plan.item(items[0]).workload else ""
        return (
            "measure the baseline first (launch_server with "
            + (how or "baseline=True")
            + ", run_benchmark), then rerun it (launch_server with its experiment_id, run_benchmark)"
        )
    runs = method.run_count(base)
    if runs < need:
        return (
            f"the baseline (experiment {base.id}) has {runs} run of the {need} that measure the noise: rerun it "
            f"first (launch_server experiment_id={base.id}, run_benchmark), then record_verdict verdict=baseline"
        )
    return None


def _allowed_items(method: Method, d: Decision) -> tuple[set[str], str]:
    """The items a step may name now, and why those."""
    plan = method.plan
    asked = {i for i, since in d.requested if d.stopped_at is None or since > d.stopped_at}
    if d.stopped_at is not None:
        return asked, "the user answered stop" + (f"; asked for since: {', '.join(sorted(asked))}" if asked else "")
    released = {it.id for it in plan.items if it.tier in d.released}
    tiers = ", ".join(str(t) for t in sorted(d.released))
    return released | asked, f"released tiers: {tiers}" + (f"; asked for: {', '.join(sorted(asked))}" if asked else "")


def _check_released(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if tool not in ("launch_server", "record_verdict") or not _new_experiment(tool, args):
        return None
    if tool == "launch_server" and args.get("baseline") and not _launch_items(method, args):
        return None  # the plan's own baseline
    items = _launch_items(method, args) if tool == "launch_server" else [str(args.get("plan_item"))]
    d = method.decision()
    allowed, why = _allowed_items(method, d)
    blocked = [i for i in items if i not in allowed]
    if not blocked:
        return None
    tiers = ", ".join(f"{i} (tier {method.plan.item(i).tier})" for i in blocked if i in method.plan.item_ids())
    return (
        f"item {tiers or ', '.join(blocked)} is not released: {why}. Only the user's answer at a pivot releases "
        "the next tier or asks for an item (write_status_summary, then ask_user)"
    )


def _parse_retry_flags(flags: str) -> int | None:
    found = re.fullmatch(r"\s*--max-running-requests(?:\s+|=)(\d+)\s*", flags or "")
    return int(found.group(1)) if found else None


def _check_one_change(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if tool != "launch_server" or _is_rerun(args):
        return None
    flags, remove = args.get("flags"), args.get("remove_flags")
    if args.get("baseline"):
        if flags or remove:
            return "a baseline runs the plan's base flags as they are: launch_server baseline=True without flags"
        return None
    items = _launch_items(method, args)
    named = [str(x) for x in (args.get("plan_items") or [])] or (
        [str(args["plan_item"])] if args.get("plan_item") else []
    )
    unknown = [i for i in named if i not in method.plan.item_ids()]
    if unknown:
        return f"no plan item {', '.join(unknown)}; items: {', '.join(method.plan.item_ids())}"
    if not items:
        return (
            "a change is a plan item on top of the best configuration: name it (plan_item, or plan_items for a "
            "combined step); extra flags alone are not a step of the plan"
        )
    code = [i for i in items if method.plan.item(i).kind == "code"]
    if code:
        return f"item {', '.join(code)} is a code change for the user: its document says what; there is nothing to run"
    if remove:
        return (
            f"launch the best configuration plus item {', '.join(items)} as the plan writes it: remove_flags "
            f"{remove} is a change of its own"
        )
    if not flags:
        return None
    n = _parse_retry_flags(flags)
    last = next((e for e in reversed(method.experiments) if e.plan_items == items and e.kind == "change"), None)
    failed = method.failed_levels(last) if last is not None else []
    if n is None or last is None or not failed:
        return (
            f"one change at a time: the step is the best configuration ({method.best_config()}) plus item "
            f"{', '.join(items)}; extra flags {flags!r} are refused. The one exception: after the item crashed "
            "under load, flags='--max-running-requests N' below the first level that failed"
        )
    if not 1 <= n < min(failed):
        return (
            f"the bounded retry of item {', '.join(items)} caps --max-running-requests below {min(failed)}, the "
            f"first level that failed in experiment {last.id} (failed at {', '.join(map(str, failed))}); got {n}"
        )
    return None


def _check_step(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if tool == "launch_server" and method.settings.executor is not None and not args.get(STEP_MEMBER):
        return (
            f"this session's servers run on its executor ({method.settings.executor}), not in this process: "
            "run_experiments with this launch as its one member"
        )
    if tool != "run_experiments":
        return None
    members = [dict(x) for x in (args.get("experiments") or []) if isinstance(x, dict)]
    parallel = method.settings.parallel
    runs = sum(max(int(x.get("runs") or 1), 1) for x in members)
    if runs > parallel:
        return (
            f"{runs} runs in one step, but this session runs {parallel} at once (--parallel {parallel}): name at "
            f"most {parallel} (a member with runs=2 counts twice)"
        )
    seen: set[str] = set()
    for member in members:
        rerun = member.get("experiment_id")
        items = [f"experiment {rerun}"] if rerun is not None else _launch_items(method, member)
        twice = [i for i in items if i in seen]
        if twice:
            return f"{', '.join(twice)} is named twice in one step: each member is its own experiment"
        seen.update(items)
    return None


def _tier_finished_at(method: Method, tier: int) -> datetime | None:
    """When the tier's last item was settled, if every item of it is done (None otherwise, or with nothing run)."""
    items = method.plan.tier_items(tier)
    if not items or not all(method.done(it) for it in items):
        return None
    times = [e.finished_at or e.created_at for it in items for e in method.final(it)]
    return max(times) if times else None


def _check_pivot_after_tier(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if not _new_experiment(tool, args):
        return None
    if tool == "launch_server" and args.get("baseline") and not _launch_items(method, args):
        return None
    items = _launch_items(method, args) if tool == "launch_server" else [str(args.get("plan_item"))]
    tiers_of_step = {method.plan.item(i).tier for i in items if i in method.plan.item_ids()}
    last_pivot = max((p.asked_at for p in method.pivots), default=None)
    d = method.decision()
    for tier in sorted(d.released):
        at = _tier_finished_at(method, tier)
        if at is None or (last_pivot is not None and at <= last_pivot) or tiers_of_step <= {tier}:
            continue  # not finished, or asked about since, or a retest within the tier itself
        name = method.plan.tiers.get(tier, "")
        return (
            f"Tier {tier}{f' ({name})' if name else ''} is finished: stop at a pivot before an item of another "
            f"tier ({', '.join(items)}): write_status_summary with a question and options, then ask_user with the "
            "same"
        )
    return None


def _check_question(method: Method, session: Session, tool: str, args: Args) -> str | None:
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
        _check_documents,
    ),
    Rule(
        "baseline",
        "Measure a baseline first (launch_server baseline=True, without flags; run_benchmark), then rerun it "
        "(launch_server with its experiment_id, run_benchmark): the spread between the runs is the measured noise; "
        "record_verdict verdict=baseline. No change is launched before the rerun. An item that changes the "
        "workload gets its own baseline on it (baseline=True with that plan_item).",
        _check_baseline_rerun,
    ),
    Rule(
        "released",
        "Work only on items of the released tiers (the first tier at the start; the next one when the user "
        "answers 'continue' after a finished tier) and on items the user asked for at a pivot; after 'stop', "
        "only items asked for since.",
        _check_released,
    ),
    Rule(
        "one_change",
        "One change at a time, on top of the best configuration so far: launch_server with plan_item (or "
        "plan_items for a combined step of several items), without extra flags; rerun an experiment with its "
        "experiment_id. The one exception: after an item crashed under load, retry it once capped, "
        "flags='--max-running-requests N' below the first level that failed. audit_flags first; if the engine "
        "would refuse the flags, record_verdict with plan_item and verdict ruled_out, without launching. If the "
        "engine is simulated and does not model the flags the item changes, record_verdict with plan_item and "
        "verdict not_measured, without launching (its numbers could not show the change: it needs a GPU). A code "
        "item is documented for the user; there is nothing to run.",
        _check_one_change,
    ),
    Rule(
        "verdict",
        "Record each verdict by the numbers run_benchmark returns: adopted only beyond the noise band, a gain "
        "inside it rerun before it is called no_gain, regressed beyond the band the other way, crashed with the "
        "classified reason; name no-op flags in the reason. stop_server after each.",
        enforced_by="record_verdict",
    ),
    Rule(
        "profile",
        "A profile item: launch_server with that plan_item (the best configuration), run_benchmark, profile, "
        "stop_server, record_verdict measured.",
    ),
    Rule("docs_after", "After each verdict bring the item's document up to date (write_improvement_doc)."),
    Rule(
        "pivot_after_tier",
        "When a tier is finished, stop at a pivot before an item of another tier: write_status_summary with a question "
        "and numbered options, then ask_user with the same. Stop at a pivot too after several changes in a row "
        "without gain and after a promising item crashed. Do what the answer says.",
        _check_pivot_after_tier,
    ),
    Rule(
        "question",
        "A pivot's question says what was found and what to decide (three words at least); ask_user offers "
        "distinct numbered options, each saying what pivot would do (and 'stop').",
        _check_question,
    ),
    Rule(
        "finish",
        "When every released item is done or the user said stop, write a final status summary and end with a "
        "short message; the method decides from the ledger whether the campaign is finished.",
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


def refusal(session: Session, tool: str, args: Args) -> str | None:
    """Why the method refuses this call, or None when it may run. Reads the ledger afresh."""
    if tool not in GUARDED_TOOLS:
        return None  # reads and measurements of a running server change nothing the method rules on
    checks = [r for r in RULES if r.check is not None]
    method = Method.read(session.store, session.id)
    calls = [(tool, args)]
    if tool == "run_experiments":  # the step's shape, then every member as the launch it stands for
        calls += [
            ("launch_server", {**x, STEP_MEMBER: True}) for x in (args.get("experiments") or []) if isinstance(x, dict)
        ]
    for name, call_args in calls:
        for rule in checks:
            assert rule.check is not None
            why = rule.check(method, session, name, call_args)
            if why is not None:
                return f"refused by the method ({rule.key}): {why}"
    return None


@dataclass
class MethodGuard(WrapperToolset[Session]):
    """Wraps a toolset: every call goes through the method's rules first; a call that breaks one is refused as a
    retry with the reason and the numbers, and the tool never runs."""

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Session], tool: ToolsetTool[Session]
    ) -> Any:
        why = refusal(ctx.deps, name, tool_args)
        if why is not None:
            ctx.deps.emit("warning", f"{name}: {why}")
            raise ModelRetry(why)
        return await super().call_tool(name, tool_args, ctx, tool)
