"""The docs toolset: analysis, verdicts, improvement documents and status summaries.

Verdicts go through the method's rules (tools/method.py): nothing inside the measured noise is adopted, a gain
inside it is rerun before it is called no gain, and an item whose flags the engine refuses is ruled out without
launching. Documents are rendered from the ledger by tools/reports/; these tools only ask for them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from pydantic_ai import FunctionToolset, ModelRetry, RunContext

from agent import models as m
from agent.errors import PivotError
from agent.session import Session
from tools import reports, search
from tools.experiments import REFUSAL_CLASS, audit_issues, proposed_config, unmeasurable_item
from tools.lessons import learnt_lines
from tools.method import Judgement, Method, not_measured_text, permitted
from tools.method.compute import moves_of
from tools.numbering import number_of

toolset: FunctionToolset[Session] = FunctionToolset(id="docs", max_retries=3)


class VerdictRecord(BaseModel):
    """An experiment's recorded verdict, and the measurements it rests on."""

    experiment_id: int
    plan_item: str | None
    verdict: m.Verdict
    reason: str
    judgement: Judgement


class DocumentRef(BaseModel):
    """A document pivot wrote: where it is and what it says of itself."""

    path: str
    title: str
    status: str
    number: int | None = Field(default=None, description="A status summary's sequence number.")
    notices: list[str] = Field(default_factory=list, description="E.g. a file edited by hand was left alone.")


@toolset.tool
def analyze(ctx: RunContext[Session], experiment_id: int | None = None) -> dict[str, Any]:
    """Explain an experiment's bottleneck (default: the experiment with the best output tok/s): each level against
    the roofline (rows per expert, arithmetic intensity vs the ridge point, achieved vs peak TFLOPS, bandwidth
    floor), power against the limit, where throughput stops scaling, and the dominant bottleneck with its evidence.
    The findings are recorded in the ledger; status summaries use them."""
    from tools.analysis import analyze as run_analysis

    try:
        result = run_analysis(ctx.deps, experiment_id)
    except PivotError as e:
        raise ModelRetry(f"{e.message}; {e.hint or ''}") from e
    check_plan_quietly(ctx.deps)  # the plan checks read the KV usage the analysis measured: documents follow now
    shown = number_of(ctx.deps, result.experiment_id)
    ctx.deps.emit("tool_result", f"analysis of experiment {shown}: {result.bottleneck or 'no verdict'}")
    return {
        "experiment_id": result.experiment_id,
        "source": result.source,
        "bottleneck": result.bottleneck,
        "summary": result.summary,
        "stops_scaling_at": result.stops_scaling_at,
        "evidence": [f.text for f in result.evidence],
        "secondary": [f.text for f in result.secondary],
    }


def _rule_out_item(session: Session, method: Method, plan_item: str, reason: str) -> m.Experiment:
    """Record a plan item that is not launched as an experiment that never started, with its audit: the engine
    refuses its flags, or every flag it sets is a no-op in this engine version (accepted, read nowhere)."""
    for e in method.experiments:
        if e.plan_item == plan_item and e.verdict == "ruled_out" and method.run_count(e) == 0:
            return e  # already recorded (a resumed run asks again)
    try:
        item = method.plan.item(plan_item)
    except PivotError as e:
        raise ModelRetry(f"{e.message}; {e.hint}") from e
    config = proposed_config(method, plan_item, None, None)
    issues = audit_issues(session, config)
    blocking = [i for i in issues if i.blocking]
    noop = search.noop_reason([i for i in issues if i.flag in (item.flags.names() if item.flags else [])], item)
    if not blocking and noop is None:
        raise ModelRetry(
            f"item {plan_item}'s flags pass the audit ({config}): launch it and measure before ruling it out"
        )
    best = method.best(item.workload_for(method.plan.workload))
    return session.store.add_experiment(
        session.id,
        m.Experiment(
            plan_item=plan_item,
            kind="change",
            title=item.title,
            hypothesis=item.hypothesis,
            config=config,
            base_experiment_id=best.id if best is not None else None,
            workload=item.workload_for(method.plan.workload),
            status="failed" if blocking else "planned",
            verdict="ruled_out",
            reason=reason,
            audit=issues,
            failure=REFUSAL_CLASS.get(blocking[0].status, "argument-validation") if blocking else None,
            finished_at=m.utcnow(),
        ),
    )


