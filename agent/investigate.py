"""Sub-agent investigations: a question answered by a sub-agent with its own context and a read-only toolset.

`investigate(question)` is a tool of the main agent (an LLM may call it; the autopilot calls it where the seeds did,
see `investigation_due`). It records the question in the ledger, runs a sub-agent on it with the tools of
tools/investigation.py (the ledger, a server's log, the analysis, the GEMM evidence, profile traces, the twin's
predictions, the flag audit: nothing that launches or judges), bounded in requests and tokens, and records the
report, the tools it called and its model's use. Status summaries cite every report under "Investigations".

The sub-agent's model is the session's unless the session names an investigator (`--investigator-model`). With the
autopilot (and for a scripted session without an investigator of its own) it is `Investigator`: a deterministic
policy behind FunctionModel that calls the read-only tools in a fixed order and writes a factual report from their
results: after a crash, what the log says and what to try; for the root cause, the GEMM and roofline evidence.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from pydantic_ai import Agent, FunctionToolset, RunContext, UsageLimitExceeded, UsageLimits, capture_run_messages
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent import models as m
from agent.session import Session
from tools import investigation
from tools.method import Method
from tools.numbering import NumberedToolset, number_of

MAX_REQUESTS = 12  # model requests of one investigation
MAX_TOKENS = 150_000  # input + output tokens of one investigation
DETERMINISTIC = "investigator"  # the autopilot's investigator, as the ledger names it

INSTRUCTIONS = (
    "You are an investigator for pivot, an optimization assistant for LLM inference serving. Answer the question "
    "you are given from the evidence your tools return: the ledger of experiments, server logs, the roofline "
    "analysis, GEMM micro-benchmarks, profile traces, the digital twin's predictions and the flag audit. You "
    "cannot launch, benchmark or judge anything. Call the tools you need, then write a short report: what the "
    "evidence says (numbers with their experiment ids and sources; say which numbers are predictions or simulated) "
    "and what to try next. Never invent a measurement."
)

toolset: FunctionToolset[Session] = FunctionToolset(id="investigate", max_retries=2)


class InvestigationReport(BaseModel):
    """An investigation's outcome as the ledger recorded it."""

    investigation_id: int
    status: m.InvestigationStatus
    report: str
    tools_used: list[str]
    model: str
    requests: int
    tokens: int = Field(description="Input plus output tokens of the sub-agent.")


@toolset.tool
async def investigate(
    ctx: RunContext[Session], question: str, kind: m.InvestigationKind = "question", experiment_id: int | None = None
) -> InvestigationReport:
    """Put a question to a sub-agent with its own context and read-only tools (the ledger, a server's log, the
    analysis, GEMM evidence, profile traces, the twin's predictions, the flag audit); returns its report, which is
    recorded in the ledger and cited in the status summaries under Investigations.

    kind: crash (why experiment `experiment_id` crashed and what to try), root_cause (the GEMM and roofline evidence
    for the best configuration's bottleneck) or question. The sub-agent launches and judges nothing, and is bounded
    in requests and tokens."""
    inv = await run_investigation(ctx.deps, question, kind=kind, experiment_id=experiment_id)
    return InvestigationReport(
        investigation_id=inv.id or 0,
        status=inv.status,
        report=inv.report,
        tools_used=inv.tools_used,
        model=inv.model,
        requests=inv.requests,
        tokens=inv.input_tokens + inv.output_tokens,
    )


def investigator_name(session: Session) -> str:
    """The model string investigations of this session run on."""
    from agent.llm import AUTOPILOT, SCRIPT_PREFIX

    chosen = session.settings.investigator_model
    if chosen:
        return chosen
    name = session.record.model or AUTOPILOT
    return DETERMINISTIC if name in (AUTOPILOT, DETERMINISTIC) or name.startswith(SCRIPT_PREFIX) else name


def investigator_model(session: Session, name: str) -> Model:
    """The pydantic-ai model for `name`: the deterministic investigator, a script, or a provider's model."""
    from agent.llm import AUTOPILOT, SCRIPT_PREFIX, provider_model

    if name in (DETERMINISTIC, AUTOPILOT):
        return Investigator().model
    if name.startswith(SCRIPT_PREFIX):
        from agent.script_model import ScriptModel

        return ScriptModel(name).model
    same = name == session.record.model
    return provider_model(name, session.record.model_base_url if same else None)


