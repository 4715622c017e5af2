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
- Failures: a campaign never dies of its own method. Whatever a tool or the loop raises that is not a model's failure
  leaves the session `waiting` with its running experiment marked interrupted, writes a crash report (the traceback,
  redacted) under state/<session>/crashes/, and ends with one line that names the report and says what to do;
  `pivot resume` goes on from the ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import traceback
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
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelHTTPError,
    ModelRateLimitError,
    UnexpectedModelBehavior,
)
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models import Model

from agent import models as m
from agent import plugins
from agent.context import CompactHistory
from agent.errors import PivotError, redact
from agent.llm import (  # noqa: F401 (the model by name: re-exported for the CLI and the MCP server)
    AUTOPILOT,
    SCRIPT_PREFIX,
    check_model_base_url,
    model_retries,
    model_timeout_s,
    provider_model,
)
from agent.session import Session
from agent.session_tools import session_toolsets
from agent.text import quote
from tools.method import Method, MethodGuard, method_text
from tools.method.compute import moves_of
from tools.numbering import NumberedToolset

pydantic_ai.BANNER_ENABLED = False  # pivot owns its terminal output (progress on stderr, the TUI's screen)

INTERRUPTED = (
    "interrupted: pivot was stopped while this tool ran, so its result was lost. Whatever it recorded is in the "
    "ledger: check it (server_status, todo_read, the experiments in the instructions) before doing it again."
)
START_PROMPT = "Work through the plan with the method: documents first, the baseline, then the first tier."

METHOD = (
    "You are pivot, an optimization assistant for LLM inference serving. You work through a tiered optimization "
    "plan on a target (a model on some GPUs under a serving engine) with your tools, and the ledger remembers "
    "everything.\n\nThe method (the tools refuse a call that breaks a rule marked [enforced], with the reason and "
    "the numbers: correct the call and go on):\n"
    + method_text()
    + "\nUse analyze to explain bottlenecks and read_power or server_metrics when a number needs explaining. Be "
    "terse: report numbers, not prose. Never invent a measurement.\n"
)


@dataclass
class RunOutcome:
    """How a run ended: at a pivot (the question waits in the ledger), finished, stopped or failed."""

    status: Literal["pivot", "finished", "stopped", "failed", "waiting"]
    message: str
    pivot: m.Pivot | None = None
    summary_path: str | None = None
    hint: str | None = None


def state_text(session: Session) -> str:
    """The session's state in a few lines, for the instructions (the details are one tool call away)."""
    method = Method.read(session.store, session.id)
    plan = method.plan
    t = plan.target
    lines = [
        f"Session {session.id}: plan {plan.name} ({plan.title}); {t.model} on {session.record.hardware_text}, "
        f"engine {session.record.engine}. Experiments are numbered in this session (1 is its first); an "
        "experiment_id is that number, as the user reads it in the reports.",
        "Tiers: " + "; ".join(f"{k} {v}: {', '.join(i.id for i in plan.tier_items(k))}" for k, v in plan.tiers.items()),
        f"Noise band: {method.band_pct():.1f}% (floor {method.settings.min_gain_pct:g}%); reruns "
        f"{method.settings.reruns}; pivot after {method.settings.stall_after} changes without gain.",
    ]
    docs = {d.plan_item for d in session.store.documents(session.id) if d.kind == "improvement"}
    lines.append(f"Improvement documents written: {len(docs & set(plan.item_ids()))} of {len(plan.items)}.")
    best = method.best()
    if best is not None:
        lines.append(f"Best configuration so far: experiment {best.number}: {best.config}")
    shown = method.experiments[-16:]
    if len(method.experiments) > len(shown):
        lines.append(f"Experiments 1-{(shown[0].number or 1) - 1}: in the ledger (pivot show).")
    for e in shown:
        items = "+".join(e.plan_items) or "-"
        runs = method.run_count(e)
        why = f": {e.reason[:100]}" if e.reason else ""
        lines.append(
            f"- experiment {e.number} item {items} {e.kind} {e.status}, {runs} run{'s' if runs != 1 else ''}, "
            f"verdict {e.verdict or '-'}{why}"
        )
    for p in method.pivots[-3:]:
        lines.append(f"Pivot asked: {p.question[:160]} -> answer: {p.answer if p.answer is not None else '(open)'}")
    moves = moves_of(session, method)
    d = moves.decision
    tiers = ", ".join(str(t) for t in sorted(d.released))
    closed = ", ".join(str(t) for t in sorted(d.closed))
    state = "the user answered stop" if d.stopped_at is not None else f"released tiers: {tiers}"
    if closed:
        state += f" (closed by a pivot: {closed})"
    lines.append(f"By the method: {state}; phase: {moves.phase}" + (f" ({moves.why})" if moves.why else "") + ".")
    allowed = moves.allowed_text()
    if allowed:
        lines.append("Moves allowed now: " + "; ".join(allowed[:12]) + ("; ..." if len(allowed) > 12 else "") + ".")
    if moves.steps:
        first = moves.steps[0]
        what = "+".join(first.items) or ("without " + "+".join(first.reverts) if first.reverts else "-")
        lines.append(f"The search's next step: {first.action} {what}: {first.reason[:200]}")
    if session.live is not None:
        lines.append(f"A server is running for experiment {method.number(session.live.experiment_id)}.")
    return "\n".join(lines)