def _predicted_item(session: Session, method: Method, plan_item: str, reason: str) -> m.Experiment:
    """Record a plan item that is not launched because the corrected twin predicts it inside the noise band (or a
    loss): an experiment that never started, with the prediction; a prediction, never a measurement."""
    try:
        item = method.plan.item(plan_item)
    except PivotError as e:
        raise ModelRetry(f"{e.message}; {e.hint}") from e
    best = method.best()
    for e in method.experiments:
        if (
            plan_item in e.plan_items
            and e.verdict == "predicted"
            and best is not None
            and e.base_experiment_id == best.id
        ):
            return e  # already recorded on this best (a resumed run asks again)
    est = search.Surrogate(method).estimate((plan_item,))
    band = method.band_pct()
    if est.source != "twin" or not (est.crash or (est.change_pct is not None and est.change_pct < band)):
        raise ModelRetry(
            f"item {plan_item} cannot be recorded as predicted: {est.note or 'no prediction'}; launch it and measure"
        )
    text = reason.strip()
    if "prediction" not in text.lower():
        text += " (a prediction, not a measurement)"
    return session.store.add_experiment(
        session.id,
        m.Experiment(
            plan_item=plan_item,
            kind="change",
            title=item.title,
            hypothesis=item.hypothesis,
            config=est.config,
            base_experiment_id=best.id if best is not None else None,
            workload=method.plan.workload,
            status="planned",
            verdict="predicted",
            reason=text,
            predicted_tok_s=est.tok_s,
            predicted_change_pct=est.change_pct,
            prediction=est.note,
            finished_at=m.utcnow(),
        ),
    )


def _not_measured_item(session: Session, method: Method, plan_item: str, reason: str) -> m.Experiment:
    """Record a plan item the engine cannot measure (it models none of the flags the item changes) as an
    experiment that was never launched, with the verdict not_measured."""
    for e in method.experiments:
        if e.plan_item == plan_item and e.verdict == "not_measured" and method.run_count(e) == 0:
            return e  # already recorded (a resumed run asks again)
    try:
        method.plan.item(plan_item)
    except PivotError as err:
        raise ModelRetry(f"{err.message}; {err.hint}") from err
    e = unmeasurable_item(session, method, plan_item)
    if e is None:
        raise ModelRetry(
            f"the engine models what item {plan_item} changes (or refuses its flags): audit it, launch it and measure it"
        )
    why = not_measured_text(method.unmodelled_change(e)[1])
    text = reason.strip() if why in reason else f"{why}. {reason.strip()}".strip()
    return session.store.add_experiment(
        session.id,
        e.model_copy(update={"status": "finished", "verdict": "not_measured", "reason": text,
                             "finished_at": m.utcnow()}),
    )  # fmt: skip