def _prompt(kind: m.InvestigationKind, question: str, experiment_id: int | str | None) -> str:
    about = f" It is about experiment {experiment_id}." if experiment_id is not None else ""
    return f"Investigation ({kind}): {question.strip()}{about}"


def _tools_called(messages: list[ModelMessage]) -> list[str]:
    return [p.tool_name for msg in messages if isinstance(msg, ModelResponse) for p in msg.parts
            if isinstance(p, ToolCallPart)]  # fmt: skip


def _usage(messages: list[ModelMessage]) -> tuple[int, int, int]:
    responses = [msg for msg in messages if isinstance(msg, ModelResponse)]
    return (
        len(responses),
        sum(r.usage.input_tokens for r in responses),
        sum(r.usage.output_tokens for r in responses),
    )


async def run_investigation(
    session: Session,
    question: str,
    *,
    kind: m.InvestigationKind = "question",
    experiment_id: int | None = None,
    model: Model | None = None,
    limits: UsageLimits | None = None,
) -> m.Investigation:
    """Run one investigation to its report and record it (a failure or a limit reached is recorded too, with what
    was gathered); returns the ledger's record."""
    name = investigator_name(session)
    inv = session.store.add_investigation(
        session.id,
        m.Investigation(kind=kind, question=question.strip() or kind, experiment_id=experiment_id, model=name),
    )
    number = len(session.store.investigations(session.id))  # the session's own count, as its summary numbers them
    session.emit("info", f"investigation {number} ({kind}): {question.strip()[:120]}", investigation_id=inv.id)
    agent: Agent[Session, str] = Agent(
        deps_type=Session, output_type=str, instructions=INSTRUCTIONS,
        toolsets=[NumberedToolset(investigation.toolset)],  # the sub-agent speaks the session's numbers too
        defer_model_check=True,
    )  # fmt: skip
    limits = limits or UsageLimits(request_limit=MAX_REQUESTS, total_tokens_limit=MAX_TOKENS)
    status: m.InvestigationStatus = "done"
    with capture_run_messages() as messages:
        try:
            result = await agent.run(
                _prompt(kind, question, number_of(session, experiment_id) if experiment_id is not None else None),
                deps=session,
                model=model or investigator_model(session, name),
                usage_limits=limits,
            )
            report = result.output.strip()
        except UsageLimitExceeded as e:
            status, report = "limit", f"stopped before a report: {e}"
        except Exception as e:  # the sub-agent's model failed: recorded, and the campaign goes on
            from agent.errors import redact

            status, report = "failed", redact(f"the investigator failed: {type(e).__name__}: {e}")[:600]
    requests, tokens_in, tokens_out = _usage(list(messages))
    inv = inv.model_copy(
        update={
            "tools_used": _tools_called(list(messages)),
            "requests": requests,
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "status": status,
            "report": report or "(empty report)",
            "finished_at": m.utcnow(),
        }
    )
    session.store.finish_investigation(inv)
    session.emit(
        "info", f"investigation {number} {status}: {' '.join(inv.report.split())[:160]}", investigation_id=inv.id
    )
    return inv


# ---- the autopilot's side: when an investigation is due, and the deterministic investigator


def investigation_due(session: Session) -> tuple[str, dict[str, Any]] | None:
    """The investigation the autopilot makes now, as (tool, args), or None: after a crash of an experiment not yet
    investigated, the crash; once the best configuration is analysed and its root cause not yet investigated, that.
    Call it before a pivot's status summary so the summary cites the report."""
    method = Method.read(session.store, session.id)
    done = {(i.kind, i.experiment_id) for i in session.store.investigations(session.id)}
    for e in reversed(method.experiments):
        if e.verdict == "crashed" and e.id is not None and ("crash", e.id) not in done:
            what = "+".join(e.plan_items) or "the baseline"
            return "investigate", {
                "question": f"Why did experiment {e.number} ({what}) crash, and what should be tried next?",
                "kind": "crash",
                "experiment_id": e.id,
            }
    best = method.best()
    if best is None or best.id is None or method.run_count(best) == 0 or ("root_cause", best.id) in done:
        return None
    if not session.store.findings(session.id, experiment_id=best.id, kind="bottleneck"):
        return None  # analysed first (the autopilot's analyze step), then investigated
    return "investigate", {
        "question": f"What limits the best configuration (experiment {best.number}): the GEMM and roofline evidence?",
        "kind": "root_cause",
        "experiment_id": best.id,
    }


