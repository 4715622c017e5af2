"""Taking apart what the twin has wrong, as the ledger tells it: combined steps that fell short of their prediction,
their members' own launches, whether their probes are spent, and the launches and reverts an item had. The search
(tools/search.py: leave_one_out) proposes the probes from these facts and ranks them with the rest.

A combined step measured below the prediction made before its launch by more than the noise band hides a member the
twin has wrong (no effect on this target, or a cost). The campaign's model (tools/learn.py) cannot tell which from
that one measurement: it spreads the miss over the members by their priors. So each member in turn is left out (the
step without it on the best configuration; taken back from the best, when the step was adopted), and the probe is
launched when it would beat the noise band *if* that member is the one: the same measurements read with that
member's prior left open (learn.SUSPECT_SD). The measurement of the probe then tells; the leave-one-out of a step
ends at its first adopted probe, or after as many probes as it has members.

The other way the twin can be wrong is about what it settles without a launch: an item it predicts inside the noise
band is recorded `predicted` and never measured, and on a target where that item does pay (a flag the twin does not
model, a kernel it has wrong) nothing would ever show it. Only where the plan's author agrees (an expected impact
with a number for the session's objective, under the band) is the twin's word taken; where the author expects at
least the band, or says nothing the twin can be held to (no number, or only a latency), a measurement tells: the
items in doubt are launched together, once, when nothing else is left and every tier is open (an item may pay only
with another tier's: those combinations come first) (`doubted`).
Measured as the twin says, they are settled by one launch (and stay candidates for the combinations they may pay in,
as items the twin predicted do: `checked`); measured beyond the band, the bundle is adopted like any change (a
surprise: confirmed on three runs); measured below, its members are taken apart like any missed step.
"""

from __future__ import annotations

from agent import models as m
from tools.method.reading import Method
from tools.reports import Expectation, parse_expectation


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


def launches(method: Method, item_id: str) -> int:
    """Experiments that launched (measured or crashed) with the item in them."""
    return sum(1 for e in method.experiments if item_id in e.plan_items and _launched(method, e))


def revert_launches(method: Method, item_id: str) -> int:
    """Experiments that launched taking the item back; a revert launched together with items, in a step that fell
    short of its prediction, does not count (the step's own items may be what the twin had wrong)."""
    return sum(
        1
        for e in method.experiments
        if item_id in e.reverts and _launched(method, e) and not (e.plan_items and fell_short(method, e))
    )


def doubted(method: Method, items: list[m.PlanItem], band: float) -> tuple[str, ...]:
    """The items in doubt (the module docstring): settled `predicted` by the twin inside the band (`band`, in %),
    never launched, and not agreed on by the plan (`_plan_agrees`); in plan order."""
    out = []
    for item in items:
        final = method.final(item)
        last = final[-1] if final else None
        if last is None or last.verdict != "predicted" or launches(method, item.id) > 0:
            continue
        if last.predicted_change_pct is None or not -band < last.predicted_change_pct < band:
            continue
        if not _plan_agrees(item, method.plan.objective.kind, band):
            out.append(item.id)
    return tuple(i for i in method.plan.item_ids() if i in out)


def disagreement(method: Method, ids: tuple[str, ...]) -> str:
    """What the plan says of the items in doubt `ids`, for a launch's reason: "the plan expects more", or, where an
    item has no number for the session's objective, which items the plan leaves open."""
    objective = method.plan.objective.kind
    open_ = [i for i in ids if _number(method.plan.item(i), objective) is None]
    if not open_:
        return "the plan expects more"
    said = f"the plan gives {'them' if len(open_) > 1 else 'it'} no number for {objective}"
    more = ", ".join(i for i in ids if i not in open_)
    return said if not more else f"the plan expects more of {more} and gives {', '.join(open_)} no number"


def _plan_agrees(item: m.PlanItem, objective: str, band: float) -> bool:
    """Whether the plan's author expects `item` to stay inside the band (`band`, in %) for `objective`: a number that
    speaks for it, with its midpoint under the band. No number, or one only for a latency, is no second opinion."""
    exp = _number(item, objective)
    return exp is not None and exp.gain_pct < band


def _number(item: m.PlanItem, objective: str) -> Expectation | None:
    """The plan's expected impact of `item` where it has a number for `objective` (a latency's never does)."""
    exp = parse_expectation(item.expected_impact)
    return exp if exp is not None and exp.speaks_for(objective) else None


def checked(method: Method, e: m.Experiment) -> bool:
    """Whether `e` checked items the twin had settled unmeasured: each of its items was recorded `predicted` before
    it and first launched in it."""
    for item_id in e.plan_items:
        before = [x for x in method.experiments if item_id in x.plan_items and (x.id or 0) < (e.id or 0)]
        if not any(x.verdict == "predicted" for x in before) or any(_launched(method, x) for x in before):
            return False
    return bool(e.plan_items) and not e.reverts
