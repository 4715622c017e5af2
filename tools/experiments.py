"""What an experiment is before it runs, shared by the tools that propose, audit or rule one out.

The config a plan item proposes on top of the best so far, the engine's audit of it, the failure class a refused
audit is recorded with, and the experiment a plan item would be when the session's engine cannot measure it.
Used by the server and docs toolsets and the autopilot; a tool plugin never imports another plugin's internals.
"""

from __future__ import annotations

from pathlib import Path

from pydantic_ai import ModelRetry

from agent import models as m
from agent.errors import PivotError
from agent.session import Session
from tools.engines.failures import PIVOT_FAILURE
from tools.method.reading import Method

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
    reverts: list[str] | None = None,
) -> m.ServerConfig:
    """The config a plan item (or several, combined in plan order as given), and/or extra flags, proposes on top of
    the best config so far on their workload (or on it rebuilt from the chain of adopted changes without
    `reverts`)."""
    for item_id in reverts or []:
        plan_item_of(method.plan, item_id)
    items = step_items(plan_item, plan_items)
    for item_id in items:
        plan_item_of(method.plan, item_id)
    config = method.step_base(items, reverts or ())
    for item_id in items:
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


def raw_run_file(session: Session, experiment_id: int, run: int) -> Path:
    """state/<s>/bench/expNNN-runM.jsonl for a new run of the experiment with this ledger id (NNN: its number in
    the session, as the reports call it). A file already there is an attempt that never reached the
    ledger (pivot was killed or interrupted mid-benchmark): it is moved aside as expNNN-runM.abandoned-K.jsonl, so
    the run's file holds exactly the levels the ledger records."""
    raw = session.paths.raw_dir(session.id)
    raw.mkdir(parents=True, exist_ok=True)
    number = session.store.get_experiment(experiment_id).number or experiment_id
    path = raw / f"exp{number:03d}-run{run}.jsonl"
    if path.exists():
        k = 1
        while (aside := raw / f"exp{number:03d}-run{run}.abandoned-{k}.jsonl").exists():
            k += 1
        path.rename(aside)
        session.emit(
            "warning", f"{session.paths.relative(path)} held an attempt that was cut short; moved to {aside.name}"
        )
    return path


def _reusable(
    method: Method, items: list[str], kind: str, config: m.ServerConfig, workload: m.BenchSpec
) -> m.Experiment | None:
    """An experiment of the same items, kind, config and workload that never finished (interrupted by a kill):
    relaunched in place, so a resumed campaign runs no experiment twice."""
    for e in reversed(method.experiments):
        if (
            e.plan_items == items
            and e.kind == kind
            and e.status in ("planned", "running", "interrupted")
            and e.verdict is None
            and e.config == config
            and e.workload == workload
            and method.run_count(e) == 0
        ):
            return e
    return None