def toolsets() -> list[Any]:
    """Every loaded tool plugin's toolset (a plugin that fails to load is warned about and left out)."""
    loaded = plugins.load_all(plugins.TOOLS_GROUP)
    return [loaded.plugins[name] for name in sorted(loaded.plugins)]


def build_agent(compact: bool = True) -> Agent[Session, str | DeferredToolRequests]:
    """The agent: the method as instructions, every toolset behind the method's guard, and (with `compact`) the
    conversation a model can afford: recent steps whole, older results as digests (agent/context.py)."""
    agent: Agent[Session, str | DeferredToolRequests] = Agent(
        deps_type=Session,
        output_type=[str, DeferredToolRequests],
        instructions=METHOD,
        # the method, enforced for every model; outside it, the model's experiment numbers to the ledger's ids and back
        toolsets=[NumberedToolset(MethodGuard(t)) for t in toolsets()],
        capabilities=[CompactHistory()] if compact else [],
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
    if name.startswith(SCRIPT_PREFIX):
        from agent.script_model import ScriptModel

        return ScriptModel(name, session).model
    return provider_model(name, session.record.model_base_url)


def model_failure(e: Exception, session: Session) -> tuple[str, str]:
    """One line saying what went wrong with the model, and a hint (never a key, never a traceback)."""
    rec = session.record
    where = f"at {rec.model_base_url}" if rec.model_base_url else f"{rec.model or AUTOPILOT}"
    status = getattr(e, "status_code", None)
    tried = f" after {model_retries()} retries with backoff" if rec.model_base_url else " after the client's retries"
    chain: list[BaseException] = [e]
    while len(chain) < 12 and (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(nxt)  # the causes say why: the SDK's "Connection error." hides "Connection refused"
    detail = " ".join(str(e).split())[:200]
    if any(isinstance(x, ConnectionRefusedError) for x in chain):
        detail = "connection refused"
    elif any(isinstance(x, TimeoutError) or "timeout" in type(x).__name__.lower() for x in chain):
        detail = "timed out"
    if isinstance(e, ModelAuthenticationError) or status in (401, 403):
        line = f"the model {where} refused the key (HTTP {status or 401})"
        hint = "check the key in the environment (PIVOT_MODEL_API_KEY with --model-base-url, else the provider's)"
    elif isinstance(e, ModelRateLimitError) or status == 429:
        line = f"the model {where} is rate-limited (HTTP 429){tried}"
        hint = "wait a while, or lower the request rate of your account"
    elif isinstance(e, ModelConnectionError):
        line = f"the model {where} did not answer ({detail}){tried}"
        hint = "check that the model server is up and the URL is right (--model-base-url)"
    elif isinstance(e, ModelHTTPError) and status is not None and status >= 500:
        line = f"the model {where} failed (HTTP {status}){tried}: {detail}"
        hint = "the provider's server failed; try again later"
    elif isinstance(e, ModelAPIError):
        line = f"the model {where} failed{f' (HTTP {status})' if status else ''}: {detail}"
        hint = "check the model's name and settings"
    else:
        line = f"the model {where} misbehaved: {detail}"
        hint = "try again, or another model (--model)"
    return redact(line), redact(hint)


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
    """A message as the ledger keeps it: each part within agent/context.py's MAX_PART_CHARS."""
    from agent.context import cap_message

    return ModelMessagesTypeAdapter.dump_json([cap_message(message)]).decode()[1:-1]


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
    compact: bool = True,
) -> RunOutcome:
    meter = UsageMeter(session)
    try:
        outcome = await _run_async(session, answer, prompt, usage_limits, model, compact, meter)
    except BaseException:
        meter.record("interrupted")
        raise
    meter.record(outcome.status)
    return outcome


class UsageMeter:
    """Keeps one agent run's model usage (requests, tokens, cost where known) in the ledger: a row written at the
    run's first request and brought up to date after each step, so a summary written during the run counts it."""

    def __init__(self, session: Session) -> None:
        self.session, self.started = session, m.utcnow()
        self.run: Any = None  # the AgentRun, once started
        self.row: m.ModelUsage | None = None

    def record(self, outcome: str = "running") -> None:
        if self.run is None:
            return  # nothing was sent to a model
        try:
            u = self.run.usage  # a property in pydantic-ai 2.x
        except Exception:  # a run that failed before its first request
            return
        if not u.requests:
            return
        rec = self.session.record
        name = rec.model or AUTOPILOT
        usage = m.ModelUsage(
            id=self.row.id if self.row is not None else None,
            model=name,
            requests=u.requests,
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cost_usd=usage_cost(name, rec.model_base_url, u.input_tokens, u.output_tokens),
            outcome=outcome,
            started_at=self.started,
        )
        if self.row is None:
            self.row = self.session.store.add_usage(self.session.id, usage)
        elif (self.row.requests, self.row.outcome) != (usage.requests, usage.outcome):
            self.session.store.update_usage(usage)
            self.row = usage


PRICE_PROVIDERS = {
    "openai-chat": "openai",
    "openai-responses": "openai",
    "google-gla": "google",
    "google-vertex": "google",
}


def usage_cost(model: str, base_url: str | None, input_tokens: int, output_tokens: int) -> float | None:
    """The price in USD of these tokens where genai-prices knows the model (a provider's model string); None for
    the autopilot, a scripted or test model, and a self-hosted server at --model-base-url."""
    if base_url or ":" not in model or model.startswith(SCRIPT_PREFIX):
        return None
    provider, name = model.split(":", 1)
    try:
        from genai_prices import Usage, calc_price

        price = calc_price(
            Usage(input_tokens=input_tokens, output_tokens=output_tokens),
            name,
            provider_id=PRICE_PROVIDERS.get(provider, provider),
        )
    except (LookupError, ImportError, ValueError):
        return None
    return float(price.total_price)


def _prepare(
    session: Session, answer: str | None, prompt: str | None
) -> RunOutcome | tuple[list[ModelMessage], int, DeferredToolResults | None, str | None]:
    """The history to go on from, repaired (calls cut short answered, the open pivot answered with `answer`, a
    half-written summary completed), how much of it the ledger holds, the deferred results and the prompt; or the
    outcome at once when a pivot waits for an answer that was not given."""
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
                session.id,
                m.Pivot(question="(message from the user)", answer=answer, answered_at=m.utcnow(), closes_tiers=[]),
            )  # a message closes no tier: only a pivot asked when the tiers' work was done does
            prompt = answer
    if "write_status_summary" in cut_short:  # killed while writing it: finish what it left half-done
        from tools import reports

        done = reports.complete_status(session)
        if done is not None:
            session.emit("warning", f"completed {done.path}, left unwritten by the step that was cut short")
    if not history and prompt is None:
        prompt = START_PROMPT
    if prompt is not None and history and isinstance(history[-1], ModelRequest):
        last = history[-1]  # tool results waiting to be sent: the message rides with them
        history = [*history[:-1], ModelRequest(parts=[*last.parts, UserPromptPart(prompt)])]
        prompt = None
    return history, stored, deferred, prompt


