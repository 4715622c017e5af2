"""How the moves are computed from one reading of the ledger (tools/method/moves.py says what they are)."""

from __future__ import annotations

from datetime import datetime

from agent import models as m
from agent.session import Session
from tools import experiments, peers, search
from tools.method import paired
from tools.method.answers import Decision, decision
from tools.method.checks import check
from tools.method.moves import (
    _CACHE,
    BASELINE_RUNS_MAX,
    BENCHMARK_REFUSED,
    Moves,
    PivotDue,
    _signature,
    as_asked,
    baseline_runs_needed,
    measured_unjudged,
    permitted,
    profiled,
    promising,
    request_done,
)
from tools.method.offers import offers
from tools.method.reading import Method
from tools.probes import launched, may_take_back

RERUN = "a rerun adds a run"


def moves_of(session: Session, method: Method | None = None) -> Moves:
    """The moves of `session` now, read from its ledger (or from `method`, a reading of it). The same ledger gives
    the same moves: they are computed once per state of the ledger (the guard asks for every toolset)."""
    method = method or Method.read(session.store, session.id)
    key = _signature(session, method)
    hit = _CACHE.get(session.id)
    if hit is not None and hit[0] == key:
        return hit[1]
    moves = compute(session, method)
    _CACHE[session.id] = (key, moves)
    if len(_CACHE) > 32:
        _CACHE.pop(next(iter(_CACHE)))
    return moves


def compute(session: Session, method: Method) -> Moves:
    """The moves of the session now (see tools/method/moves.py)."""
    d = decision(method)
    mv = Moves(method, d, "work")
    waiting = [p for p in method.pivots if p.answer is None]
    if waiting:
        mv.phase, mv.why = "asked", f"the question of pivot {waiting[-1].id} waits for the user's answer"
        return mv
    written = {doc.plan_item for doc in session.store.documents(session.id) if doc.kind == "improvement"}
    missing = [i for i in method.plan.item_ids() if i not in written]
    if missing:
        mv.phase = "documents"
        mv.why = (
            f"the improvement documents come before the first experiment: {len(missing)} of "
            f"{len(method.plan.items)} missing ({', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''}); "
            "write_improvement_doc for each"
        )
        return mv
    if _baseline(method, mv):
        return mv
    if _judging(method, mv):
        return mv
    _work(session, method, mv)
    return mv


# ---- the baseline


def _baseline(method: Method, mv: Moves) -> bool:
    """The baseline's moves; True while the baseline is not measured and judged (nothing else may happen)."""
    d = mv.decision
    base = method.baseline()
    mv.phase = "baseline"
    if base is None:
        mv.baseline, mv.why = True, "measure the baseline first (the plan's base flags, no extra flags)"
        return True
    runs = method.run_count(base)
    failed = (base.status == "failed" and runs == 0) or base.verdict == "crashed"
    if failed and base.verdict is None:
        j = method.judge(base)
        mv.judgements[base.id or 0] = j
        mv.verdicts[base.id or 0] = permitted(method, base, j) or ("crashed",)
        mv.why = f"record the verdict of the baseline (experiment {base.number}): {j.text}"
        return True
    if failed:
        if d.stopped_at is not None:
            mv.phase, mv.why = "finished", "the baseline did not start and the user answered stop"
            return True
        after = base.finished_at or base.created_at
        if any(p.asked_at > after and p.answer is not None for p in method.pivots):
            mv.baseline, mv.why = True, "the user answered: try the baseline again"
            return True
        kind = "benchmark" if base.failure in BENCHMARK_REFUSED else "baseline"
        mv.phase = "pivot"
        mv.pivot = PivotDue(kind, why=f"the baseline (experiment {base.number}) did not run: {base.failure or 'failed'}",
                            experiment_id=base.id)  # fmt: skip
        mv.why = mv.pivot.why
        return True
    if runs == 0:
        mv.baseline = True
        mv.reruns[base.id or 0] = "relaunch the baseline in place"
        mv.why = "measure the baseline first"
        return True
    need = baseline_runs_needed(method)
    if runs < need:
        noise = method.noise_pct()
        why = (
            f"the baseline has {runs} run of the {need} that measure the noise"
            if runs < 2 or noise is None
            else f"the noise band ({noise:.1f}% over {runs} runs) is too wide to tell the plan's changes apart: "
            f"one more run of the baseline (run {runs + 1}, {BASELINE_RUNS_MAX} at most)"
        )
        mv.reruns[base.id or 0] = why
        mv.why = f"{why}: rerun experiment {base.number} (launch_server experiment_id={base.number}, run_benchmark)"
        return True
    if base.verdict is None:
        j = method.judge(base)
        mv.judgements[base.id or 0] = j
        mv.verdicts[base.id or 0] = permitted(method, base, j) or ("baseline",)
        mv.why = f"record the baseline's verdict (experiment {base.number}: {j.text})"
        return True
    if _objective_unmet(method, base) and d.stopped_at is None:
        judged = base.finished_at or base.created_at
        if not any(p.asked_at >= judged for p in method.pivots):  # asked once; an answer goes on as it is
            mv.phase = "pivot"
            mv.pivot = PivotDue("objective", why=f"the baseline (experiment {base.number}) meets the objective at "
                                "no level judged: every change would be compared with zero", experiment_id=base.id)  # fmt: skip
            mv.why = mv.pivot.why
            return True
    mv.phase = "work"
    return False


