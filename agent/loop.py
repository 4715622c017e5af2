"""The agent loop: a pydantic-ai Agent whose deps are the Session, run until a pivot, persisted step by step.

- Model: any pydantic-ai model string (`anthropic:...`, `openai:...`, `openai-chat:...`), an OpenAI-compatible
  chat model at `model_base_url` (for example a local SGLang), or `autopilot` (agent/autopilot.py), the offline
  default. Keys come from the environment; the ledger keeps only the model string and the URL.
- Tools: the toolsets of every loaded plugin (the `pivot.tools` entry points).
- Instructions: the method, short, plus the session's current state; the model reads the ledger through tools.
- History: every model response and every batch of tool results is appended to the ledger as soon as it exists,
  so a kill loses at most the step in flight. On resume, tool calls left without a result are answered with
  "interrupted" (what they did is in the ledger), and an open pivot is answered with the user's answer as the
  deferred ask_user call's result, so the run goes on where it stopped.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any, Literal

import pydantic_ai
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    ModelMessagesTypeAdapter,
    RunContext,
    UsageLimitExceeded,
    UsageLimits,
)
from pydantic_ai.exceptions import ModelHTTPError, UnexpectedModelBehavior, UserError
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models import Model

from agent import models as m
from agent import plugins
from agent.errors import PivotError
from agent.session import Session
from agent.text import quote
from tools.method import Method

pydantic_ai.BANNER_ENABLED = False  # pivot owns its terminal output (progress on stderr, the TUI's screen)

AUTOPILOT = "autopilot"
INTERRUPTED = (
    "interrupted: pivot was stopped while this tool ran, so its result was lost. Whatever it recorded is in the "
    "ledger: check it (server_status, todo_read, the experiments in the instructions) before doing it again."
)
START_PROMPT = "Work through the plan with the method: documents first, the baseline, then the first tier."

METHOD = """\
You are pivot, an optimization assistant for LLM inference serving. You work through a tiered optimization plan
on a target (a model on some GPUs under a serving engine) with your tools, and the ledger remembers everything.

The method:
1. Keep a todo list (todo_write) that follows the plan: read it with plan_read.
2. Write the improvement document of every plan item (write_improvement_doc) before the first experiment.
3. Measure a baseline first (launch_server baseline=True, run_benchmark), then rerun it once (launch_server with
   its experiment_id, run_benchmark): the spread between the runs is the measured noise. Record it (record_verdict
   verdict=baseline). Every comparison uses the same workload; an item that changes the workload gets its own
   baseline on it.
4. One change at a time, on top of the best configuration so far: audit_flags first; if the engine would refuse
   the flags, record_verdict with plan_item and verdict ruled_out, without launching. Otherwise launch_server,
   run_benchmark, then record_verdict by the judgement run_benchmark returns: adopted only beyond the noise band,
   rerun a gain inside it before calling it no_gain, regressed beyond the band the other way, crashed with the
   classified reason. Name flags that do nothing in this version (no-ops) in the reason. stop_server after each.
5. A profile item: launch the best configuration (launch_server with that plan_item), run_benchmark, profile,
   stop_server, record_verdict measured. A code item is documented for the user; there is nothing to run.
6. After each verdict bring the item's document up to date (write_improvement_doc).
7. Stop at a pivot after each tier, after several changes in a row without gain, and after a promising item
   crashed: write_status_summary with a question and numbered options, then ask_user with the same. Do what the
   answer says. When every item is done, write a final status summary and end with a short message.
