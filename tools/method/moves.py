"""The method's moves: one value, computed from the plan, the ledger and the answers, of everything that may happen
next. The guard refuses exactly what it does not contain (and shows a model only what it does), the autopilot and
the search choose only from it, and the loop asks it whether the campaign is finished: one computation, four
readers.

The moves go in phases, each waiting for the one before (and nothing at all happens while a question waits for the
user's answer: the phase `asked`):

1. documents: the improvement document of every plan item before the first experiment;
2. the baseline: launched, rerun until its runs measure the noise (two at least; more, up to BASELINE_RUNS_MAX,
   while the band is wider than twice the floor or than the plan's typical expected effect), then judged; a
   baseline that did not start (or whose benchmark the server refused) owes a pivot that says what to fix;
3. judging: every measured experiment gets the one verdict its judgement permits (or the rerun it asks for) before
   anything else is launched;
4. a pivot, when one is owed: an answer that was not understood, a refused benchmark, a promising item that
   crashed, `stall_after` changes in a row without gain, or the end of the open tiers' work (that pivot closes
   them: `Pivot.closes_tiers` records it when it is asked). The last tier ends without a pivot when nothing is left
   to offer but stop;
5. the work: items asked for at a pivot (as asked), then the search's steps in the released tiers (launches,
   retests, combined steps, reverts; items settled without a launch), then the plan's order for what the search
   does not rank; an LLM may launch any released item alone or with others, the bounded crash retry, a revert, and
   rerun any measured experiment;
6. finished: nothing left to do, or a stop.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

from agent import models as m
from agent.session import Session
from tools import reports
from tools.method.answers import Decision
from tools.method.reading import Judgement, Method
from tools.method.step import Step

BASELINE_RUNS_MAX = 4  # runs of the baseline at most, when the noise band is too wide to tell changes apart
PROMISING_FACTOR = 2.0  # a plan item is promising when it expects at least this times the noise floor
BENCHMARK_REFUSED = ("request-refused", "benchmark-refused")  # failure classes of a benchmark the server refused
Phase = Literal["asked", "documents", "baseline", "judge", "pivot", "work", "finished"]
PivotKind = Literal["clarify", "baseline", "benchmark", "objective", "crash", "stall", "tier", "requested"]
SETTLE_VERDICTS = ("ruled_out", "predicted", "not_measured")


def baseline_runs_needed(method: Method) -> int:
    """Runs of the baseline before its verdict: two at least (their spread is the noise); a third when the measured
    band is wider than the plan's typical expected effect (the median of its flag and config items' expected
    midpoints), and one more at a time, up to BASELINE_RUNS_MAX, while it is wider than twice the floor: a band
    that separates nothing."""
    need = max(2, 1 + method.settings.reruns)
    base = method.baseline()
    if base is None or method.run_count(base) < need:
        return need
    runs, noise = method.run_count(base), method.noise_pct()
    if noise is None or runs >= BASELINE_RUNS_MAX:
        return runs
    effect = expected_effect_pct(method.plan)
    floor = method.settings.min_gain_pct
    too_wide = noise > 2 * floor or (runs < 3 and effect is not None and noise > max(effect, floor))
    return runs + 1 if too_wide else runs


def expected_effect_pct(plan: m.Plan) -> float | None:
    """The plan's typical expected effect: the median midpoint of its flag and config items' expected gains."""
    mids = [
        e.gain_pct
        for it in plan.items
        if it.kind in ("flag", "config", "power") and (e := reports.parse_expectation(it.expected_impact)) is not None
        and e.speaks_for(plan.objective.kind) and e.gain_pct > 0
    ]  # fmt: skip
    return statistics.median(mids) if mids else None


def promising(method: Method, item: m.PlanItem | None) -> bool:
    if item is None:
        return False
    exp = reports.parse_expectation(item.expected_impact)
    return (
        exp is not None
        and exp.speaks_for(method.plan.objective.kind)
        and exp.gain_pct >= PROMISING_FACTOR * method.settings.min_gain_pct
    )


@dataclass(frozen=True)
class PivotDue:
    """A pivot the method owes now: why, the tiers it closes (their work is done), and what it is about."""

    kind: PivotKind
    closes: tuple[int, ...] = ()
    why: str = ""
    experiment_id: int | None = None  # the crashed change, the refused benchmark, the baseline that did not start


@dataclass
class Refusal:
    """Why a call is not among the moves: the rule it breaks, in words, and the moves that are allowed."""

    rule: str
    why: str
    allowed: list[str]

    def text(self) -> str:
        allowed = "; ".join(self.allowed) if self.allowed else "nothing but reads and documents"
        return f"refused by the method ({self.rule}): {self.why}. Allowed now: {allowed}"


@dataclass
class Moves:
    """Everything that may happen next in one session (see the module docstring)."""

    method: Method
    decision: Decision
    phase: Phase
    why: str = ""  # what the phase waits for, in words
    baseline: bool = False  # a baseline of the plan's workload may be launched
    workload_baselines: frozenset[str] = frozenset()  # items whose own workload's baseline may be launched
    items: frozenset[str] = frozenset()  # items that may be launched on the best configuration, alone or together
    profiles: frozenset[str] = frozenset()
    retries: dict[str, int] = field(default_factory=dict)  # item -> the cap of its bounded retry stays below this
    reverts: frozenset[str] = frozenset()  # adopted items that may be taken back
    reruns: dict[int, str] = field(default_factory=dict)  # experiment -> why it may be rerun
    verdicts: dict[int, tuple[m.Verdict, ...]] = field(default_factory=dict)  # measured, not judged -> permitted
    settle: dict[str, dict[m.Verdict, str]] = field(default_factory=dict)  # item -> verdict -> why, no launch
    steps: list[Step] = field(default_factory=list)  # the work proposed, in order (all of it allowed)
    offers: list[tuple[str, str]] = field(default_factory=list)  # what a pivot now could offer besides stop
    pivot: PivotDue | None = None
    judgements: dict[int, Judgement] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.phase == "finished"

    @property
    def launches(self) -> bool:
        """Whether any launch is allowed now."""
        return bool(
            self.baseline or self.workload_baselines or self.items or self.profiles or self.retries or self.reverts
            or self.reruns
        )  # fmt: skip

    # ---- what a call is, against the moves

    def allowed_text(self) -> list[str]:
        """The allowed moves, one short line each (for refusals and for the model's tool descriptions)."""
        out: list[str] = []
        if self.pivot is not None:
            out.append(f"a pivot ({self.pivot.kind}: {self.pivot.why}): write_status_summary, then ask_user")
        if self.baseline:
            out.append("launch_server baseline=True")
        for i in sorted(self.workload_baselines):
            out.append(f"launch_server baseline=True plan_item={i!r} (its workload's baseline)")
        for eid, verdicts in sorted(self.verdicts.items()):
            out.append(f"record_verdict experiment_id={self.method.number(eid) or eid} verdict={'|'.join(verdicts)}")
        for eid, why in sorted(self.reruns.items()):
            if self.phase in ("baseline", "judge") or why != "a rerun adds a run":
                out.append(f"launch_server experiment_id={self.method.number(eid) or eid} ({why})")
        if self.phase == "work" and any(why == "a rerun adds a run" for why in self.reruns.values()):
            out.append("launch_server experiment_id=N to rerun a measured experiment")
        if self.items:
            out.append(f"launch_server plan_item or plan_items from {', '.join(sorted(self.items))}")
        for i in sorted(self.profiles):
            out.append(f"launch_server plan_item={i!r} (a profile of the best configuration)")
        for i, cap in sorted(self.retries.items()):
            out.append(f"launch_server plan_item={i!r} flags='--max-running-requests N' with N < {cap}")
        for i in sorted(self.reverts):
            out.append(f"launch_server revert_items=[{i!r}] (take {i} back)")
        for i, verdicts in sorted(self.settle.items()):
            out.append(f"record_verdict plan_item={i!r} verdict={'|'.join(verdicts)}")
        if self.finished:
            out.append("the final status summary (write_status_summary), then end")
        return out


_CACHE: dict[str, tuple[tuple, Moves]] = {}  # session id -> (the ledger's signature, its moves)


def _signature(session: Session, method: Method) -> tuple:
    """Everything the moves are computed from, compactly: the session's record, its experiments and their runs,
    its pivots, which documents exist, the profiles recorded, and the engine the session holds."""
    store = session.store
    docs = tuple(sorted({d.plan_item or "" for d in store.documents(session.id) if d.kind == "improvement"}))
    evidence = len(store.findings(session.id, kind="evidence"))
    exps = tuple(
        (e.id, e.status, e.verdict, e.config, e.reverts, e.failure, method.run_count(e)) for e in method.experiments
    )
    pivots = tuple((p.id, p.answer, p.closes_tiers) for p in method.pivots)
    return (method.record.model_dump_json(exclude={"updated_at", "status"}), exps, pivots, docs, evidence,
            id(session.engine))  # fmt: skip


def permitted(method: Method, e: m.Experiment, j: Judgement) -> tuple[m.Verdict, ...]:
    """The verdicts a measured experiment may be given: exactly what its judgement says (a -87% change is
    regressed, never no_gain, measured or inconclusive); none while it waits for a run. Inconclusive only for a
    measurement with no level to compare (nothing completed on both sides)."""
    if j.suggestion in ("rerun", "rebase") or e.status == "running":
        return ()
    if j.suggestion == "pending":  # measured, but with no level to compare against its base
        return ("inconclusive",) if method.run_count(e) > 0 else ()
    if e.kind == "baseline":
        return ("baseline",) if j.suggestion == "baseline" else (j.suggestion,)  # type: ignore[return-value]
    item = method.plan.item(e.plan_item) if e.plan_item in method.plan.item_ids() else None
    if item is not None and item.kind == "profile" and j.suggestion not in ("crashed", "ruled_out"):
        return ("measured",) if profiled(method, e) else ()
    if j.suggestion == "baseline":
        return ()
    return (j.suggestion,)  # type: ignore[return-value]


def profiled(method: Method, e: m.Experiment) -> bool:
    """Whether the experiment's profile was recorded (a profile item's measurement)."""
    findings = method.store.findings(method.record.id, experiment_id=e.id, kind="evidence")
    return any(k.startswith("profile_") for f in findings for k in f.values)


def measured_unjudged(method: Method, e: m.Experiment) -> bool:
    """Measured (or failed to start) and waiting for its verdict."""
    if e.verdict is not None:
        return False
    return e.status in ("finished", "failed") or (e.status == "interrupted" and method.run_count(e) > 0)


# ---- answers: what the user asked for, as a step


def revert_text(method: Method, item_id: str, by: tuple[str, ...] = ()) -> str:
    """Why an adopted item is worth taking back, in words: the changes adopted after it made it a brake (or the
    items `by`, launched with its revert, make it one)."""
    plan = method.plan
    if by:
        who = " + ".join(f"{i} {plan.item(i).title}" for i in by)
        return f"{who} make{'s' if len(by) == 1 else ''} {item_id} {plan.item(item_id).title} a brake"
    adopted = method.adopted_by(item_id)
    later = [i for e in method.chain() if adopted is not None and (e.id or 0) > (adopted.id or 0) for i in e.plan_items]
    who = " + ".join(f"{i} {plan.item(i).title}" for i in dict.fromkeys(later)) or "the changes adopted since"
    return f"{who} made {item_id} {plan.item(item_id).title} a brake"


def as_asked(method: Method, item: m.PlanItem, since: Any) -> Step:
    """How the user asked for `item` at a pivot: a combined step ("test 05+06 together"), a bounded retry ("retry
    07 with --max-running-requests 512"), a revert ("drop 01"), its workload's baseline first, else the item."""
    plan = method.plan
    why = "asked for at a pivot"
    if not method.workload_ready(item):
        return Step("launch", (item.id,), f"{why}: its workload's baseline first", baseline=True)
    if item.kind == "workload" and item.flags is None and not item.remove_flags:
        return Step("launch", (item.id,), why, baseline=True)
    for p in method.pivots:
        if p.answer is None or (p.answered_at or p.asked_at) != since:
            continue
        text = p.answer.strip()
        numbered = re.fullmatch(r"\d+", text) and p.options and 1 <= int(text) <= len(p.options)
        if numbered and text not in plan.item_ids():
            text = p.options[int(text) - 1]
        combined = re.match(r"test (\d{2,3}(?:\+\d{2,3})+) together", text)
        if combined:
            ids = [i for i in combined.group(1).split("+") if i in plan.item_ids()]
            if item.id in ids and len(ids) > 1:
                return Step("launch", tuple(ids), why)
        retry = re.match(r"retry (\d{2,3}) .*?(--max-running-requests \d+)", text)
        if retry and retry.group(1) == item.id:
            return Step("launch", (item.id,), why, flags=retry.group(2))
        if re.match(rf"(drop|revert|take back) {item.id}\b", text.lower()) and item.id in method.active_items():
            return Step("launch", (), f"{why}: {revert_text(method, item.id)}", reverts=(item.id,))
    return Step("launch", (item.id,), why)


def request_done(method: Method, item: m.PlanItem, since: Any) -> bool:
    """Whether what was asked for since `since` was done: the item judged (alone or combined), or taken back."""
    if method.done(item, since=since):
        return True
    return any(item.id in e.reverts and e.verdict is not None and e.created_at > since for e in method.experiments)