PLANS = {
    "crash": ("ledger_experiments", "server_log", "experiment_levels"),
    "root_cause": ("ledger_experiments", "analysis", "gemm_evidence", "profile_traces"),
    "question": ("ledger_experiments", "analysis"),
}
NEEDS_EXPERIMENT = {"server_log", "experiment_levels"}


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for msg in messages:
        if isinstance(msg, ModelRequest):
            for p in msg.parts:
                if isinstance(p, ToolReturnPart):
                    out[p.tool_name] = p.content
    return out


def _header(messages: list[ModelMessage]) -> tuple[str, int | None]:
    text = ""
    for msg in messages:
        if isinstance(msg, ModelRequest):
            for p in msg.parts:
                if getattr(p, "part_kind", "") == "user-prompt" and isinstance(p.content, str):
                    text = p.content
                    break
            if text:
                break
    kind = text.split("(", 1)[1].split(")", 1)[0] if text.startswith("Investigation (") else "question"
    eid = None
    if " It is about experiment " in text:
        eid = int(text.rsplit(" It is about experiment ", 1)[1].rstrip("."))
    return kind, eid


class Investigator:
    """The deterministic investigator: the read-only tools in a fixed order per kind, then a report of facts."""

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self.respond, model_name=DETERMINISTIC)

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        kind, eid = _header(messages)
        plan = PLANS.get(kind, PLANS["question"])
        step = sum(isinstance(msg, ModelResponse) for msg in messages)
        if step < len(plan):
            tool = plan[step]
            args: dict[str, Any] = {}
            if tool in NEEDS_EXPERIMENT or (tool == "analysis" and eid is not None):
                args["experiment_id"] = eid
            if tool in NEEDS_EXPERIMENT and eid is None:
                return self.respond_text(messages, kind, eid)
            return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=f"inv-{step}-{tool}")])
        return self.respond_text(messages, kind, eid)

    def respond_text(self, messages: list[ModelMessage], kind: str, eid: int | None) -> ModelResponse:
        got = _returns(messages)
        writer = {"crash": crash_report, "root_cause": root_cause_report}.get(kind, question_report)
        return ModelResponse(parts=[TextPart(writer(got, eid))])


def _experiment_row(got: dict[str, Any], eid: int | None) -> dict[str, Any] | None:
    rows = (got.get("ledger_experiments") or {}).get("experiments") or []
    wanted = eid if eid is not None else (got.get("ledger_experiments") or {}).get("best_experiment_id")
    return next((r for r in rows if r.get("experiment_id") == wanted), None)


REMEDIES = {
    "oom": "free memory: lower --mem-fraction-static, --max-running-requests or --chunked-prefill-size, or shard the "
    "model over more GPUs",
    "cuda-error": "a kernel or communication fault under this load: cap the batch below the first level that failed "
    "(--max-running-requests), try another backend for the component the change switched on, and report it upstream "
    "with the log",
    "nccl-error": "a collective failed: check the interconnect and NCCL's environment (NCCL_DEBUG=INFO), and cap the "
    "batch below the first level that failed",
    "compile-failure": "a kernel did not compile: drop the flag that asks for it, or the backend that needs it",
    "unrecognized-argument": "the engine does not know a flag: audit it (`pivot audit-flags`) and use the replacement",
    "ambiguous-argument": "a flag's name is a prefix of several: spell it out (`pivot audit-flags` lists them)",
    "invalid-choice": "the value is not among the flag's choices: the log line lists them; pick one",
    "argument-validation": "the engine refused a value: the log line names the check; change the value",
    "unsupported-hardware": "this host cannot run what the change asks for (the log line names what it needs): rule it "
    "out here, or try it on hardware that has it",
    "port-in-use": "another process holds the port: stop it or give --port",
}