Use analyze to explain bottlenecks and read_power or server_metrics when a number needs explaining. Be terse:
report numbers, not prose. Never invent a measurement.
"""


@dataclass
class RunOutcome:
    """How a run ended: at a pivot (the question waits in the ledger), finished, stopped or failed."""

    status: Literal["pivot", "finished", "stopped", "failed", "waiting"]
    message: str
    pivot: m.Pivot | None = None
    summary_path: str | None = None


def state_text(session: Session) -> str:
    """The session's state in a few lines, for the instructions (the details are one tool call away)."""
    method = Method.read(session.store, session.id)
    plan = method.plan
    t = plan.target
    lines = [
        f"Session {session.id}: plan {plan.name} ({plan.title}); {t.model} on {t.gpus}x {t.hardware}, "
        f"engine {session.record.engine}.",
        "Tiers: " + "; ".join(f"{k} {v}: {', '.join(i.id for i in plan.tier_items(k))}" for k, v in plan.tiers.items()),
        f"Noise band: {method.band_pct():.1f}% (floor {method.settings.min_gain_pct:g}%); reruns "
        f"{method.settings.reruns}; pivot after {method.settings.stall_after} changes without gain.",
    ]
    best = method.best()
    if best is not None:
        lines.append(f"Best configuration so far: experiment {best.id}: {best.config}")
    for e in method.experiments[-12:]:
        lines.append(f"- experiment {e.id} item {e.plan_item or '-'} {e.kind} {e.status} verdict {e.verdict or '-'}")
    if session.live is not None:
        lines.append(f"A server is running for experiment {session.live.experiment_id}.")
    return "\n".join(lines)


def toolsets() -> list[Any]:
    """Every loaded tool plugin's toolset (a plugin that fails to load is warned about and left out)."""
    loaded = plugins.load_all(plugins.TOOLS_GROUP)
    return [loaded.plugins[name] for name in sorted(loaded.plugins)]


def build_agent() -> Agent[Session, str | DeferredToolRequests]:
    agent: Agent[Session, str | DeferredToolRequests] = Agent(
        deps_type=Session,
        output_type=[str, DeferredToolRequests],
        instructions=METHOD,
        toolsets=toolsets(),
        defer_model_check=True,
    )

    @agent.instructions
    def current_state(ctx: RunContext[Session]) -> str:
        return state_text(ctx.deps)

    return agent


def resolve_model(session: Session) -> Model | str:
    """The model the session names: the autopilot, a model at an OpenAI-compatible URL, or a provider's string."""
    name = session.record.model or AUTOPILOT
    if name == AUTOPILOT:
        from agent.autopilot import Autopilot

        return Autopilot(session).model
    return provider_model(name, session.record.model_base_url)


def provider_model(name: str, base_url: str | None) -> Model:
    """A model other than the autopilot, built now so that a missing key or an unknown provider is a clear error
    before anything runs (nothing is sent to it here)."""
    try:
        if base_url:
            from pydantic_ai.models.openai import OpenAIChatModel
            from pydantic_ai.providers.openai_compatible import OpenAICompatibleProvider

            model_name = name.split(":", 1)[1] if ":" in name else name
            provider = OpenAICompatibleProvider(
                "pivot-model", base_url=base_url, api_key=os.environ.get("PIVOT_MODEL_API_KEY") or None
            )
            return OpenAIChatModel(model_name, provider=provider)
        from pydantic_ai.models import infer_model

        return infer_model(name)
    except UserError as e:
        raise PivotError(
            f"cannot use model {name!r}: {e}",
            hint="set the provider's API key in the environment (e.g. ANTHROPIC_API_KEY, OPENAI_API_KEY), "
            "or use --model-base-url for an OpenAI-compatible server, or --model autopilot",
        ) from e


def load_history(session: Session) -> list[ModelMessage]:
    """The session's messages from the ledger; a message that no longer parses stops with a clear error."""
    out: list[ModelMessage] = []
    for i, text in enumerate(session.store.messages(session.id), start=1):
        try:
            out += ModelMessagesTypeAdapter.validate_json("[" + text + "]")
        except ValueError as e:
            raise PivotError(
                f"message {i} of session {session.id} cannot be read: {str(e)[:200]}",
                hint="the ledger holds everything measured; start a new session on the same plan to go on",
            ) from e
    return out


def _dump(message: ModelMessage) -> str:
    return ModelMessagesTypeAdapter.dump_json([message]).decode()[1:-1]


