"""A tool call held against the method's moves: None when it is one of them, else the rule it breaks and why.

The rules' keys are those of RULES (tools/method/guard.py), so a refusal names the rule the model read; the
refusal also names every move allowed now (Refusal.text)."""

from __future__ import annotations

import re
from typing import Any

from agent import models as m
from tools.method.moves import SETTLE_VERDICTS, Moves, Refusal

PHASE_RULE = {
    "asked": "pivot_after_tier",
    "documents": "documents",
    "baseline": "baseline",
    "judge": "judge_first",
    "pivot": "pivot_after_tier",
    "finished": "finish",
}


def check(mv: Moves, tool: str, args: dict[str, Any]) -> Refusal | None:
    if tool == "launch_server":
        return _launch(mv, args)
    if tool == "record_verdict":
        return _verdict(mv, args)
    return None


def _refuse(mv: Moves, rule: str, why: str) -> Refusal:
    return Refusal(rule, why, mv.allowed_text())


def _phase(mv: Moves, what: str) -> Refusal:
    """The call waits for the phase the method is in (documents, the baseline, verdicts, a pivot, the end)."""
    if mv.phase == "pivot" and mv.pivot is not None and mv.pivot.closes:
        plan = mv.method.plan
        names = " and ".join(
            f"Tier {t}" + (f" ({plan.tiers[t]})" if plan.tiers.get(t) else "") for t in mv.pivot.closes
        )
        why = (
            f"{names} {'is' if len(mv.pivot.closes) == 1 else 'are'} finished ({mv.pivot.why}): stop at a pivot "
            f"before {what} (an item of another tier, a retest, anything new): write_status_summary with a "
            "question and options, then ask_user with the same"
        )
        return _refuse(mv, "pivot_after_tier", why)
    if mv.phase == "pivot" and mv.pivot is not None:
        why = f"a pivot is owed before {what} ({mv.pivot.why}): write_status_summary with a question, then ask_user"
        return _refuse(mv, "pivot_after_tier", why)
    if mv.phase == "finished":
        return _refuse(mv, "finish", f"the campaign is finished ({mv.why}); only the user's answer opens more")
    return _refuse(mv, PHASE_RULE.get(mv.phase, "one_change"), mv.why)


def _named(args: dict[str, Any]) -> list[str]:
    items = [str(x) for x in (args.get("plan_items") or [])]
    if not items and args.get("plan_item") is not None:
        items = [str(args["plan_item"])]
    return items


def _not_released(mv: Moves, blocked: list[str]) -> Refusal:
    d, plan = mv.decision, mv.method.plan
    asked = sorted({i for i, _ in d.asked()})
    if d.stopped_at is not None:
        why = "the user answered stop" + (f"; asked for since: {', '.join(asked)}" if asked else "")
    else:
        why = f"released tiers: {', '.join(str(t) for t in sorted(d.released))}" + (
            f"; asked for: {', '.join(asked)}" if asked else ""
        )
    tiers = ", ".join(f"{i} (tier {plan.item(i).tier})" for i in blocked)
    return _refuse(
        mv,
        "released",
        f"item {tiers} is not released: {why}. Only the user's answer at a pivot releases the next tier or asks for "
        "an item (write_status_summary, then ask_user)",
    )


def _no(mv: Moves, eid: Any) -> Any:
    """The session's number of experiment `eid` (a ledger id), as refusals name it."""
    try:
        return mv.method.number(int(eid)) or eid
    except (TypeError, ValueError):
        return eid


def _rerun(mv: Moves, eid: int) -> Refusal | None:
    if int(eid) in mv.reruns:
        return None
    e = mv.method.experiment(int(eid))
    if e is None:
        ids = ", ".join(str(x.number) for x in mv.method.experiments) or "none"
        return _refuse(mv, "one_change", f"no experiment {_no(mv, eid)} in this session; experiments: {ids}")
    if e.status == "failed" and mv.method.run_count(e) == 0:
        return _refuse(
            mv, "one_change", f"experiment {_no(mv, eid)} never started ({e.failure}): there is nothing to rerun"
        )
    if mv.phase != "work":
        return _phase(mv, f"a rerun of experiment {_no(mv, eid)}")
    return _refuse(mv, "one_change", f"experiment {_no(mv, eid)} cannot be rerun now")