async def _run_async(
    session: Session,
    answer: str | None,
    prompt: str | None,
    usage_limits: UsageLimits | None,
    model: Model | str | None,
    compact: bool,
    meter: UsageMeter,
) -> RunOutcome:
    store = session.store
    prepared = _prepare(session, answer, prompt)
    if isinstance(prepared, RunOutcome):
        return prepared
    history, stored, deferred, prompt = prepared
    persister = Persister(session, stored)
    persister.save(history)  # the repair and the answer, before anything runs
    store.set_session_status(session.id, "active")
    agent = build_agent(compact)
    limits = usage_limits or UsageLimits(request_limit=session.settings.request_limit, tool_calls_limit=None)
    from agent.investigate import toolset as investigate_toolset

    # investigate, then the --mcp servers: pivot's own tool speaks the session's experiment numbers; an MCP server's
    # tools get their arguments, and give their results, as they are
    extra = [NumberedToolset(MethodGuard(t)) if t is investigate_toolset else MethodGuard(t)
             for t in session_toolsets(session, toolsets())]  # fmt: skip
    try:
        async with agent.iter(
            prompt,
            deps=session,
            model=model or resolve_model(session),
            message_history=history or None,
            deferred_tool_results=deferred,
            usage_limits=limits,
            toolsets=extra,
        ) as agent_run:
            meter.run = agent_run
            async for node in agent_run:
                messages = list(agent_run.all_messages())
                request = getattr(node, "request", None)
                if isinstance(request, ModelRequest) and (not messages or messages[-1] is not request):
                    messages.append(request)
                persister.save(messages)
                meter.record()
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
    except (ModelAPIError, UnexpectedModelBehavior) as e:
        # the model did not answer (after the client's retries): nothing measured is lost, the step is redone
        session.stop_live()
        store.mark_interrupted(session.id)
        store.set_session_status(session.id, "waiting")
        line, hint = model_failure(e, session)
        session.emit("error", line)
        return RunOutcome("failed", line, hint=f"{hint}; then `pivot resume {session.id}` goes on where it stopped")
    except (KeyboardInterrupt, asyncio.CancelledError):
        session.stop_live()
        store.mark_interrupted(session.id)  # the step cut short is redone in place on resume
        store.set_session_status(session.id, "stopped")
        raise
    except PivotError:  # a failure pivot can name (its own twin refused a value, a ledger it cannot write): one line
        with contextlib.suppress(Exception):
            session.stop_live()
        store.mark_interrupted(session.id)
        store.set_session_status(session.id, "waiting")
        raise
    except Exception as e:  # a tool or the loop failed: the campaign is left resumable, never dead
        return crashed(session, e)
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
    """Whether the method's moves have nothing left (the opened tiers' work is done, or a stop)."""
    return moves_of(session).finished