def unanswered(history: list[ModelMessage]) -> list[ToolCallPart]:
    """The tool calls of the last model response that no later message answers (the process died while they ran,
    or they were deferred)."""
    last = next((i for i in range(len(history) - 1, -1, -1) if isinstance(history[i], ModelResponse)), None)
    if last is None:
        return []
    answered = {getattr(p, "tool_call_id", None) for msg in history[last + 1 :] for p in msg.parts}
    return [p for p in history[last].parts if isinstance(p, ToolCallPart) and p.tool_call_id not in answered]


def close_dangling(history: list[ModelMessage], keep: str | None) -> list[ModelMessage]:
    """Answer the last response's unanswered tool calls with INTERRUPTED, except `keep` (the open pivot's
    ask_user call, which the user's answer answers). The results join the request after that response, if any."""
    calls = [p for p in unanswered(history) if p.tool_call_id != keep]
    if not calls:
        return history
    parts = [ToolReturnPart(p.tool_name, INTERRUPTED, tool_call_id=p.tool_call_id) for p in calls]
    if isinstance(history[-1], ModelRequest):
        return [*history[:-1], ModelRequest(parts=[*history[-1].parts, *parts])]
    return [*history, ModelRequest(parts=parts)]


class Persister:
    """Appends each new message to the ledger once: model responses as they arrive, tool results as soon as the
    request that carries them exists (before it is sent)."""

    def __init__(self, session: Session, stored: int) -> None:
        self.session, self.stored = session, stored

    def save(self, messages: list[ModelMessage]) -> None:
        new = messages[self.stored :]
        if new:
            self.session.store.append_messages(self.session.id, [_dump(x) for x in new])
            self.stored = len(messages)


def run(
    session: Session,
    *,
    answer: str | None = None,
    prompt: str | None = None,
    usage_limits: UsageLimits | None = None,
) -> RunOutcome:
    """Run the session's agent until it stops at a pivot, finishes, or fails. `answer` answers the open pivot
    (or, with none open, is a new message from the user); `prompt` starts a new session's conversation."""
    return asyncio.run(run_async(session, answer=answer, prompt=prompt, usage_limits=usage_limits))