def _objective_unmet(method: Method, base: m.Experiment) -> bool:
    """Whether the baseline's objective is 0 at the level it is judged at (a goodput or capacity whose SLOs no
    request met there); throughput is never 0 for a baseline that ran."""
    values = method.ok_values(base)
    if not values:
        return False
    runs = values[max(values)]
    return sum(runs) / len(runs) <= 0


# ---- judging


def _judging(method: Method, mv: Moves) -> bool:
    """Verdicts (or the reruns they wait for) of the measured experiments; True when there are any."""
    base = method.baseline()
    for e in method.experiments:
        if not measured_unjudged(method, e) or (base is not None and e.id == base.id):
            continue  # the plan's baseline has its own phase
        j = method.judge(e)
        eid = e.id or 0
        mv.judgements[eid] = j
        verdicts = permitted(method, e, j)
        if e.kind == "baseline" and j.suggestion == "baseline" and method.run_count(e) < baseline_runs_needed(method):
            mv.reruns[eid] = "a workload's baseline runs twice: the spread of its runs is its noise"
        elif verdicts:
            mv.verdicts[eid] = verdicts
        elif j.suggestion == "rebase" and e.base_experiment_id is not None:
            mv.reruns[e.base_experiment_id] = (
                f"its base measured again after experiment {e.number} before that verdict (A/B/A: judged in pairs)"
                if paired.enabled(method.settings.paired, method.runs.get(eid, []))
                else f"adopted on its one run: measured again before experiment {e.number}'s verdict near the band"
                if len(method.runs.get(e.base_experiment_id, [])) < 2
                else f"measured again before experiment {e.number}'s verdict near the band: the mean it is judged against"
            )
        elif j.suggestion == "rerun":
            n = len(j.runs_tok_s)
            mv.reruns[eid] = (
                "a gain beyond the band on one run: a second run confirms it"
                if n < 2 and (j.judged_pct or 0) >= j.band_pct
                else "the gain is inside the noise band: rerun it before the verdict"
                if n < 2
                else f"one more run before its verdict ({n} runs so far; its judgement says why)"
            )
        elif (
            e.plan_item in method.plan.item_ids()
            and method.plan.item(e.plan_item).kind == "profile"
            and not profiled(method, e)
        ):
            mv.reruns[eid] = "a profile needs its server up under load: relaunch it, run_benchmark, profile"
    if not (mv.verdicts or mv.reruns):
        return False
    mv.phase = "judge"
    mv.why = "every measured experiment is judged before the next launch"
    return True


# ---- the work, and the pivot it may owe


def _scope(method: Method, d: Decision) -> list[m.PlanItem]:
    """The items the answers open: the released tiers' (none after a stop) and those asked for."""
    asked = {i for i, _ in d.asked()}
    released = set() if d.stopped_at is not None else {it.id for it in method.plan.items if it.tier in d.released}
    return [it for it in method.plan.items if it.id in asked | released and it.kind != "code"]


def _step_config(method: Method, step: search.Step) -> m.ServerConfig:
    config = method.step_base(step.items, step.reverts)
    for i in step.items:
        config = method.plan.item(i).apply(config)
    return config.with_flags(step.flags) if step.flags else config