def crashed(session: Session, error: BaseException) -> RunOutcome:
    """An unexpected failure of a tool or of the loop: the server this process holds is stopped, the experiment it
    ran is marked interrupted (resume relaunches it in place), the session is left `waiting`, and the traceback
    (redacted) goes to state/<session>/crashes/; one line names the report and what to do."""
    store = session.store
    with contextlib.suppress(Exception):  # stopping a server must not hide the failure that is being reported
        session.stop_live()
    store.mark_interrupted(session.id)
    store.set_session_status(session.id, "waiting")
    what = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
    path = crash_report(session, error)
    where = session.paths.relative(path) if path is not None else "(the report could not be written)"
    line = redact(f"pivot stopped on an error it did not expect ({what}); crash report: {where}")
    session.emit("error", line)
    hint = (
        f"nothing measured is lost and the session is resumable: `pivot resume {session.id}` goes on from the "
        "ledger; if it stops the same way, the report says where (send it with the session's ledger)"
    )
    return RunOutcome("failed", line, hint=hint)


def crash_report(session: Session, error: BaseException) -> Any:
    """Write the crash report (what failed, when, the traceback; secrets redacted); its path, or None."""
    try:
        folder = session.paths.session_state_dir(session.id) / "crashes"
        folder.mkdir(parents=True, exist_ok=True)
        now = m.utcnow()
        path = folder / f"crash-{now.strftime('%Y%m%dT%H%M%S%fZ')}.txt"
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        rec = session.record
        text = (
            f"pivot crash report\nsession: {session.id} ({rec.name}), plan {rec.plan.name}, engine {rec.engine}, "
            f"model {rec.model or AUTOPILOT}\nat: {now.isoformat()}\nerror: {type(error).__name__}: {error}\n\n{trace}"
        )
        path.write_text(redact(text), encoding="utf-8")
        return path
    except OSError:
        return None


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
