"""What an experiment is before it runs, shared by the tools that propose, audit or rule one out.

The config a plan item proposes on top of the best so far, the engine's audit of it, the failure class a refused
audit is recorded with, and the experiment a plan item would be when the session's engine cannot measure it.
Used by the server and docs toolsets and the autopilot; a tool plugin never imports another plugin's internals.
"""

from __future__ import annotations

from pydantic_ai import ModelRetry

from agent import models as m
from agent.errors import PivotError
from agent.session import Session
from tools.method import Method

REFUSAL_CLASS = {
    "unknown": "unrecognized-argument",
    "ambiguous": "ambiguous-argument",
    "invalid": "argument-validation",
}


def proposed_config(
    method: Method,
    plan_item: str | None,
    flags: str | None,
    remove_flags: list[str] | None,
    plan_items: list[str] | None = None,
) -> m.ServerConfig:
    """The config a plan item (or several, combined in plan order as given), and/or extra flags, proposes on top of
    the best config so far."""
    config = method.best_config()
    for item_id in step_items(plan_item, plan_items):
        config = plan_item_of(method.plan, item_id).apply(config)
    if remove_flags:
        config = config.without(*remove_flags)
    if flags:
        try:
            config = config.with_flags(m.ServerConfig.parse(flags))
        except PivotError as e:
            raise ModelRetry(f"cannot parse flags {flags!r}: {e.message}") from e
    return config


def step_items(plan_item: str | None, plan_items: list[str] | None) -> list[str]:
    """The items a step names: `plan_items` (a combined step), else `plan_item` alone; no item twice."""
    out: list[str] = []
    for item_id in [*(plan_items or []), *([plan_item] if plan_item is not None and not plan_items else [])]:
        if item_id not in out:
            out.append(item_id)
    if plan_item is not None and plan_items and plan_item not in plan_items:
        raise ModelRetry(f"plan_item {plan_item!r} is not among plan_items {plan_items}: give one or the other")
    return out


def plan_item_of(plan: m.Plan, item_id: str) -> m.PlanItem:
    """The plan's item `item_id`; an unknown id is the model's to fix (a retry), not an error."""
    try:
        return plan.item(item_id)
    except PivotError as e:
        raise ModelRetry(f"{e.message}; {e.hint}") from e


def audit_issues(session: Session, config: m.ServerConfig) -> list[m.FlagIssue]:
    return session.engine_for(session.settings.seed).validate(config)


def unmeasurable_item(session: Session, method: Method, plan_item: str) -> m.Experiment | None:
    """The experiment a plan item would be, when the session's engine cannot measure it: every flag it changes is
    one the engine does not model (a simulated engine) and the engine would start with it. None otherwise (a
    real engine, a change the engine models in part or whole, flags it refuses, an item that is not a flag change).
    Not recorded: `tools.docs` records it with the verdict not_measured, without a launch."""
    item = plan_item_of(method.plan, plan_item)
    if item.kind not in ("flag", "config") or item.workload:
        return None
    config = proposed_config(method, plan_item, None, None)
    engine = session.engine_for(session.settings.seed)
    unmodelled = engine.not_modelled(config)
    if not unmodelled:
        return None
    best = method.best(item.workload_for(method.plan.workload))
    e = m.Experiment(
        plan_item=plan_item,
        kind="change",
        title=item.title,
        hypothesis=item.hypothesis,
        config=config,
        base_experiment_id=best.id if best is not None else None,
        workload=item.workload_for(method.plan.workload),
        not_modelled=unmodelled,
    )
    changed, missing = method.unmodelled_change(e)
    if not changed or len(missing) != len(changed):
        return None
    issues = engine.validate(config)
    if any(i.blocking for i in issues):
        return None
    return e.model_copy(update={"audit": issues})