def _unmeasured(session: Session, method: Method, step: search.Step) -> search.Step:
    """A single item's launch that the engine cannot measure becomes its not_measured verdict (no launch)."""
    if step.action != "launch" or len(step.items) != 1 or step.flags or step.reverts or step.baseline:
        return step
    item = method.plan.item(step.items[0])
    if item.kind == "profile":
        return step
    e = experiments.unmeasurable_item(session, method, item.id)
    if e is None:
        return step
    from tools.method.reading import not_measured_text

    return search.Step("not_measured", step.items, not_measured_text(method.unmodelled_change(e)[1]))


def _audited(method: Method, validate, step: search.Step) -> search.Step | None:
    """A launch as the engine's audit takes it: unchanged when the engine would start it; the item ruled out
    when it is one item whose flags the engine refuses; None (not a move) for a combination or a revert it refuses."""
    if step.action != "launch" or step.experiment_id is not None or step.baseline:
        return step
    blocking = [i for i in validate(_step_config(method, step)) if i.blocking]
    if not blocking:
        return step
    if len(step.items) == 1 and not step.reverts and not step.flags:
        why = "; ".join(f"{i.flag}: {i.message or i.status}" for i in blocking)
        return search.Step("ruled_out", step.items, f"refused before launch: {why}")
    return None


def _fallback(session: Session, method: Method, d: Decision, covered: set[str], validate) -> list[search.Step]:
    """The plan's order for the released items the search does not rank (all of them with the search off)."""
    out = []
    for item in _scope(method, Decision(released=d.released, stopped_at=d.stopped_at)):
        if item.id in covered or method.done(item):
            continue
        if not method.workload_ready(item):
            out.append(search.Step("launch", (item.id,), "its workload's baseline first", baseline=True))
            continue
        if item.kind == "workload" and item.flags is None and not item.remove_flags:
            out.append(search.Step("launch", (item.id,), "a workload of its own: its baseline", baseline=True))
            continue
        issues = search.item_issues(method, validate, item) if item.kind in search.SEARCH_KINDS else []
        blocking = [i for i in issues if i.blocking]
        if blocking:
            why = "; ".join(f"{i.flag}: {i.message or i.status}" for i in blocking)
            out.append(search.Step("ruled_out", (item.id,), f"refused before launch: {why}"))
            continue
        out.append(search.Step("launch", (item.id,), item.hypothesis))
    return out


def _work(session: Session, method: Method, mv: Moves) -> None:
    d = mv.decision
    plan = method.plan
    validate = session.engine_for(session.settings.seed).validate
    _allowed(session, method, mv)
    requests: list[search.Step] = []
    unclear: str | None = None
    for item_id, since in d.asked():
        item = plan.item(item_id)
        if item.kind == "code" or request_done(method, item, since):
            continue
        step = as_asked(method, item, since)
        twice = _measured_already(method, step)
        if twice is not None:  # asked for what ran already on this configuration: one more run of it
            if any(r.finished_at is not None and r.finished_at > since for r in method.runs.get(twice.id or 0, [])):
                continue  # done: it was run again since
            step = search.Step("launch", step.items, f"asked for again: experiment {twice.number} runs once more",
                               experiment_id=twice.id)  # fmt: skip
        why = _cannot(method, mv, step)
        if why is not None:  # asked for what cannot be run: said once, at the next pivot
            if unclear is None and not any(p.asked_at > since for p in method.pivots):
                unclear = f"Item {item_id} as asked cannot be run: {why}."
            continue
        audited = _audited(method, validate, step)
        if audited is None:
            if unclear is None and not any(p.asked_at > since for p in method.pivots):
                unclear = f"Item {item_id} as asked cannot be run: the engine would refuse that command line."
            continue
        audited = _unmeasured(session, method, audited)
        settled = [e for e in method.final(item) if e.verdict == audited.action]
        if audited.action in ("ruled_out", "not_measured") and settled:  # settled for good: said once
            if unclear is None and not any(p.asked_at > since for p in method.pivots):
                unclear = f"Item {item_id} cannot be run: experiment {settled[-1].number}: {settled[-1].reason}."
            continue
        requests.append(audited)
    searched = [] if d.stopped_at is not None else _proposed(method, mv, validate)
    searched = [_unmeasured(session, method, a) for s in searched if (a := _audited(method, validate, s)) is not None]
    covered = {i for s in searched for i in s.items}
    if method.settings.proposer in peers.PEERS:  # a peer owns its whole scope: no plan order after it
        covered |= {it.id for it in peers.scope(method, d)}
    fallback = [] if d.stopped_at is not None else _fallback(session, method, d, covered, validate)
    released = searched + [a for s in fallback if (a := _audited(method, validate, s)) is not None]
    mv.steps = requests + released
    spent = _budget_spent(method, mv)
    released = [s for s in released if s in mv.steps]
    for s in mv.steps:
        if s.action != "launch":
            mv.settle.setdefault(s.items[0], {})[s.action] = s.reason  # type: ignore[index]
    mv.pivot = None if spent else _pivot_due(session, method, mv, bool(released), unclear)
    if mv.pivot is not None and mv.pivot.kind in ("crash", "stall"):
        crashed = method.experiment(mv.pivot.experiment_id) if mv.pivot.kind == "crash" else None
        mv.offers = offers(session, method, d, mv.pivot.closes, crashed)
        if (go_on := _go_on(method, [s for s in released if s.action == "launch"])) and not any(
            answer == "continue" for answer, _ in mv.offers
        ):
            mv.offers.insert(0, go_on)
    if mv.pivot is not None:
        mv.phase, mv.why = "pivot", mv.pivot.why
        _clear(mv)
    elif not mv.steps:
        mv.phase = "finished"
        mv.why = (
            "the user answered stop" if d.stopped_at is not None
            else spent or "nothing left to do in the opened tiers"
        )  # fmt: skip
        _clear(mv)


