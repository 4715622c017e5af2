"""Taking apart what the twin has wrong: combined steps that fell short of their prediction, their members'
own launches, and the leave-one-out probes the search proposes for them (tools/search.py ranks them with the rest).

A combined step measured below the prediction made before its launch by more than the noise band hides a member the
twin has wrong (no effect on this target, or a cost). The campaign's model (tools/learn.py) cannot tell which from
that one measurement: it spreads the miss over the members by their priors. So each member in turn is left out (the
step without it on the best configuration; taken back from the best, when the step was adopted), and the probe is
launched when it would beat the noise band *if* that member is the one: the same measurements read with that
member's prior left open (learn.SUSPECT_SD). The measurement of the probe then tells; the leave-one-out of a step
ends at its first adopted probe, or after as many probes as it has members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from agent import models as m
from tools.method.reading import Method

if TYPE_CHECKING:
    from tools.search import Candidate, Surrogate


def launched(method: Method, e: m.Experiment) -> bool:
    """Whether change `e` launched and ran (measured, or crashed under its load); one cut before it ran did not."""
    return e.kind == "change" and (method.run_count(e) > 0 or e.verdict == "crashed")


_launched = launched


def own_launches(method: Method, item_id: str) -> int:
    """Experiments that launched the item alone (its own effect isolated, not judged on other members)."""
    return sum(1 for e in method.experiments if e.plan_items == [item_id] and not e.reverts and _launched(method, e))


def missed(method: Method) -> list[tuple[m.Experiment, float, float]]:
    """Combined steps on the plan's workload measured below their prediction by more than the noise band, adopted
    or not: (the experiment, its measured change, its predicted change). One of their members is not what the twin
    says: the search takes them apart (leave-one-out probes)."""
    out = []
    for e in method.experiments:
        if len(e.plan_items) >= 2 and not e.reverts and fell_short(method, e):
            out.append((e, method.judge(e).change_pct or 0.0, e.predicted_change_pct or 0.0))
    return out


def fell_short(method: Method, e: m.Experiment) -> bool:
    """Whether a judged change on the plan's workload measured below the prediction made before its launch by more
    than the noise band."""
    if e.kind != "change" or e.predicted_change_pct is None:
        return False
    if e.verdict not in ("adopted", "no_gain", "regressed", "superseded"):
        return False
    if e.workload.workload_key() != method.plan.workload.workload_key():
        return False
    j = method.judge(e)
    return j.change_pct is not None and j.change_pct < e.predicted_change_pct - method.band_pct()


def suspects(method: Method) -> set[str]:
    """Members of a combined step that missed its prediction whose own effect was never isolated."""
    return {i for e, _, _ in missed(method) for i in e.plan_items if own_launches(method, i) == 0}


def leave_one_out(method: Method, sur: Surrogate, others: list[str]) -> list[Candidate]:
    """For each combined step that missed its prediction (`missed`), the step without each of its members: on the
    best configuration when the step was not adopted, else the member taken back from the best. Probes: launched
    while the corrected model gives them a credible gain (launchable), so a dead or harmful member is found in at
    most as many launches as the step has members, fewer where the measurements already tell."""
    from tools.search import BUNDLE_MIN_PCT, REVERTS, Candidate, _pct, revert_launches

    out: list[Candidate] = []
    held = sur.held(sur.best_config)
    active = method.active_items()
    for e, got, said in missed(method):
        members = [i for i in e.plan_items if i in method.plan.item_ids()]
        if probes_spent(method, e, members):
            continue
        whole = f"{'+'.join(members)} measured {_pct(got)} against {_pct(said)} predicted"
        for i in members:
            if set(members) <= held:  # adopted and still in the best: take the member back
                if i not in active or revert_launches(method, i) >= REVERTS:
                    continue
                items, reverts = (), (i,)
            else:
                items, reverts = tuple(x for x in members if x != i and x not in held), ()
                if not items:
                    continue
            est = sur.estimate(items, reverts)
            if est.source != "twin" or est.crash or est.change_pct is None:
                continue
            guilty = sur.if_guilty(est, i)
            if guilty is None:
                continue
            # grown, as the best step would be if the member left out is the one the twin has wrong: the open items
            # that add at least BUNDLE_MIN_PCT to it then (a probe is a launch: it may as well be the best one)
            for x in others:
                if x in members or x in held or x in items:
                    continue
                grown = sur.estimate(tuple((*items, x)), reverts)
                gain = sur.if_guilty(grown, i) if grown.source == "twin" and not grown.crash else None
                if gain is not None and gain >= guilty + BUNDLE_MIN_PCT:
                    est, items, guilty = grown, grown.items, gain
            kind: Literal["single", "combined", "retest", "revert"] = (
                "revert" if reverts else "combined" if len(items) > 1 else "single"
            )
            added = [x for x in items if x not in members]
            also = f" (and with {'+'.join(added)}, which then add to it)" if added else ""
            why = (
                f"leave-one-out of experiment {e.number} ({whole}): without {i}{also}: {est.note}; "
                f"{_pct(guilty)} if {i} is what the twin has wrong"
            )
            out.append(Candidate(items, est, kind, {}, why, reverts=reverts, probe=guilty))
    return out


def probes_spent(method: Method, e: m.Experiment, members: list[str]) -> bool:
    """Whether the leave-one-out of a missed combined step is over: one of its probes was adopted (the member that
    does not pay was dropped), or it launched as many probes as the step has members."""
    probes = [
        x
        for x in method.experiments
        if (x.id or 0) > (e.id or 0) and _launched(method, x)
        and ((x.plan_items and set(x.plan_items) < set(members)) or (x.reverts and set(x.reverts) <= set(members)))
    ]  # fmt: skip
    return len(probes) >= len(members) or any(x.verdict == "adopted" for x in probes)


def launchable(c: Candidate, band: float) -> bool:
    """Whether a twin-ranked candidate is worth a launch: its corrected gain beats the noise band, or it is a
    probe that would beat it if the member it leaves out is the one the twin has wrong."""
    if c.estimate.source != "twin" or c.estimate.crash:
        return False
    return c.gain >= band or (c.probe is not None and c.probe >= band)