def _launch(mv: Moves, args: dict[str, Any]) -> Refusal | None:
    method, plan = mv.method, mv.method.plan
    named = _named(args)
    reverts = [str(x) for x in (args.get("revert_items") or [])]
    unknown = [i for i in [*named, *reverts] if i not in plan.item_ids()]
    if unknown:
        return _refuse(mv, "one_change", f"no plan item {', '.join(unknown)}; items: {', '.join(plan.item_ids())}")
    if args.get("experiment_id") is not None:
        return _rerun(mv, args["experiment_id"])
    flags, remove = args.get("flags"), args.get("remove_flags")
    if args.get("baseline"):
        if flags or remove or reverts or len(named) > 1:
            return _refuse(
                mv, "one_change", "a baseline runs the plan's base flags as they are: baseline=True without flags"
            )
        if named and named[0] in mv.workload_baselines:
            return None
        if not named and mv.baseline:
            return None
        if mv.phase in ("documents", "baseline"):
            return _phase(mv, "the baseline")
        base = method.baseline(plan.item(named[0]).workload_for(plan.workload) if named else None)
        if base is not None and method.run_count(base) > 0:
            return _refuse(
                mv, "baseline", f"the baseline is measured (experiment {base.number}): rerun it by its experiment_id"
            )
        return _phase(mv, "a baseline")
    if mv.phase != "work":
        return _phase(mv, f"item {', '.join(named)}" if named else "a launch")
    if not named and not reverts:
        return _refuse(
            mv,
            "one_change",
            "a change is a plan item on top of the best configuration: name it (plan_item, or plan_items for a "
            "combined step); extra flags alone are not a step of the plan",
        )
    code = [i for i in named if plan.item(i).kind == "code"]
    if code:
        return _refuse(
            mv,
            "one_change",
            f"item {', '.join(code)} is a code change for the user: its document says what; there is nothing to run",
        )
    if remove:
        return _refuse(
            mv,
            "one_change",
            f"launch the best configuration plus item {', '.join(named)} as the plan writes it: remove_flags "
            f"{remove} is a change of its own",
        )
    missing = [i for i in reverts if i not in mv.reverts]
    if missing:
        active = method.active_items()
        why = "; ".join(
            f"{i} is not in the best configuration" if i not in active else f"{i} was taken back once already"
            for i in missing
        )
        return _refuse(mv, "one_change", f"cannot take back {', '.join(missing)}: {why}")
    launchable = mv.items | mv.profiles | set(mv.retries)
    blocked = [i for i in named if i not in launchable]
    if blocked:
        waiting = [i for i in blocked if i in mv.workload_baselines]
        if waiting:
            return _refuse(
                mv,
                "baseline",
                f"measure item {waiting[0]}'s workload first: launch_server baseline=True plan_item={waiting[0]!r}",
            )
        return _not_released(mv, blocked)
    if len(named) > 1 and any(plan.item(i).kind == "profile" or plan.item(i).workload for i in named):
        return _refuse(mv, "one_change", "a combined step combines flag and config items on the plan's workload")
    if flags:
        refused = _retry(mv, named, str(flags))
        if refused is not None:
            return refused
    config = _config(mv, named, reverts, flags)
    workload = plan.item(named[0]).workload_for(plan.workload) if named else plan.workload
    profile = len(named) == 1 and plan.item(named[0]).kind == "profile"  # a measurement of the best, not a change
    twice = None if profile else method.ran(config, workload)
    if twice is not None:
        return _refuse(
            mv,
            "one_change",
            f"experiment {twice.number} already measured this configuration ({config}): nothing is run twice; rerun it "
            f"by its experiment_id to add a run",
        )
    return None