def _go_on(method: Method, launches: list[search.Step]) -> tuple[str, str] | None:
    """At a stall or a crash with launches still proposed in the opened tiers: the option to go on with them (the
    proposer's next step, and the launch budget left where there is one); None when nothing is proposed."""
    if not launches:
        return None
    first = launches[0]
    what = " ".join(
        part for part in ("+".join(first.items), "without " + "+".join(first.reverts) if first.reverts else "") if part
    )
    kind = method.settings.proposer
    who = f"the {kind} proposer's" if kind in peers.PEERS else "the search's" if method.settings.search else "the"
    budget = method.settings.max_launches
    left = f"; {budget - peers.launches_spent(method)} of its {budget} launches left" if budget is not None else ""
    return "continue", f"continue: {who} next step ({what or 'the best configuration'}){left}"


def _proposed(method: Method, mv: Moves, validate) -> list[search.Step]:
    """The steps the session's proposer offers in the released tiers: the twin-guided search (tools/search.py), or a
    peer (tools/peers.py: Optuna's TPE, random) after the same audit; none for the plan's order (the fallback)."""
    kind = method.settings.proposer
    if kind not in peers.PEERS:
        return search.ranked_steps(method, mv.decision, validate)
    fresh, _ = search.pool(method, mv.decision)
    audit = search.audit_steps(method, fresh, validate)
    refused = {s.items[0] for s in audit}
    return audit + [s for s in peers.steps(method, mv.decision, kind, mv.reverts) if not set(s.items) & refused]


def _budget_spent(method: Method, mv: Moves) -> str | None:
    """With a launch budget (`--max-launches`) spent: no new launch (steps, items, reverts, retries, reruns of the
    work phase) and the words that say so; else None. A rerun a verdict waits for was allowed before this phase."""
    budget = method.settings.max_launches
    if budget is None or (spent := peers.launches_spent(method)) < budget:
        return None
    mv.steps = [s for s in mv.steps if s.action != "launch"]
    mv.items, mv.reverts, mv.profiles, mv.workload_baselines = frozenset(), frozenset(), frozenset(), frozenset()
    mv.retries, mv.reruns = {}, {}
    return f"the launch budget is spent ({spent} launches of {budget}: --max-launches)"


def _clear(mv: Moves) -> None:
    """A pivot owed (or the end) allows no launch and no verdict until it is asked."""
    mv.baseline, mv.workload_baselines, mv.items, mv.profiles = False, frozenset(), frozenset(), frozenset()
    mv.retries, mv.reverts, mv.reruns, mv.settle = {}, frozenset(), {}, {}