def record_step(
    session: Session,
    method: Method,
    *,
    plan_item: str | None = None,
    plan_items: list[str] | None = None,
    flags: str | None = None,
    remove_flags: list[str] | None = None,
    baseline: bool = False,
    experiment_id: int | None = None,
    hypothesis: str = "",
    reverts: list[str] | None = None,
) -> m.Experiment:
    """The experiment a launch runs: experiment `experiment_id` again (a rerun), an unfinished one of the same step
    (relaunched in place, so a resumed campaign runs nothing twice), else a new one recorded for the step (the
    baseline, an item or a combined step on the best configuration, a revert of adopted items, with the search's
    prediction)."""
    store = session.store
    if experiment_id is not None:
        e = method.experiment(experiment_id)
        if e is None:
            raise ModelRetry(
                f"no experiment {method.number(experiment_id) or experiment_id} in this session; experiments: "
                f"{', '.join(str(x.number) for x in method.experiments) or 'none'}"
            )
        if e.status == "failed" and method.run_count(e) == 0:
            raise ModelRetry(f"experiment {e.number} never started ({e.failure}); there is nothing to rerun")
    else:
        items = step_items(plan_item, plan_items)
        plan_item = items[0] if items else None
        item = plan_item_of(method.plan, plan_item) if plan_item is not None else None
        workload = item.workload_for(method.plan.workload) if item is not None else method.plan.workload
        if baseline:
            config = method.base_config()
            if flags or remove_flags:
                config = proposed_config(method, None, flags, remove_flags)
            kind: m.ExperimentKind = "baseline"
            base_id = None
            title = "baseline" if item is None else f"baseline for {item.id} on its workload"
        else:
            if item is None and not flags and not remove_flags and not reverts:
                raise ModelRetry("say what to launch: baseline=True, a plan_item, flags, or experiment_id to rerun")
            if method.baseline(workload) is None:
                raise ModelRetry(
                    "measure the baseline on this workload first (launch_server with baseline=True"
                    + (f" and plan_item={plan_item!r})" if item is not None and item.workload else ")")
                )
            config = proposed_config(method, None, flags, remove_flags, items, reverts)
            kind = "change"
            best = method.best(workload)
            base_id = best.id if best is not None else None
            if len(items) > 1:
                title = " + ".join(f"{i} {plan_item_of(method.plan, i).title}" for i in items)
            else:
                title = item.title if item is not None else f"flags {flags or ''}".strip()
            if reverts:
                dropped = ", ".join(f"{i} {plan_item_of(method.plan, i).title}" for i in reverts)
                title = f"without {dropped}" + (f", with {title}" if items else "")
        e = _reusable(method, items, kind, config, workload)
        if e is None:
            from tools import search

            predicted = (
                search.record_fields(method, items, baseline=kind == "baseline", config=config, reverts=reverts)
                if kind == "change" or item is None
                else {}
            )
            why = _revert_why(method, items, reverts) if reverts and kind == "change" else None
            e = store.add_experiment(
                session.id,
                m.Experiment(
                    plan_item=plan_item,
                    plan_items=items,
                    kind=kind,
                    title=title,
                    hypothesis=hypothesis or (item.hypothesis if item is not None else ""),
                    config=config,
                    base_experiment_id=base_id,
                    workload=workload,
                    reverts=list(reverts or []) if kind == "change" else [],
                    revert_why=why,
                    **predicted,
                ),
            )
    return e


def refusal(issues: list[m.FlagIssue]) -> tuple[str, str] | None:
    """(failure class, "not launched: why") when the audit's rows would stop a launch; None when it may start."""
    blocking = [i for i in issues if i.blocking]
    if not blocking:
        return None
    reason = "; ".join(f"{i.flag}: {i.message or i.status}" for i in blocking)
    return REFUSAL_CLASS.get(blocking[0].status, "argument-validation"), f"not launched: {reason}"


def record_failed(session: Session, e: m.Experiment, failure: str, message: str) -> None:
    """Record that the experiment's server did not start: its class, and the words that say why. A failure of
    pivot's own (its twin's command line refused a value) is not the engine's: the experiment is recorded
    interrupted, with what happened, and the run stops with that line (PivotError), so nothing is judged on it."""
    if failure == PIVOT_FAILURE:
        session.store.update_experiment(
            e.model_copy(update={"status": "interrupted", "failure_detail": f"pivot's own error: {message}"[:500]})
        )
        raise PivotError(
            f"experiment {e.number} did not start because of an error of pivot's own, not the engine's: {message}",
            hint=f"it is recorded interrupted, not crashed; fix what the line says, then `pivot resume {session.id}`",
        )
    session.store.update_experiment(
        e.model_copy(
            update={"status": "failed", "failure": failure, "failure_detail": message[:500], "finished_at": m.utcnow()}
        )
    )
    what = (
        "the server refused the benchmark"
        if failure == "request-refused"
        else "the server failed its first requests"
        if message.startswith("warmup failed")
        else "did not start"
    )
    session.emit("warning", f"experiment {e.number}: {what} ({failure}): {message[:200]}")


def _revert_why(method: Method, items: list[str], reverts: list[str]) -> str:
    """Why the adopted items `reverts` are taken back, in words: the best's riders checked (tools/probes.py), else
    what made each a brake (tools/method/moves.py: revert_text)."""
    from tools import probes, search

    if not items and set(reverts) <= set(probes.riders(method)):
        who = " + ".join(f"{i} {plan_item_of(method.plan, i).title}" for i in reverts)
        return f"{who}: adopted in a combined step and never measured alone, taken back to check the twin's word"
    return "; ".join(search.revert_text(method, i, tuple(items)) for i in reverts)