def _retry(mv: Moves, named: list[str], flags: str) -> Refusal | None:
    found = re.fullmatch(r"\s*--max-running-requests(?:\s+|=)(\d+)\s*", flags)
    n = int(found.group(1)) if found else None
    if len(named) != 1 or named[0] not in mv.retries or n is None:
        return _refuse(
            mv,
            "one_change",
            f"one change at a time: the step is the best configuration ({mv.method.best_config()}) plus item "
            f"{', '.join(named)}; extra flags {flags!r} are refused. The one exception: after the item crashed "
            "under load, flags='--max-running-requests N' below the first level that failed",
        )
    cap = mv.retries[named[0]]
    if not 1 <= n < cap:
        return _refuse(
            mv,
            "one_change",
            f"the bounded retry of item {named[0]} caps --max-running-requests below {cap}, the first level that "
            f"failed; got {n}",
        )
    return None


def _config(mv: Moves, named: list[str], reverts: list[str], flags: Any) -> m.ServerConfig:
    method = mv.method
    config = method.step_base(named, reverts)
    for i in named:
        config = method.plan.item(i).apply(config)
    return config.with_flags(m.ServerConfig.parse(str(flags))) if flags else config


def _verdict(mv: Moves, args: dict[str, Any]) -> Refusal | None:
    method = mv.method
    verdict = args.get("verdict")
    eid, item = args.get("experiment_id"), args.get("plan_item")
    if eid is not None:
        eid = int(eid)
        if eid in mv.verdicts:
            if verdict in mv.verdicts[eid]:
                return None
            j = mv.judgements.get(eid)
            e = method.experiment(eid)
            what = (
                "the baseline: its numbers permit"
                if e is not None and e.kind == "baseline"
                else "judged by its numbers:"
            )
            return _refuse(
                mv,
                "verdict",
                f"experiment {_no(mv, eid)} is {what} {' or '.join(mv.verdicts[eid])}, not {verdict}"
                + (f" ({j.text})" if j is not None else ""),
            )
        if eid in mv.reruns and mv.phase in ("baseline", "judge"):
            return _refuse(
                mv, "verdict", f"experiment {_no(mv, eid)} waits for a run before its verdict: {mv.reruns[eid]}"
            )
        e = method.experiment(eid)
        if e is None:
            return _refuse(mv, "verdict", f"no experiment {_no(mv, eid)} in this session")
        if e.verdict is not None:
            return _refuse(
                mv, "verdict", f"experiment {_no(mv, eid)} already has its verdict ({e.verdict}): {e.reason or ''}"
            )
        if method.run_count(e) == 0 and e.status != "failed":
            return _refuse(mv, "verdict", f"experiment {_no(mv, eid)} was not measured: run_benchmark it first")
        return _phase(mv, f"a verdict of experiment {_no(mv, eid)}")
    if item is None:
        return _refuse(
            mv, "verdict", "give experiment_id (or plan_item with verdict ruled_out, not_measured or predicted)"
        )
    item = str(item)
    if item in mv.settle and verdict in mv.settle[item]:
        return None
    if mv.phase != "work":
        return _phase(mv, f"a verdict of item {item}")
    if item not in method.plan.item_ids():
        return _refuse(mv, "one_change", f"no plan item {item}; items: {', '.join(method.plan.item_ids())}")
    if verdict not in SETTLE_VERDICTS:
        return _refuse(
            mv,
            "verdict",
            "without an experiment only ruled_out, not_measured or predicted can be recorded; launch and measure it first",
        )
    allowed = mv.settle.get(item)
    because = {
        "ruled_out": "its flags pass the audit (the engine refuses none of them, and reads them)",
        "not_measured": "the engine models what it changes",
        "predicted": "the search does not predict it inside the noise band on the best configuration",
    }[str(verdict)]
    why = f"item {item} cannot be recorded {verdict}: {because}; " + (
        f"it can be recorded {' or '.join(allowed)} now" if allowed else "launch it and measure it"
    )
    return _refuse(mv, "verdict", why)