def _allowed(session: Session, method: Method, mv: Moves) -> None:
    """What an LLM may launch in the work phase: any item of the scope alone or with others, profiles, the
    workload baselines, the bounded crash retry, reverts, and reruns of what was measured."""
    plan = method.plan
    scope = _scope(method, mv.decision)
    items, profiles, workloads = set(), set(), set()
    for it in scope:
        if it.kind == "profile":
            profiles.add(it.id)
        elif not method.workload_ready(it):
            workloads.add(it.id)
        elif it.kind == "workload" and it.flags is None and not it.remove_flags:
            continue
        elif it.flags is not None or it.remove_flags or it.power_limit_w is not None:  # a power item: its limit
            items.add(it.id)
    mv.items, mv.profiles, mv.workload_baselines = frozenset(items), frozenset(profiles), frozenset(workloads)
    for it in scope:
        last = next(  # the item's last launch that ran; a retry cut before its benchmark (a cancel) is not one
            (e for e in reversed(method.experiments) if e.plan_items == [it.id] and launched(method, e)), None
        )
        failed = method.failed_levels(last) if last is not None and last.verdict == "crashed" else []
        if failed and search.launches(method, it.id) <= 1:
            mv.retries[it.id] = min(failed)
    asked = {i for i, _ in mv.decision.asked()}
    mv.reverts = frozenset(
        i
        for i in method.active_items()
        if i in plan.item_ids() and (method.settings.proposer in peers.PEERS  # a peer never repeats a configuration
                                     or may_take_back(method, i))
        and (mv.decision.stopped_at is None or i in asked)
    )  # fmt: skip
    for e in method.experiments:
        runs = method.run_count(e)
        if runs > 0 and e.verdict is not None:
            mv.reruns[e.id or 0] = RERUN
        elif runs == 0 and e.verdict is None and e.status in ("planned", "running", "interrupted"):
            mv.reruns[e.id or 0] = "relaunch it in place (it never finished)"


def _last_pivot_at(method: Method) -> datetime | None:
    return method.pivots[-1].asked_at if method.pivots else None


def _since(method: Method, at: datetime | None) -> list[m.Experiment]:
    """Experiments judged after `at` (all, without a pivot yet), in order."""
    return [
        e for e in method.experiments if e.verdict is not None and (at is None or (e.finished_at or e.created_at) > at)
    ]


def _pivot_due(session: Session, method: Method, mv: Moves, work: bool, unclear: str | None) -> PivotDue | None:
    """The pivot owed now, if any: an answer not understood (or asking for what was measured already), a refused
    benchmark, a promising item that crashed, a stall, the end of the open tiers' work, or the end of what was asked
    for (these two only with something to offer but stop)."""
    d = mv.decision
    plan = method.plan
    since = _since(method, _last_pivot_at(method))
    if d.unclear is not None and not since:
        return PivotDue("clarify", why=d.why_unclear)
    if unclear is not None:
        return PivotDue("clarify", why=unclear)
    if d.stopped_at is not None:
        return None
    closes = tuple(sorted(d.open)) if d.open and not work else ()
    for e in since:
        if e.failure in BENCHMARK_REFUSED:
            return PivotDue("benchmark", closes, f"the server refused experiment {e.number}'s benchmark", e.id)
    for e in since:
        item = plan.item(e.plan_item) if e.plan_item in plan.item_ids() else None
        if e.verdict == "crashed" and promising(method, item):
            return PivotDue("crash", closes, f"{e.plan_item} crashed although the plan expects much of it", e.id)
    run = 0
    for e in reversed([x for x in since if x.kind == "change" and x.verdict in ("adopted", "no_gain", "regressed",
                                                                               "crashed")]):  # fmt: skip
        if e.verdict == "adopted":
            break
        run += 1
    if run >= method.settings.stall_after and work:
        return PivotDue("stall", closes, f"{run} changes in a row without gain")
    later = [t for t in sorted({it.tier for it in plan.items}) if t not in d.released]
    if closes or (not work and since and not mv.steps):
        mv.offers = offers(session, method, d, closes)
        if closes and (later or mv.offers):
            names = ", ".join(f"Tier {t}" for t in closes)
            return PivotDue("tier", closes, f"{names} done: the user decides which way next")
        if not closes and mv.offers:
            return PivotDue("requested", (), "what was asked for is done: the user decides which way next")
    return None


def _measured_already(method: Method, step: search.Step) -> m.Experiment | None:
    """The experiment that already ran what a step asked for at a pivot would launch (None: nothing did)."""
    plan = method.plan
    if (
        step.baseline
        or step.action != "launch"
        or (len(step.items) == 1 and plan.item(step.items[0]).kind == "profile")
    ):
        return None
    workload = plan.item(step.items[0]).workload_for(plan.workload) if step.items else plan.workload
    return search.measured(method, _step_config(method, step), workload)


def _cannot(method: Method, mv: Moves, step: search.Step) -> str | None:
    """Why a step asked for at a pivot is not among the moves now (a retry cap that is not below the level that
    failed, say), or None."""
    refused = check(mv, "launch_server", step.launch_args())
    return refused.why if refused is not None else None
