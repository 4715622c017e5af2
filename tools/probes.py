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
model, a kernel it has wrong) nothing would ever show it. Not even where the plan's author agrees (an expected
impact with a number for the session's objective, under the band) and the twin has not been wrong on this target
(no measured change off its prediction by more than the band: `twin_off`) is its word taken: two guesses that agree
are still guesses, and neither measured this target (the brake plan's smaller prefill chunks, -0.0% to the twin and
+0-2% to the author, gaining 8% on a target, left the campaign 7.4% short of the truth's best). A measurement tells: the items in doubt are launched together, once, when nothing else
is left and every tier is open (an item may pay only with another tier's: those combinations come first)
(`doubted`).
Measured as the twin says, they are settled by one launch (and stay candidates for the combinations they may pay in,
as items the twin predicted do: `checked`); measured beyond the band, the bundle is adopted like any change (a
surprise: confirmed on three runs); measured below, its members are taken apart like any missed step. Once the twin
has missed on this target, its word that each adds little no longer groups them: they are launched one at a time,
the likeliest to pay first (together, a gain and a loss cancel: eval-llama70b-h200x1 R5, 02+06+07 measured -13.6%
where 06 gains 3.5% and 07 costs 11.4%, and the twin's reading of the miss put no member above the band).

The third way is about what a combined step brings in: its measurement is of the sum, so a member the twin says adds
little (a rider) may cost on the target while another member gains more than the twin says, and the step still
measures as predicted; nothing then looks wrong and the rider stays. So the best configuration's riders (`riders`:
members of an adopted combined step, never launched alone, never taken back or left out by a probe) that the twin
now predicts inside the band of the best without them are taken back together, once per best configuration, when
nothing else is left (after the check above), the likeliest to pay first (the best corrected change without it),
joined by the next while the twin's prediction of the best without them all stays above a loss of the band:
measured as the twin says, they stay (a no gain); beyond the band, the best is rebuilt without them (a revert
adopted like any change, and the best's riders are checked again). Once the twin has missed on this target
(`twin_off`), its word that the others add little no longer groups them: one rider per launch, and the checks go on
on the same best after one that measured off its prediction, and after one measured as the twin said only with the
riders the measurements now lean to taking back (a corrected change without it above zero).

A revert of several items measured beyond its prediction by more than the band says the twin had one of them wrong,
not which: the measurement is of the sum again, and an item whose removal the twin put at little may have gained
(crosstier R1: 04 cost 9%, 06 gained 3%, taken back together, +6.7% against -2.2% predicted). So the items it took
back but the one blamed are put back together, once, before the riders of the new best are checked (`put_back`):
blamed is the one whose putting back alone the corrected twin predicts costs most, where it tells them apart by more
than its uncertainty, else the first the revert took back (the riders' check takes the likeliest to pay first).
Measured as the twin says, they stay out; beyond the band, they are adopted.

A verdict can lean on the twin's word too: a change the twin predicted inside the band whose one run measured inside
it is no gain at once, read with the prediction (crosstier R1: 02+06, truly +3.1%, measured +2.7% on one run, judged
+0.0%). Once the twin has missed on this target, such changes whose run measured above their prediction are launched
again together, once, on the best as it is then, when nothing else is left (`leaned`, after the items in doubt).

The last way is about what a bundle hides: a member of a combined step that fell short has its own effect judged
with the other members' (crosstier R3: the FP8 KV cache gains 4.6% alone, the twin says +0.3%, and every launch of
it held a member that cost 4-5%), and where the leave-one-out's reading does not point at it, nothing would launch it
alone. So one member of each such step, not in the best and never launched alone, is launched alone where the
corrected model still gives it a credible gain on the best (its one-sided 95% upper bound clears the band:
`unisolated`, `credible`), the highest bound first; its measurement then teaches the model the rest.

Last, what the twin settled as a loss: an item it predicts costs the band or more is recorded `predicted` and never
launched, where the plan's author usually agrees (a control, a cap). Its word that an item costs is no better than
its word that one adds little, and two guesses that agree are still guesses: the likeliest to pay of them (the
highest corrected change alone on the best) is launched once on the best even where the twin has been right on this
target (`loss_checked`; on the held-out ten-item plan a truth where the KV cap the twin and the author put at a loss,
-4.4% on the best, gains 3.2% there left every campaign 6% short of the truth's best). Measured as the twin said, the
rest stay settled; once the twin has missed on this target, each such item is launched once on the best, the
likeliest to pay first (`settled_losses`; on a ten-item plan a truth whose overlap-scheduler control gains 18% there,
predicted -5.6%). An item recorded inside the band on an earlier best that the twin puts at a loss on the best now
is one too: no longer in doubt (a check of it would cost: `together`), it would otherwise never be launched
(eval-llama70b-h200x2 S8: the overlap scheduler's control, +0.0% on the first best, -5.6% once the TP step is in,
gains 8% there). Measured as a loss, it is a regression on its one run, as the twin said.

A step can also fall short because of what it was added to: its items may contend with what the best already held
(two features sharing one resource), which the model, a sum of each item's own term, cannot say; it puts the whole
shortfall on the step's items. So an adopted step still in the best that measured below its prediction by more than
the band (and OFF_SE standard errors) has the best's earlier items each taken back once, as probes: launched while the
best without it would beat the band if the two contend (the model's change without it plus the shortfall), the
likeliest first, until one is adopted (`contended`, `contention`). benchmarks/wrong_twin.py's S9: on
eval-llama70b-h200x2, TP2 on a best with the FP8 KV cache measured +9.2% against +28.5%, and the campaign ended 12.7%
short of the truth's best, which holds TP2 without it. A step the twin put beyond the band that the contention left
without a gain (not adopted) is checked the same way, launched again on the best without each earlier item (S10:
TP2 measured -3.6% against +28.5%, and the campaign ended 23% short).

The checks above each look for one way the twin was wrong. What none of them names the corrected model still
carries as uncertainty: a term it never pinned down (a member of an adopted bundle the twin says matters, never
taken back alone; an item measured only beside others) leaves a move whose 95% upper bound clears the band while
its mean does not. So, last, once the twin has missed on this target, the move its uncertainty most allows to pay
is launched (`optimistic`): of an item added to the best, an adopted item taken back, and an item added with one
taken back, unmeasured, each added item launched before (one never launched has no term a measurement left loose,
only the twin's word and the prior's width: on seven-item plans such launches never paid), the one likeliest to gain
the band (the highest (change - band) / sd), where its bound clears it; on the same best while each such check
measured off its prediction by more than the band (what it taught the model moves the next bounds), until
OPTIMISTIC_AS_SAID of them measure as the model said (a check that adopts makes a new best, with checks of its
own): one confirmed move says little of another (on a ten-item truth the check of 02 measured as said, -1.0%, and
left 07, +4% truly, hidden beside a member that costs 6.6%, at -0.5% ± 2.1%). On a held-out ten-item plan a truth
where the request cap the twin puts at +6.6% brakes once the KV pool is capped (the cap taken back with the KV cap
added: +2.0% ± 8.3% corrected, +3.9% truly) ended 5.5% short of the grid's best without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent import models as m
from tools.method.reading import Method
from tools.method.step import searchable
from tools.reports import Expectation, parse_expectation

OFF_SE = 2.0  # a miss off the prediction by fewer standard errors than this is the noise's (off_prediction)


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


def miss(method: Method, e: m.Experiment) -> float | None:
    """How far change `e`, judged on the plan's workload, measured from the prediction made before its launch
    (points, measured less predicted); None for a change without a prediction or a judged measurement."""
    if e.kind != "change" or e.predicted_change_pct is None:
        return None
    if e.verdict not in ("adopted", "no_gain", "regressed", "superseded"):
        return None
    if e.workload.workload_key() != method.plan.workload.workload_key():
        return None
    got = method.judge(e).change_pct
    return got - e.predicted_change_pct if got is not None else None


def fell_short(method: Method, e: m.Experiment) -> bool:
    """Whether a judged change on the plan's workload measured below the prediction made before its launch by more
    than the noise band."""
    return (d := miss(method, e)) is not None and d < -method.band_pct()


def contended(method: Method, band: float) -> list[tuple[m.Experiment, float, float, tuple[str, ...]]]:
    """Steps on the plan's workload that measured below the prediction made before their launch by more than the band
    (`band`, in %; and by more than OFF_SE standard errors) on a best holding items adopted before them and still in
    the best, with those items: (the step, its measured change, its predicted change, those items). A step is one
    adopted and still in the best, or one not adopted that the twin predicted beyond the band, whose items the best
    does not hold. Their leave-one-out does not tell this miss (`missed`: it takes apart the step's own members): a
    step's items may contend with what was already in the best (two features sharing one resource), which no item's
    own correction can say; whether they do, only the best without one of those items can tell (`contention`)."""
    out = []
    active = method.active_items()
    for e in method.experiments:
        if e.reverts or not e.plan_items or e.kind != "change":
            continue
        held = set(e.plan_items) <= set(active)
        if (e.verdict == "adopted") != held or (not held and (e.verdict not in ("no_gain", "regressed")
                                                              or (e.predicted_change_pct or 0.0) < band)):  # fmt: skip
            continue
        if not off_prediction(method, e, band) or (d := miss(method, e)) is None or d > 0:
            continue
        before = tuple(i for i in active if i not in e.plan_items and i in method.plan.item_ids()
                       and (x := method.adopted_by(i)) is not None and (x.id or 0) < (e.id or 0))  # fmt: skip
        if before:
            out.append((e, method.judge(e).change_pct or 0.0, e.predicted_change_pct or 0.0, before))
    return out


def contention(
    method: Method, estimate: Callable[..., Any], band: float
) -> list[tuple[tuple[str, ...], str, float, str]]:
    """For each step that fell short on a best it may contend with (`contended`), each of those items not yet taken
    back (the moves take an item back REVERTS times, with the step's items or without: a probe they refuse would
    abort the campaign): (the items to add: none where the step is in the best, else its own; the item to take
    back; the change if the shortfall is the contention's; why), launched like a leave-one-out probe while that
    change beats the band (each configuration once), until one that took an item back is adopted after the step.
    `estimate` is the search's (items, reverts) -> Estimate. The corrected model already puts the shortfall on the
    step's own items, on the best with and without the item alike: if the two contend instead, the best without it
    gains that shortfall back on top of the model's change."""
    out = []
    active = set(method.active_items())
    for e, got, said, before in contended(method, band):
        if any((x.id or 0) > (e.id or 0) and x.verdict == "adopted" and x.reverts for x in method.experiments):
            continue  # a probe was adopted: the contention is found (and the best it fell short on is gone)
        items = () if set(e.plan_items) <= active else tuple(e.plan_items)
        for item_id in before:
            if not may_take_back(method, item_id):
                continue
            est = estimate(items, (item_id,))
            if est.source != "twin" or est.crash or est.change_pct is None:
                continue
            back = est.change_pct + (said - got)
            step = "+".join(e.plan_items)
            what = f"{step} without {item_id}" if items else f"without {item_id}"
            why = (f"contention check of experiment {e.number} ({step} measured {got:+.1f}% against {said:+.1f}% "
                   f"predicted on a best holding {item_id}): {what}: {est.note}; {back:+.1f}% if {step} "
                   f"and {item_id} contend on this target")  # fmt: skip
            out.append((items, item_id, back, why))
    return out


def contentions(method: Method, band: float) -> list[tuple[m.Experiment, m.Experiment, str]]:
    """What the contention checks found: (the step that fell short, the adopted launch that took an earlier item of
    its best back, with the step's items where the step was not adopted, and measured above its prediction by more
    than the band (`band`, in %), that item): the two contend on this target. The step is the one that fell short
    most, of those launched after the item came and before that launch (adopted ones still in the best)."""
    out = []
    active = set(method.active_items())
    for x in method.experiments:
        if x.verdict != "adopted" or len(x.reverts) != 1 or not off_prediction(method, x, band):
            continue
        item_id, gained = x.reverts[0], miss(method, x) or 0.0
        came = [(y.id or 0) for y in method.experiments if y.verdict == "adopted" and item_id in y.plan_items
                and (y.id or 0) < (x.id or 0)]  # fmt: skip
        short = [
            e for e in method.experiments
            if came and min(came) < (e.id or 0) < (x.id or 0) and e.plan_items and not e.reverts
            and item_id not in e.plan_items and off_prediction(method, e, band) and (miss(method, e) or 0.0) < 0
            and ((e.verdict == "adopted" and not x.plan_items and set(e.plan_items) <= active)
                 or (e.verdict != "adopted" and x.plan_items == e.plan_items))
        ]  # fmt: skip
        if gained > 0 and short:
            out.append((min(short, key=lambda e: miss(method, e) or 0.0), x, item_id))
    return out


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


def may_take_back(method: Method, item_id: str) -> bool:
    """Whether an adopted item may be taken back again: fewer than REVERTS launches took it back. The moves' rule
    (tools/method/compute.py) and every step of the search's that takes an item back ask this, so the search never
    proposes a step the moves refuse (the autopilot refused is an aborted campaign)."""
    return revert_launches(method, item_id) < REVERTS


def riders(method: Method) -> tuple[str, ...]:
    """The best configuration's riders (the module docstring), in plan order: each came in with an adopted step of
    several plan items, was never launched alone, and no launch after that step left it out (a probe, a revert)."""
    if method.best() is None:
        return ()
    out = []
    for item_id in method.active_items():
        e = method.adopted_by(item_id)
        if e is None or item_id not in method.plan.item_ids() or len(e.plan_items) < 2 or own_launches(method, item_id):
            continue
        members = set(e.plan_items)
        left_out = any(
            (x.id or 0) > (e.id or 0) and _launched(method, x)
            and (item_id in x.reverts or (members - {item_id} <= set(x.plan_items) and item_id not in x.plan_items))
            for x in method.experiments
        )  # fmt: skip
        if not left_out:
            out.append(item_id)
    return tuple(i for i in method.plan.item_ids() if i in out)


def checked_as_said(method: Method, band: float) -> bool:
    """Whether a launch took adopted items back from the best configuration as it is and measured as the twin said
    (within the band, `band` in %): the riders' checks end there (end_check)."""
    best = method.best()
    return best is not None and any(
        (x.id or 0) > (best.id or 0) and x.reverts and not x.plan_items and _launched(method, x)
        and not off_prediction(method, x, band)
        for x in method.experiments
    )  # fmt: skip


def together(estimate: Callable[[tuple[str, ...]], Any], ids: tuple[str, ...], band: float) -> tuple[str, ...]:
    """The items of `ids` one launch checks the twin on together: in their order, each that keeps the twin's corrected
    prediction of them all (`estimate`: a tuple of ids -> its Estimate, tools/search.py) above a loss of the band
    (`band`, in %). One the twin predicts would cost with the others (settled in another context, or spoiling them),
    would crash, or cannot predict waits: a later check, or none."""
    out: tuple[str, ...] = ()
    for item_id in ids:
        est = estimate((*out, item_id))
        if est.source == "twin" and not est.crash and est.change_pct is not None and est.change_pct > -band:
            out = (*out, item_id)
    return out


def twin_off(method: Method, band: float) -> bool:
    """Whether a change measured on the plan's workload in this campaign differs from the prediction made before its
    launch by more than the band (`band`, in %): the twin has been wrong on this target, and what it settled
    unmeasured is doubted even where the plan agrees."""
    return any(off_prediction(method, e, band) for e in method.experiments)


def off_prediction(method: Method, e: m.Experiment, band: float) -> bool:
    """Whether change `e`, judged on the plan's workload, measured off the prediction made before its launch by more
    than the band (`band`, in %) and by more than OFF_SE standard errors of its measured change (the run-to-run noise
    taken at least SD_FLOOR_PCT, over its runs and its base's as they are now): on noisy runs a miss the noise alone
    explains is no sign that the twin is wrong on this target (a change measured once against a base measured
    twice, on runs that scatter 1.8%, has a standard error of 2.2 points: 3.5 points off its prediction is no miss)."""
    if (d := miss(method, e)) is None or abs(d) <= band:
        return False
    base = method.experiment(e.base_experiment_id)
    runs, base_runs = method.run_count(e), method.run_count(base) if base is not None else 0
    return abs(d) > OFF_SE * method.floored_se(e, runs, base_runs)


def _settled(method: Method, item: m.PlanItem) -> m.Experiment | None:
    """The record of `item` where the twin settled it unmeasured (its last verdict `predicted`, never launched), else
    None."""
    final = method.final(item)
    last = final[-1] if final else None
    return last if last is not None and last.verdict == "predicted" and launches(method, item.id) == 0 else None


def doubted(method: Method, items: list[m.PlanItem], band: float) -> tuple[str, ...]:
    """The items in doubt (the module docstring): settled `predicted` by the twin inside the band (`band`, in %) and
    never launched, whatever the plan expects of them; in plan order."""
    out = {
        item.id
        for item in items
        if (last := _settled(method, item)) is not None and last.predicted_change_pct is not None
        and -band < last.predicted_change_pct < band
    }  # fmt: skip
    return tuple(i for i in method.plan.item_ids() if i in out)


def leaned(method: Method, items: list[m.PlanItem], band: float) -> tuple[str, ...]:
    """The items whose one launch was judged no gain on one run that measured above the twin's prediction inside the
    band (`band`, in %), once the twin has missed on this target (`twin_off`): a verdict that leaned on the twin's
    word (one run, read with the twin's prediction), checked once more on the best as it is now; in plan order."""
    out = []
    for item in items:
        final = method.final(item)
        last = final[-1] if final else None
        if last is None or last.verdict != "no_gain" or launches(method, item.id) != 1 or method.run_count(last) != 1:
            continue
        p = last.predicted_change_pct
        if p is not None and -band < p < band and (method.judge(last).change_pct or 0.0) > p:
            out.append(item.id)  # measured above the prediction: the twin's word pulled the verdict down
    return tuple(i for i in method.plan.item_ids() if i in out) if out and twin_off(method, band) else ()


Z_CREDIBLE = 1.645  # a gain is credible where its one-sided 95% upper bound clears the band


def settled_losses(method: Method, estimate: Callable[..., Any], items: list[m.PlanItem],
                   band: float) -> tuple[str, ...]:  # fmt: skip
    """The one item (the likeliest to pay: the highest corrected change alone on the best) of those the twin settled
    `predicted` and never launched that cost the band (`band`, in %) or more, as recorded or on the best now (an item
    recorded inside the band in another context that the twin now puts at a loss is no longer in doubt, `together`,
    and would otherwise never be checked), whose launch the twin can predict, would not crash, and was not measured;
    () when there is none. The caller checks one while none has been (`loss_checked`), and each once the twin has
    missed on this target (`twin_off`): its word that an item costs settled it as it settles the items in doubt."""
    out: dict[str, float] = {}
    for item in items:
        if (last := _settled(method, item)) is None or not item_changes(method, item):
            continue
        est = estimate((item.id,))
        if est.source != "twin" or est.crash or est.change_pct is None or method.ran(est.config):
            continue
        if est.change_pct <= -band or (last.predicted_change_pct is not None and last.predicted_change_pct <= -band):
            out[item.id] = est.change_pct
    return (max(out, key=lambda k: out[k]),) if out else ()


LOSS_WORDS = "the twin settled it unmeasured as a loss"


def loss_checked(method: Method) -> bool:
    """Whether an item the twin settled as a loss has been launched to check it (`settled_losses`): the one check of
    the twin's word on its losses where it has been right here."""
    return any(_launched(method, x) and LOSS_WORDS in (x.hypothesis or "") for x in method.experiments)


REVERTS = 1  # launches that take an adopted item back, per item (the search's, and the moves' guard)
OPTIMISTIC_WORDS = "the corrected model cannot rule out a gain past the band"
OPTIMISTIC_AS_SAID = 2  # the optimistic checks on one best that may measure as the model said before they end


def optimistic(method: Method, estimate: Callable[..., Any], items: list[m.PlanItem],
               band: float) -> tuple[tuple[str, ...], tuple[str, ...], Any] | None:  # fmt: skip
    """The move the corrected model's uncertainty most allows to pay (the module docstring): of an item added to the
    best, an adopted item taken back, or both at once, each unmeasured and each added item launched before (its term
    informed by a measurement), the one likeliest to gain the band (the highest (change - band) / sd), where its
    one-sided 95% upper bound clears the band; as (items, reverts, its Estimate). None once OPTIMISTIC_AS_SAID checks
    after the best configuration measured as the corrected model said (within the band of its prediction; one that
    adopts makes a new best with checks of its own), or when no move's bound clears the band. `items`: those the
    search may add."""
    best = method.best()
    if best is None or sum(
        (x.id or 0) > (best.id or 0) and _launched(method, x) and OPTIMISTIC_WORDS in (x.hypothesis or "")
        and not off_prediction(method, x, band)
        for x in method.experiments
    ) >= OPTIMISTIC_AS_SAID:  # fmt: skip
        return None  # this best had its checks, measured as the corrected model said
    ids = method.plan.item_ids()
    held = [i for i in method.active_items() if i in ids]
    back = [i for i in held if may_take_back(method, i)]
    adds = [(it.id,) for it in items if it.id not in held and item_changes(method, it) and launches(method, it.id)]
    moves = [(a, ()) for a in adds] + [((), (r,)) for r in back] + [(a, (r,)) for a in adds for r in back]
    out: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[float, Any]] = {}
    for move in moves:
        est = estimate(*move)
        if est.source != "twin" or est.crash or est.change_pct is None or not est.sd_pct or method.ran(est.config):
            continue
        if (up := credible(est.change_pct, est.sd_pct)) is not None and up >= band:
            out[move] = ((est.change_pct - band) / est.sd_pct, est)
    if not out:
        return None
    (add, taken), (_, est) = max(out.items(), key=lambda kv: kv[1][0])
    return add, taken, est


def unisolated(method: Method, items: list[m.PlanItem]) -> tuple[str, ...]:
    """The members of combined steps that fell short of their prediction (`missed`) whose own effect was never
    isolated (each launch of theirs judged with other members), not in the best configuration, of the steps none of
    whose members has been launched alone since (one isolation per missed step); in plan order. The caller launches
    one alone where the corrected model still gives it a credible gain (`credible`)."""
    active, ids = set(method.active_items()), {it.id for it in items}
    out = set()
    for e, _, _ in missed(method):
        after = [x for x in method.experiments if (x.id or 0) > (e.id or 0) and _launched(method, x) and not x.reverts]
        if any(len(x.plan_items) == 1 and x.plan_items[0] in e.plan_items for x in after):
            continue  # a member isolated since: the step's one isolation is spent
        out |= {i for i in e.plan_items if i in ids and i not in active and own_launches(method, i) == 0}
    return tuple(i for i in method.plan.item_ids() if i in out and item_changes(method, method.plan.item(i)))


def item_changes(method: Method, item: m.PlanItem) -> bool:
    """Whether applying `item` changes the best configuration."""
    best = method.best_config()
    return item.apply(best) != best


def credible(change_pct: float | None, sd_pct: float | None) -> float | None:
    """The one-sided 95% upper bound of a corrected change with its sd (%): the gain is credible where it clears the
    band; None without a change."""
    return None if change_pct is None else change_pct + Z_CREDIBLE * (sd_pct or 0.0)


def disagreement(method: Method, ids: tuple[str, ...]) -> str:
    """What the plan says of the items in doubt `ids`, for a launch's reason: "the plan expects more", or, where an
    item has no number for the session's objective, which items the plan leaves open."""
    objective = method.plan.objective.kind
    band = method.band_pct()
    if all(_plan_agrees(method.plan.item(i), objective, band) for i in ids):
        return (
            f"the plan agrees, but the twin has been off by more than the {band:.1f}% band on this target"
            if twin_off(method, band)
            else "the plan agrees, but two guesses that agree are still guesses: neither measured this target"
        )
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


def put_back(method: Method, blame: Callable[[str], tuple[float, float]]) -> tuple[str, ...]:
    """The items to put back on the best configuration (the module docstring) when the best is a revert of several
    items measured beyond its prediction by more than the band: all it took back but the one blamed, in plan order;
    () otherwise, or once a launch after the best held them all. `blame`: the corrected change of putting an item
    back alone, with its sd (%); the lowest is blamed where it is lower than the others by more than its sd, else the
    measurements cannot tell and the first taken back is (the riders' check takes the likeliest to pay first)."""
    best = method.best()
    if best is None or best.plan_items or len(best.reverts) < 2 or best.predicted_change_pct is None:
        return ()
    if (d := miss(method, best)) is None or d <= method.band_pct():
        return ()
    taken = [i for i in best.reverts if i in method.plan.item_ids()]
    if len(taken) < 2:
        return ()
    culprit, _ = blamed(taken, blame)
    out = tuple(i for i in method.plan.item_ids() if i in taken and i != culprit)
    after = [x for x in method.experiments if (x.id or 0) > (best.id or 0) and _launched(method, x)]
    return () if any(set(out) <= set(x.plan_items) for x in after) else out


def blamed(taken: list[str], blame: Callable[[str], tuple[float, float]]) -> tuple[str, bool]:
    """Of the items a revert took back together (in its order), the one blamed for its surprise (put_back), and
    whether the measurements tell (else it is the first taken back)."""
    said = {i: blame(i) for i in taken}
    low = min(taken, key=lambda i: said[i][0])
    if all(said[i][0] - said[low][0] > said[low][1] for i in taken if i != low):
        return low, True
    return taken[0], False


def end_check(
    method: Method,
    estimate: Callable[..., Any],
    blame: Callable[[str], tuple[float, float]],
    again: list[m.PlanItem],
    band: float,
) -> tuple[tuple[str, ...], tuple[str, ...], str] | None:
    """With nothing else left, the one launch that checks the twin's word alone (the module docstring), as (items,
    reverts, why): the items in doubt added together; else the changes whose no gain leaned on the twin, again; else
    what a revert of several took back put back; else an item never launched alone, alone; else the best's riders
    taken back (together, or one at a time once the twin has missed here). None when there is none, or its
    configuration was measured. `estimate`: (items, reverts) -> the search's corrected Estimate; `blame`: see
    put_back."""
    if group := together(estimate, doubted(method, again, band), band):
        ids, rest = group, ""
        if len(group) > 1 and twin_off(method, band):  # its word that the others add little no longer groups them
            ids = max(((i,) for i in group), key=lambda one: estimate(one).change_pct or 0.0)  # likeliest to pay first
            rest = (f"; {', '.join(i for i in group if i not in ids)} in doubt too, checked after it one at a time: "
                    f"the twin has missed here, and together a gain and a loss would cancel")  # fmt: skip
        est = estimate(ids)
        if not method.ran(est.config):
            why = (f"{' + '.join(ids)}: the twin settled {'each' if len(ids) > 1 else 'it'} unmeasured, inside the "
                   f"{band:.1f}% band; {disagreement(method, ids)}: one launch checks the twin ({est.note}){rest}")  # fmt: skip
            return ids, (), why
    if (ids := together(estimate, leaned(method, again, band), band)) and not method.ran((est := estimate(ids)).config):
        why = (f"{' + '.join(ids)}: judged no gain on one run where the twin predicted a change inside the {band:.1f}% "
               f"band, and the twin has since been off by more than the band on this target: one launch checks "
               f"{'them' if len(ids) > 1 else 'it'} on the best now ({est.note})")  # fmt: skip
        return ids, (), why
    if (ids := put_back(method, blame)) and not method.ran((est := estimate(ids)).config) and (best := method.best()):
        got, said = method.judge(best).change_pct or 0.0, best.predicted_change_pct or 0.0
        culprit, told = blamed([i for i in best.reverts if i in method.plan.item_ids()], blame)
        who = (f"the measurements blame {culprit}" if told else f"the measurements cannot tell which: {culprit}, the "
               "first taken back, is blamed")  # fmt: skip
        why = (f"{' + '.join(ids)} put back: experiment {best.number} took {' + '.join(best.reverts)} back together "
               f"and measured {got:+.1f}% against {said:+.1f}% predicted, so the twin had one of them wrong; {who}: "
               f"one launch tells whether {' + '.join(ids)} paid ({est.note})")  # fmt: skip
        return ids, (), why
    bound = {
        i: up
        for i in unisolated(method, again)
        if (e := estimate((i,))).source == "twin" and not e.crash and (up := credible(e.change_pct, e.sd_pct)) is not None
        and up >= band
    }  # fmt: skip
    i = max(bound, key=lambda k: bound[k]) if bound else None
    if i is not None and not method.ran((est := estimate((i,))).config):
        e, got, said = next(x for x in missed(method) if i in x[0].plan_items)
        why = (f"{i}: launched only inside combined steps, its own effect never isolated; experiment {e.number} "
               f"({'+'.join(e.plan_items)}) measured {got:+.1f}% against {said:+.1f}% predicted, and the corrected "
               f"model still gives {i} a credible gain alone (up to {bound[i]:+.1f}% at 95%): one launch isolates it "
               f"({est.note})")  # fmt: skip
        return (i,), (), why
    off, ended = twin_off(method, band), checked_as_said(method, band)
    if (off or not loss_checked(method)) and (loss := settled_losses(method, estimate, again, band)):
        est, said = estimate(loss), method.final(method.plan.item(loss[0]))[-1].predicted_change_pct or 0.0
        said_text = (
            f"{said:+.1f}%" if said <= -band else f"{said:+.1f}% then, {est.change_pct or 0.0:+.1f}% on the best now"
        )
        why = (f"{loss[0]}: {LOSS_WORDS} ({said_text}), and it has missed by more than the {band:.1f}% band on this "
               f"target, so its word alone no longer settles it: one launch on the best ({est.note})") if off else (
               f"{loss[0]}: {LOSS_WORDS} ({said_text}), the likeliest of its settled losses to pay; a guess is still a "
               f"guess: one launch on the best checks it ({est.note})")  # fmt: skip
        return loss, (), why
    if ended and not off:  # one check per best where the twin has been right here
        return None
    return _riders_check(method, estimate, band, off, ended) or (
        _optimistic_check(method, estimate, band) if off else None
    )


def _optimistic_check(method: Method, estimate: Callable[..., Any],
                      band: float) -> tuple[tuple[str, ...], tuple[str, ...], str] | None:  # fmt: skip
    """The last check once the twin has missed here: the move its uncertainty most allows to pay (`optimistic`)."""
    if (move := optimistic(method, estimate, [it for it in method.plan.items if searchable(it)], band)) is None:
        return None
    add, back, est = move
    what = " + ".join(add) + (" " if add and back else "") + " ".join(f"without {r}" for r in back)
    up = credible(est.change_pct, est.sd_pct) or 0.0
    why = (f"{what}: the twin has missed by more than the {band:.1f}% band on this target and {OPTIMISTIC_WORDS}: "
           f"{est.change_pct:+.1f}% ± {est.sd_pct:.1f}%, up to {up:+.1f}% at 95%, the likeliest of the moves left "
           f"unmeasured to pay: one launch tells ({est.note})")  # fmt: skip
    return add, back, why


def _riders_check(method: Method, estimate: Callable[..., Any], band: float, off: bool,
                  ended: bool) -> tuple[tuple[str, ...], tuple[str, ...], str] | None:  # fmt: skip
    """The best's riders taken back (the module docstring), together, or one at a time once the twin has missed."""
    alone = {i: estimate((), (i,)).change_pct for i in riders(method)}
    order = sorted((i for i, v in alone.items() if v is not None), key=lambda i: -(alone[i] or 0.0))  # likeliest first
    if ended:  # after a check measured as the twin said, only the riders the measurements lean to taking back
        order = [i for i in order if (alone[i] or 0.0) > 0]
    if not (ids := together(lambda r: estimate((), r), tuple(order), band)):
        return None
    if off:  # the twin's word that the others add little is no longer taken: one at a time
        ids = ids[:1]
    est = estimate((), ids)
    if est.change_pct is None or est.change_pct >= band or method.ran(est.config):
        return None
    why = (f"without {' + '.join(ids)}: adopted in a combined step, never measured alone, the twin's word alone keeps "
           f"{'them' if len(ids) > 1 else 'it'} (inside the {band:.1f}% band): one launch checks the twin ({est.note})")  # fmt: skip
    return (), ids, why