def crash_report(got: dict[str, Any], eid: int | None) -> str:
    row = _experiment_row(got, eid) or {}
    log = got.get("server_log") or {}
    what = "+".join(row.get("plan_items") or []) or "the baseline"
    failed = row.get("failed_levels") or []
    held = row.get("highest_level_held")
    lines = [f"Experiment {eid} ({what}; flags `{row.get('config', '?')}`) crashed"]
    if failed:
        lines[0] += f" under load: requests failed at concurrency {', '.join(map(str, failed))}"
    elif row.get("status") == "failed":
        lines[0] += " before it served (it did not start)"
    if held is not None:
        lines[0] += (
            f"; the highest level that held was {held} ({row.get('output_tok_s_at_highest_level'):,} output tok/s)"
        )
    lines[0] += "."
    errors = log.get("error_lines") or []
    if errors:
        lines.append(f"The server log ({log.get('log')}) says: `{errors[-1].strip()[:300]}`.")
    elif log.get("note"):
        lines.append(f"Server log: {log['note']}.")
    failure = row.get("failure") or (str(log.get("diagnosis") or "").split(":", 1)[0] or None)
    if failure:
        lines.append(f"The engine classifies the failure as {failure}.")
    remedy = REMEDIES.get(failure or "")
    tries = []
    if remedy:
        tries.append(remedy)
    if failed and held is not None:
        tries.append(f"retry it capped, `--max-running-requests {held}` (the last level that held), to see whether "
                     "it gains below the crash")  # fmt: skip
    if tries:
        lines.append("What to try: " + "; ".join(tries) + ".")
    return " ".join(lines)


def root_cause_report(got: dict[str, Any], eid: int | None) -> str:
    a = got.get("analysis") or {}
    gemm = got.get("gemm_evidence") or {}
    prof = got.get("profile_traces") or {}
    out = [f"Experiment {a.get('experiment_id', eid)}: {a.get('verdict') or 'no bottleneck verdict recorded'}"]
    levels = a.get("levels") or []
    if levels:
        top = max(levels, key=lambda v: v.get("max_concurrency", 0))
        rows = top.get("rows_per_expert", top.get("gemm_m"))
        parts = [f"at concurrency {int(top.get('max_concurrency', 0))}"]
        if rows is not None:
            parts.append(f"{rows:,.1f} rows per {'expert' if 'rows_per_expert' in top else 'GEMM'}")
        if "arithmetic_intensity_flop_per_byte" in top:
            parts.append(f"arithmetic intensity {top['arithmetic_intensity_flop_per_byte']:,.0f} FLOP/byte")
        if "achieved_tflops" in top and "share_of_peak_pct" in top:
            parts.append(f"{top['achieved_tflops']:,.1f} TFLOPS ({top['share_of_peak_pct']:.1f}% of peak)")
        if "tpot_over_floor" in top:
            parts.append(f"TPOT {top['tpot_over_floor']:.1f}x the bandwidth floor")
        out.append("Roofline " + ", ".join(parts) + ".")
    out += [f"- {t}" for t in (a.get("evidence") or [])[:4]]
    bench = gemm.get("microbench") or []
    if bench:
        best = max(bench, key=lambda r: r["share_of_peak_pct"])
        worst = min(bench, key=lambda r: r["share_of_peak_pct"])
        out.append(
            f"GEMM micro-benchmarks ({len(bench)} shapes, {bench[0]['source']}): from {worst['share_of_peak_pct']}% of "
            f"peak at m={worst['m']} to {best['share_of_peak_pct']}% at m={best['m']}."
        )
    elif gemm.get("note"):
        out.append(f"GEMM evidence: {gemm['note']}.")
    if prof.get("share_pct"):
        shares = ", ".join(f"{k} {v}%" for k, v in sorted(prof["share_pct"].items(), key=lambda kv: -kv[1]))
        out.append(f"Profile ({prof.get('source')}, {prof.get('traces')} traces): {shares}.")
    return "\n".join(out)


def question_report(got: dict[str, Any], eid: int | None) -> str:
    led = got.get("ledger_experiments") or {}
    a = got.get("analysis") or {}
    rows = led.get("experiments") or []
    crashed = [r["experiment_id"] for r in rows if r.get("verdict") == "crashed"]
    out = [
        f"The deterministic investigator reads the ledger: {len(rows)} experiments, best experiment "
        f"{led.get('best_experiment_id')}, noise band {led.get('noise_band_pct', 0):.1f}%."
    ]
    if a.get("verdict"):
        out.append(f"Analysis of experiment {a.get('experiment_id')}: {a['verdict']}")
    if crashed:
        out.append(f"Crashed: experiments {', '.join(map(str, crashed))} (ask with kind=crash for one of them).")
    return " ".join(out)
