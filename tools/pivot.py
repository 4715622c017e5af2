"""The pivot toolset: stop and ask the user which way to go.

ask_user is a deferred tool: it records the question (with the latest status summary) in the ledger and ends the
run; `pivot resume SESSION --answer TEXT` (or the TUI) gives the answer back as the tool's result and the run goes
on where it stopped. A pivot asked when the open tiers' work is done records that it closes them (the method's moves
say so at that moment): a tier's end is an event of the ledger, never recomputed from later verdicts.
"""

from __future__ import annotations

from pydantic_ai import CallDeferred, FunctionToolset, ModelRetry, RunContext

from agent import models as m
from agent.session import Session
from tools import reports
from tools.method.compute import moves_of

toolset: FunctionToolset[Session] = FunctionToolset(id="pivot", max_retries=3)


@toolset.tool
def ask_user(ctx: RunContext[Session], question: str, options: list[str]) -> str:
    """Stop at a pivot point and ask the user a question with numbered options; the answer comes back as this
    tool's result when the session is resumed (an option's number, its words, or free text).

    Call it after each tier, after a run of changes without gain, and after a promising item crashed, always
    right after write_status_summary with the same question and options.
    """
    session = ctx.deps
    if not question.strip():
        raise ModelRetry("ask a question")
    latest = reports.latest_status_doc(session.store.documents(session.id))
    summary = latest.path if latest is not None else None
    due = moves_of(session).pivot
    pivot = session.store.add_pivot(
        session.id,
        m.Pivot(
            question=question.strip(),
            options=[o.strip() for o in options if o.strip()],
            tool_call_id=ctx.tool_call_id,
            summary_path=summary,
            closes_tiers=list(due.closes) if due is not None else [],
        ),
    )
    session.emit("message", f"pivot: {pivot.question}", pivot_id=pivot.id, options=pivot.options, summary=summary)
    raise CallDeferred(metadata={"pivot_id": pivot.id, "summary_path": summary})