@toolset.tool
def record_verdict(
    ctx: RunContext[Session],
    verdict: m.Verdict,
    reason: str,
    experiment_id: int | None = None,
    plan_item: str | None = None,
) -> VerdictRecord:
    """Record an experiment's verdict and the measured reason for it (numbers, levels, experiment ids).

    verdict: baseline (the reference measurement) | adopted (beats the noise band: it becomes the best config) |
    no_gain (inside the noise) | regressed (worse beyond the noise) | crashed (failed to start or under load; say
    the classified reason) | ruled_out (not worth or not possible to run) | inconclusive | measured (a measurement
    that changes nothing, such as the profile a profile item asks for) | not_measured (the engine does not model
    the flags the change touches, e.g. the twin and --enable-torch-compile: its numbers cannot show the change) |
    predicted (not launched: the twin, corrected to this campaign's measurements, predicts it inside the noise band
    or at a loss) | superseded (it gained beyond the band on its base, but another change run beside it in the same
    step became the best; judge the step's largest gain first).
    Give `experiment_id`; to rule out a plan item whose flags the engine refuses or ignores (every flag a no-op),
    without launching it, give `plan_item` and verdict ruled_out instead; for a plan item the engine does not
    model, `plan_item` and verdict not_measured (no launch is spent on it); to skip an item the twin predicts
    inside the noise, `plan_item` and verdict predicted (the prediction is checked and recorded). The method is
    enforced: `adopted` needs a gain beyond the noise
    band, a gain inside the band must be rerun before it is judged, and a verdict needs measurements.
    """
    session = ctx.deps
    store = session.store
    method = Method.read(store, session.id)
    if not reason.strip():
        raise ModelRetry("give the reason, with the measured numbers")
    if experiment_id is None:
        if plan_item is None:
            raise ModelRetry("give experiment_id (or plan_item with verdict ruled_out, not_measured or predicted)")
        if verdict not in ("ruled_out", "not_measured", "predicted"):
            raise ModelRetry(
                "without an experiment only ruled_out, not_measured or predicted can be recorded; launch and measure "
                "it first"
            )
        if verdict == "ruled_out":
            e = _rule_out_item(session, method, plan_item, reason)
        elif verdict == "predicted":
            e = _predicted_item(session, method, plan_item, reason)
        else:
            e = _not_measured_item(session, method, plan_item, reason)
        method = Method.read(store, session.id)
        j = method.judge(e)
        if verdict != "predicted":
            e = store.update_experiment(e.model_copy(update={"verdict": verdict, "reason": e.reason or reason.strip()}))
        why = (e.reason or "").removeprefix("not launched: ")  # the reason says it already: not twice
        session.emit("tool_result", f"item {plan_item}: {verdict}, not launched: {why}")
        return VerdictRecord(
            experiment_id=e.id or 0, plan_item=e.plan_item, verdict=verdict, reason=e.reason or "", judgement=j
        )
    found = method.experiment(experiment_id)
    if found is None:
        raise ModelRetry(f"no experiment {number_of(session, experiment_id)} in this session")
    e = found
    j = method.judge(e)
    _check_verdict(method, e, verdict, j)
    reason = reason.strip()
    if verdict == "not_measured" and j.text not in reason:
        reason = f"{j.text}. {reason}" if reason != j.text else reason
    e = store.update_experiment(e.model_copy(update={"verdict": verdict, "reason": reason}))
    session.emit("tool_result", f"experiment {e.number} ({e.plan_item or e.kind}): {verdict}: {reason}")
    return VerdictRecord(
        experiment_id=e.id or 0, plan_item=e.plan_item, verdict=verdict, reason=e.reason or "", judgement=j
    )


def _check_verdict(method: Method, e: m.Experiment, verdict: m.Verdict, j: Judgement) -> None:
    """Refuse (as a retry) any verdict but the one the method's judgement `j` of `e` permits: a measured -87% is
    regressed, never no_gain, measured or inconclusive (the same `permitted` the moves read)."""
    if e.verdict is not None:
        raise ModelRetry(f"experiment {e.number} already has its verdict ({e.verdict}): {e.reason or ''}")
    allowed = permitted(method, e, j)
    if verdict == "not_measured" and "not_measured" not in allowed:
        raise ModelRetry(
            f"experiment {e.number} cannot be judged not_measured: the engine models what it changes ({j.text})"
        )
    if not allowed and j.suggestion == "rebase":
        raise ModelRetry(
            f"not judged yet: {j.text}. Measure its base again first (launch_server with experiment_id="
            f"{method.number(e.base_experiment_id)}, then run_benchmark)"
        )
    if not allowed and j.suggestion == "rerun":
        raise ModelRetry(
            f"not judged yet: {j.text}. Rerun experiment {e.number} first (launch_server with experiment_id, then "
            "run_benchmark)"
        )
    if verdict not in allowed:
        want = " or ".join(allowed) if allowed else "nothing yet"
        raise ModelRetry(
            f"experiment {e.number} cannot be judged {verdict}: {j.text}. Its numbers permit {want}"
            + (f" (a change is adopted only beyond the {j.band_pct:.1f}% noise band)" if verdict == "adopted" else "")
        )