async def run_async(
    session: Session,
    *,
    answer: str | None = None,
    prompt: str | None = None,
    usage_limits: UsageLimits | None = None,
    model: Model | str | None = None,
) -> RunOutcome:
    store = session.store
    history = load_history(session)
    stored = len(history)
    cut_short = {p.tool_name for p in unanswered(history)}
    open_pivot = store.open_pivot(session.id)
    deferred: DeferredToolResults | None = None
    if open_pivot is not None:
        if answer is None:
            return RunOutcome("pivot", open_pivot.question, pivot=open_pivot, summary_path=open_pivot.summary_path)
        open_pivot = store.answer_pivot(open_pivot.id or 0, answer)
        session.emit("message", f"answer: {quote(answer, 200)}", pivot_id=open_pivot.id)
        if open_pivot.tool_call_id in {p.tool_call_id for p in unanswered(history)}:
            history = close_dangling(history, keep=open_pivot.tool_call_id)
            deferred = DeferredToolResults(calls={open_pivot.tool_call_id: answer})
        else:  # the question's call is not the last thing in the history: give the answer as a message
            history = close_dangling(history, keep=None)
            prompt = f"The answer to your question {open_pivot.question!r} is: {answer}"
    else:
        history = close_dangling(history, keep=None)
        if answer is not None:  # a new message from the user, kept with the pivots so the autopilot reads it too
            store.add_pivot(
                session.id, m.Pivot(question="(message from the user)", answer=answer, answered_at=m.utcnow())
            )
            prompt = answer
    if "write_status_summary" in cut_short:  # killed while writing it: finish what it left half-done
        from agent import reports

        done = reports.complete_status(session)
        if done is not None:
            session.emit("warning", f"completed {done.path}, left unwritten by the step that was cut short")
    if not history and prompt is None:
        prompt = START_PROMPT
    if prompt is not None and history and isinstance(history[-1], ModelRequest):
        last = history[-1]  # tool results waiting to be sent: the message rides with them
        history = [*history[:-1], ModelRequest(parts=[*last.parts, UserPromptPart(prompt)])]
        prompt = None
    persister = Persister(session, stored)
    persister.save(history)  # the repair and the answer, before anything runs
    store.set_session_status(session.id, "active")
    agent = build_agent()
    limits = usage_limits or UsageLimits(request_limit=session.settings.request_limit, tool_calls_limit=None)
    try:
        async with agent.iter(
            prompt,
            deps=session,
            model=model or resolve_model(session),
            message_history=history or None,
            deferred_tool_results=deferred,
            usage_limits=limits,
        ) as agent_run:
            async for node in agent_run:
                messages = list(agent_run.all_messages())
                request = getattr(node, "request", None)
                if isinstance(request, ModelRequest) and (not messages or messages[-1] is not request):
                    messages.append(request)
                persister.save(messages)
                if Agent.is_call_tools_node(node):
                    async with node.stream(agent_run.ctx) as events:
                        async for event in events:
                            _emit(session, event)
            result = agent_run.result
            assert result is not None
            persister.save(list(result.all_messages()))
    except UsageLimitExceeded as e:
        store.set_session_status(session.id, "stopped")
        return RunOutcome("stopped", f"stopped: {e}; `pivot resume {session.id}` goes on")
    except (ModelHTTPError, UnexpectedModelBehavior) as e:
        store.set_session_status(session.id, "failed")
        return RunOutcome("failed", f"the model failed: {e}; `pivot resume {session.id}` tries again")
    except (KeyboardInterrupt, asyncio.CancelledError):
        session.stop_live()
        store.mark_interrupted(session.id)  # the step cut short is redone in place on resume
        store.set_session_status(session.id, "stopped")
        raise
    output = result.output
    if isinstance(output, DeferredToolRequests):
        pivot = store.open_pivot(session.id)
        if pivot is None:  # a deferred call that is not a pivot: nothing here answers those
            store.set_session_status(session.id, "stopped")
            names = ", ".join(c.tool_name for c in output.calls + output.approvals)
            return RunOutcome("stopped", f"the model asked for deferred tools pivot cannot answer: {names}")
        return RunOutcome("pivot", pivot.question, pivot=pivot, summary_path=pivot.summary_path)
    session.stop_live()
    status: m.SessionStatus = "finished" if campaign_finished(session) else "waiting"
    store.set_session_status(session.id, status)
    return RunOutcome("finished" if status == "finished" else "waiting", str(output))


def campaign_finished(session: Session) -> bool:
    """Whether the autopilot's reading of the ledger has nothing left to do (every released item done or a stop)."""
    from agent import reports
    from agent.autopilot import Autopilot

    pilot = Autopilot(session)
    method = Method.read(session.store, session.id)
    ledger = reports.Ledger.read(session.store, session.id)
    decision = pilot.decision(method, ledger)
    return decision.stopped_at is not None or pilot.next_item(method, ledger, decision) is None


def _emit(session: Session, event: Any) -> None:
    if isinstance(event, FunctionToolCallEvent):
        args = event.part.args_as_dict() if event.part.args else {}
        shown = ", ".join(f"{k}={v}" for k, v in args.items() if k not in ("todos", "options"))
        # tool_call_id (here and on the result) pairs a call with its result for watchers such as agent/tui
        session.emit(
            "tool_call",
            f"{event.part.tool_name}({shown[:160]})",
            tool=event.part.tool_name,
            args=args,
            tool_call_id=event.part.tool_call_id,
        )
    elif isinstance(event, FunctionToolResultEvent):
        content = getattr(event.part, "content", None)
        text = content if isinstance(content, str) else type(content).__name__
        # content: the tool's return value itself, so a watcher (agent/tui) can summarize it (e.g. a BenchReport)
        session.emit(
            "tool_result",
            f"{event.part.tool_name} -> {str(text)[:160]}",
            tool=event.part.tool_name,
            tool_call_id=event.tool_call_id,
            content=content,
        )