def check_plan_quietly(session: Session) -> None:
    """The plan checks (tools/analysis/ `check_plan`), recorded before a document or summary is written so an
    item with a physics or direction error carries it before any launch; a plan the checks cannot read (no model
    profile) is left unchecked, with a notice."""
    from tools.analysis import check_plan

    try:
        check_plan(session)
    except PivotError as e:
        message = f"plan checks skipped: {e.message}"
        if message not in session.notices:
            session.notices.append(message)


class CandidateView(BaseModel):
    """One step the search could take next, with the corrected twin's prediction."""

    plan_items: list[str] = Field(description="Launch them together: launch_server(plan_items=...) or plan_item=.")
    kind: str = Field(description="single, combined (items that interact, one experiment) or retest.")
    predicted_change_pct: float | None = Field(description="Against the best's measured mean; None: unknown.")
    source: str = Field(description="twin (corrected to this campaign) or plan (the plan's expected impact).")
    why: str


@toolset.tool
def search_candidates(ctx: RunContext[Session], limit: int = 8) -> dict[str, Any]:
    """The search's candidates in the tiers opened so far, best predicted gain first: single items, retests and
    combined steps of items that interact, each with the digital twin's prediction corrected to this campaign's
    measurements (a prediction, not a measurement), and the noise band a launch must beat. Launch the first one whose
    prediction beats the band; an item predicted inside the band can be recorded with verdict predicted instead."""
    from tools import search

    moves = moves_of(ctx.deps)
    method = moves.method
    ranked = search.candidates(method, moves.decision)
    return {
        "band_pct": method.band_pct(),
        "candidates": [
            CandidateView(
                plan_items=list(c.items),
                kind=c.kind,
                predicted_change_pct=c.estimate.change_pct,
                source=c.estimate.source,
                why=c.why,
            ).model_dump()
            for c in ranked[: max(1, limit)]
        ],
    }


def _ref(session: Session, doc: m.Document, start: int) -> DocumentRef:
    return DocumentRef(
        path=doc.path, title=doc.title, status=doc.status, number=doc.number, notices=session.notices[start:]
    )


@toolset.tool
def write_improvement_doc(ctx: RunContext[Session], plan_item: str) -> DocumentRef:
    """Write (or bring up to date) the improvement document of one plan item, e.g. "03": the idea, why, what it
    should do, the risks, and once tested its measured result and verdict. Write every item's document before the
    first experiment, and again after its verdict. A document edited by hand is left alone (a new version is
    written beside it)."""
    start = len(ctx.deps.notices)
    check_plan_quietly(ctx.deps)  # from the first document on, before any launch (a few ms)
    try:
        doc = reports.write_improvement_doc(ctx.deps, plan_item)
    except PivotError as e:
        raise ModelRetry(f"{e.message}; {e.hint or ''}") from e
    ctx.deps.emit("info", f"document {doc.path}: {doc.status}")
    return _ref(ctx.deps, doc, start)


def latest_status_is_asked(session: Session) -> bool:
    """Whether the newest status summary already went with a pivot (so the next one gets a new number)."""
    latest = reports.latest_status_doc(session.store.documents(session.id))
    if latest is None:
        return True
    return any(p.summary_path == latest.path for p in session.store.pivots(session.id))


@toolset.tool
def write_status_summary(ctx: RunContext[Session], question: str, options: list[str]) -> DocumentRef:
    """Write the status summary for a pivot point: the best results per level, every experiment with its verdict,
    the approaches ruled out and why, the root cause, the next steps, and `question` with its `options` for the
    user. Then call ask_user with the same question and options."""
    if not question.strip():
        raise ModelRetry("the summary ends with a question for the user: give it")
    session = ctx.deps
    start = len(session.notices)
    new = latest_status_is_asked(session)  # a summary written for a pivot that was never asked is rewritten
    check_plan_quietly(session)
    try:
        options = [o.strip() for o in options if o.strip()]
        session.emit("progress", "status summary: what the campaign learnt about the twin")
        learnt = learnt_lines(session)
        session.emit("progress", "status summary: the analysis, the markdown, its HTML and charts")
        doc = reports.write_status_summary(session, question.strip(), options, new=new, html=True, learnt=learnt)
    except PivotError as e:
        raise ModelRetry(f"{e.message}; {e.hint or ''}") from e
    session.emit("info", f"status summary {doc.path}")
    return _ref(session, doc, start)
