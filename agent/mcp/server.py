"""`pivot mcp`: pivot as an MCP server (fastmcp), over stdio or streamable HTTP on 127.0.0.1.

The tools are the commands' own code with typed schemas: plans (list, the whole pre-launch check), campaigns (start
on a plan, answer a pivot, resume: each runs the agent to its next stop, as `pivot run`/`pivot resume` do, with MCP
progress and a cancel that stops the server and leaves the session resumable), sessions (list, show), a status
summary, the twin's prediction, the flag audit and an investigation. The method holds as through the CLI: the same
loop, guard and autopilot run. Status summaries and documents are resources (`pivot://sessions/{id}/status`,
`pivot://sessions/{id}/documents/{name}`), listed per session.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from fastmcp import Context, FastMCP
from pydantic import Field

from agent import models as m
from agent.errors import PivotError
from agent.mcp import views
from agent.mcp.campaign import CampaignOutcome, run_step, status_uri
from agent.mcp.guard import FileRoots
from agent.session import Paths
from agent.store import Store

INSTRUCTIONS = """pivot optimizes LLM inference serving (SGLang, vLLM) with a method: a tiered plan of ideas, a
baseline measured twice (its spread is the noise), one change at a time on the best configuration, verdicts only
beyond the noise band, and a pivot (a status summary and a question) after each tier. Work with it like this:
1. list_plans, then check_plan(plan) (the whole pre-launch check; fix errors first).
2. start_campaign(plan) runs the agent to its first pivot (engine "sim", the digital twin, needs no GPU) and returns
   the question with numbered options; read the status summary resource it names (pivot://sessions/ID/status).
3. answer_pivot(session, answer) with an option's number, a plan item's id, 'continue' or 'stop'; it runs to the
   next pivot. resume_campaign(session) goes on after a cancel or a crash.
show_session, list_sessions, write_summary, predict (the twin), audit_flags and investigate read and explain;
they launch nothing. Every number is measured or simulated by pivot, and says which."""

READ_ONLY = {"readOnlyHint": True, "openWorldHint": False}
RUNS = {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False}


def _tool_error(e: PivotError) -> Exception:
    from fastmcp.exceptions import ToolError

    return ToolError(e.message + (f" (hint: {e.hint})" if e.hint else ""))


async def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
    except PivotError as e:
        raise _tool_error(e) from e


def build_server(paths: Paths, store: Store, roots: FileRoots | None = None) -> Any:
    """The MCP server over one pivot home (its ledger and documents); a client names files under `roots` only
    (default: the shipped plans and profiles and the home, agent/mcp/guard.py)."""
    from agent import __version__

    roots = roots or FileRoots.default(paths.home)
    # the server names pivot's version to clients (initialize's serverInfo), not the MCP library's
    server = FastMCP("pivot", instructions=INSTRUCTIONS, version=__version__, mask_error_details=False)
    _plan_tools(server, roots)
    _campaign_tools(server, paths, store, roots)
    _session_tools(server, paths, store)
    _twin_tools(server, roots)
    _resources(server, paths, store)
    return server


def _plan_tools(server: Any, roots: FileRoots) -> None:
    @server.tool(annotations=READ_ONLY)
    async def list_plans() -> list[views.PlanRow]:
        """The optimization plans that ship with pivot: name, title, number of items. Give a name to check_plan or
        start_campaign (a path to a plan TOML file works too)."""
        return await _in_thread(views.list_plans)

    @server.tool(annotations=READ_ONLY)
    async def check_plan(
        plan: Annotated[str, Field(description="A shipped plan's name or a plan file")],
    ) -> views.PlanCheck:
        """Check a plan before any launch (`pivot plan check`): its model and hardware profiles exist, the base
        flags and every item's flags pass the engine's audit (unknown, removed, ambiguous, invalid: error; no-op,
        deprecated: warning), and the plan checks of each item's claims. `ok` false: fix the errors first."""
        _guarded(roots.check, plan, "plan")
        return await _in_thread(views.check_plan, plan)


def _campaign_tools(server: Any, paths: Paths, store: Store, roots: FileRoots) -> None:
    async def step(session_id: str, answer: str | None, ctx: Context | None) -> CampaignOutcome:
        report = ctx.report_progress if ctx is not None else None
        try:
            return await run_step(paths, store, session_id, answer=answer, report=report)
        except PivotError as e:
            raise _tool_error(e) from e

    @server.tool(annotations=RUNS)
    async def start_campaign(
        plan: Annotated[str, Field(description="A shipped plan's name (list_plans) or a plan file")],
        ctx: Context,
        engine: Annotated[
            str, Field(description="sim (the digital twin, no GPU), sim-http, sglang, vllm, ...")
        ] = "sim",
        name: Annotated[str | None, Field(description="The session's name (default: the plan's)")] = None,
        noise: Annotated[
            float | None, Field(ge=0, le=0.5, description="Simulated engines' run-to-run noise, e.g. 0.015 (0-0.5)")
        ] = None,
        concurrency: Annotated[
            list[Annotated[int, Field(ge=1, le=100_000)]] | None,
            Field(max_length=64, description="Replace the plan's concurrency levels"),
        ] = None,
        model: Annotated[
            str | None,
            Field(
                description="The agent's model: autopilot (default) or a pydantic-ai "
                "model string whose key is in pivot's environment"
            ),
        ] = None,
        seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0,
        min_gain_pct: Annotated[float, Field(ge=0, description="The least gain adopted (and beyond the noise)")] = 3.0,
        objective: Annotated[
            Literal["throughput", "goodput", "capacity", "energy"] | None,
            Field(description="What to optimize (default: the plan's [objective], else throughput, output tok/s)"),
        ] = None,
        slo: Annotated[
            str | None, Field(description="SLOs per request in ms, as `pivot run --slo` takes them: ttft:500,tpot:50")
        ] = None,
    ) -> CampaignOutcome:
        """Start a session on a plan and run pivot's agent until its first pivot, as `pivot run PLAN` does: it writes
        the improvement documents, measures the baseline twice, works through Tier 1 and stops with a status summary
        and a question. Progress is reported as it goes; cancelling stops the server and leaves the session
        resumable. Answer with answer_pivot."""
        _guarded(roots.check, plan, "plan")
        try:
            session_id = await anyio.to_thread.run_sync(
                lambda: _create(
                    paths, store, plan, engine, name, noise, concurrency, model, seed, min_gain_pct, objective, slo
                )
            )
        except PivotError as e:
            raise _tool_error(e) from e
        return await step(session_id, None, ctx)

    @server.tool(annotations=RUNS)
    async def answer_pivot(
        session: Annotated[str, Field(description="The session's id (or name)")],
        answer: Annotated[
            str, Field(description="An option's number, a plan item's id or words of its title, 'continue' or 'stop'")
        ],
        ctx: Context,
    ) -> CampaignOutcome:
        """Answer the session's open pivot and run on to the next one, as `pivot resume SESSION --answer A` does
        (with no pivot open, the answer is a message to the agent). On a finished session an item id tests that item
        again. Progress is reported; cancelling stops the server and leaves the session resumable."""
        return await step(session, answer, ctx)

    @server.tool(annotations=RUNS)
    async def resume_campaign(
        session: Annotated[str, Field(description="The session's id (or name)")], ctx: Context
    ) -> CampaignOutcome:
        """Go on with a session where it stopped (after a cancel, a kill or a model failure; servers a dead run left
        are stopped first), as `pivot resume SESSION` does. A session waiting at a pivot returns its question."""
        return await step(session, None, ctx)


def _create(
    paths: Paths,
    store: Store,
    plan_ref: str,
    engine: str,
    name: str | None,
    noise: float | None,
    concurrency: list[int] | None,
    model: str | None,
    seed: int,
    min_gain_pct: float,
    objective: str | None = None,
    slo: str | None = None,
) -> str:
    """Record a new session as `pivot run` would (checked first: the plan, the engine, the model's key, the
    objective and its SLOs)."""
    from agent import loop
    from agent.contracts import engine_names, load_engine
    from agent.defaults import default_model, session_settings
    from agent.plans import load_plan
    from agent.session import Session

    plan = load_plan(plan_ref)
    if objective is not None or slo is not None:
        plan = plan.with_objective(_objective(plan.objective, objective, slo))
    if engine not in engine_names():
        raise PivotError(f"no engine {engine!r}", hint=f"installed: {', '.join(engine_names())}")
    if concurrency:
        plan = plan.model_copy(
            update={"workload": plan.workload.model_copy(update={"concurrency": m.parse_levels(concurrency)})}
        )
    if engine != "sim":
        from tools import loadgen

        loadgen.check_open_files(max(plan.workload.concurrency))
    model_name = default_model(model)
    if model_name != loop.AUTOPILOT:
        loop.provider_model(model_name, None)
    settings = session_settings(plan.target, engine, {}, noise, {"seed": seed, "min_gain": min_gain_pct})
    load_engine(engine, **settings.engine_options)  # an engine these options cannot build is refused before a session
    with Session.create(store, paths, plan, name=name or plan.name, engine_name=engine, model=model_name,
                        settings=settings) as session:  # fmt: skip
        return session.id


def _objective(base: m.Objective, kind: str | None, slo: str | None) -> m.Objective:
    """The plan's objective with start_campaign's objective and SLOs, as `pivot run --objective --slo` builds it."""
    from pydantic import ValidationError

    try:
        slos = m.parse_slos([slo]) if slo else None
        return m.Objective.build(kind, slos, base)
    except ValidationError as e:
        raise PivotError(f"bad objective: {e.errors()[0]['msg'].removeprefix('Value error, ')}",
                         hint="e.g. objective='goodput', slo='ttft:500,tpot:50' (SLOs in ms)") from e  # fmt: skip
    except ValueError as e:
        raise PivotError(f"bad slo: {e}", hint="write SLOs in ms: ttft:500,tpot:50") from e


def _guarded(check: Any, *args: Any) -> None:
    try:
        check(*args)
    except PivotError as e:
        raise _tool_error(e) from e


def _session_tools(server: Any, paths: Paths, store: Store) -> None:
    @server.tool(annotations=READ_ONLY)
    async def list_sessions() -> list[dict[str, Any]]:
        """The sessions of this pivot home: id, name, plan, target, engine, status, experiments, the open pivot's
        question, the pid holding it, last update; newest first."""
        return await _in_thread(views.list_sessions, store)

    @server.tool(annotations=READ_ONLY)
    async def show_session(session: Annotated[str, Field(description="The session's id (or name)")]) -> dict[str, Any]:
        """A session's todos, experiments (change, output tok/s at the judged level, runs, verdict and reason, the
        twin's prediction), pivots and answers, documents, investigations and model use."""
        return await _in_thread(views.show_session, store, session)

    @server.tool(annotations=RUNS)
    async def write_summary(
        session: Annotated[str, Field(description="The session's id (or name)")],
        html: Annotated[bool, Field(description="Also write the HTML and its charts")] = False,
        new: Annotated[
            bool, Field(description="Start the next summary number instead of rebuilding the latest")
        ] = False,
        question: Annotated[str | None, Field(description="The question to end on (default: the open pivot's)")] = None,
        options: list[str] | None = None,
    ) -> views.SummaryWritten:
        """Analyse the best experiment, rebuild the improvement documents and the latest status summary from the
        ledger (`pivot summary`); returns its path, its resource URI and its markdown. Nothing is launched."""
        return await _in_thread(views.write_summary, store, paths, session, question=question, options=options,
                                new=new, html=html)  # fmt: skip

    @server.tool(annotations=RUNS)
    async def investigate(
        session: Annotated[str, Field(description="The session's id (or name)")],
        question: str,
        kind: Annotated[m.InvestigationKind, Field(description="crash, root_cause or question")] = "question",
        experiment_id: Annotated[
            int | None, Field(description="The experiment's number in the session (as summaries and show_session say)")
        ] = None,
    ) -> dict[str, Any]:
        """Put a question to a sub-agent with read-only tools (the ledger, a server's log, the analysis, the GEMM
        evidence, profile traces, the twin's predictions, the flag audit); its report is recorded in the ledger and
        cited in the next status summary under Investigations. It launches and judges nothing."""
        from agent.investigate import run_investigation
        from agent.session import Session

        try:
            opened = await anyio.to_thread.run_sync(lambda: Session.open(store, paths, session))
        except PivotError as e:
            raise _tool_error(e) from e
        try:
            if experiment_id is not None:  # the session's number, read as the model tools read it
                found = opened.store.experiment_by_number(opened.id, experiment_id)
                if found is None:
                    raise _tool_error(PivotError(f"session {opened.id} has no experiment {experiment_id}"))
                experiment_id = found.id
            inv = await run_investigation(opened, question, kind=kind, experiment_id=experiment_id)
        finally:
            await anyio.to_thread.run_sync(opened.close)
        return inv.model_dump(mode="json")


def _twin_tools(server: Any, roots: FileRoots) -> None:
    @server.tool(annotations=READ_ONLY)
    async def predict(
        flags: Annotated[str, Field(description="SGLang's flags, e.g. '--tp-size 8 --max-running-requests 2048'")] = "",
        plan: Annotated[
            str | None,
            Field(description="Take the target, workload (and base flags when `flags` is empty) from this plan"),
        ] = None,
        model_profile: str | None = None,
        hardware: str | None = None,
        gpus: Annotated[int | None, Field(ge=1, le=1024)] = None,
        concurrency: Annotated[list[Annotated[int, Field(ge=1, le=100_000)]] | None, Field(max_length=64)] = None,
        num_prompts: Annotated[int | None, Field(ge=1, le=1_000_000)] = None,
        noise: Annotated[float, Field(ge=0, le=0.5, description="Run-to-run variation, 0 to 0.5")] = 0.0,
    ) -> views.Prediction:
        """The digital twin's prediction of a benchmark sweep of SGLang 0.5.23 with `flags` on simulated GPUs
        (`pivot sim predict`): per concurrency level bench_serving's throughput and latency keys, the resolved
        configuration, no-op and unmodelled flags, and a predicted crash. Simulated, not measured."""
        for ref, what in ((plan, "plan"), (model_profile, "model profile"), (hardware, "hardware profile")):
            _guarded(roots.check, ref, what)
        return await _in_thread(views.predict, flags, plan_ref=plan, model_profile=model_profile, hardware=hardware,
                                gpus=gpus, concurrency=concurrency, num_prompts=num_prompts, noise=noise)  # fmt: skip

    @server.tool(annotations=READ_ONLY)
    async def audit_flags(
        flags: Annotated[str, Field(description="The server's flags, e.g. '--tp-size 8 --enable-mscclpp'")],
        engine: Annotated[str, Field(description="sglang or vllm")] = "sglang",
        engine_version: str | None = None,
    ) -> views.AuditResult:
        """Audit server flags before any GPU time (`pivot audit-flags`): each flag ok, unknown (removed flags name
        their replacement), ambiguous, deprecated, invalid or noop, with what to do instead; `would_start` false
        when the server would refuse them."""
        return await _in_thread(views.audit_flags, flags, engine, engine_version)


def _resources(server: Any, paths: Paths, store: Store) -> None:
    from fastmcp.exceptions import ResourceError

    def read(fn: Any, *args: Any) -> str:
        try:
            return fn(*args)
        except PivotError as e:
            raise ResourceError(e.message) from e

    @server.resource("pivot://sessions", mime_type="application/json", name="sessions")
    def sessions() -> str:
        """The sessions of this pivot home (as list_sessions)."""
        import json

        return json.dumps(views.list_sessions(store), default=str)

    @server.resource("pivot://sessions/{session_id}/status", mime_type="text/markdown", name="status summary")
    def status(session_id: str) -> str:
        """The latest status summary of a session: best results, what was tried, ruled out, root cause,
        investigations, next steps and the question."""
        return read(views.status_text, store, paths, session_id)

    @server.resource("pivot://sessions/{session_id}/documents/{name}", mime_type="text/markdown", name="document")
    def document(session_id: str, name: str) -> str:
        """One of a session's documents by file name (an improvement document NN-slug.md or status-NNN.md)."""
        return read(views.document_text, store, paths, session_id, name)

    server.add_provider(LedgerResources(paths, store))


def _provider_base() -> type:
    from fastmcp.server.providers.base import Provider

    return Provider


class LedgerResources(_provider_base()):  # type: ignore[misc]
    """Lists each session's latest status summary and documents as resources (read through the templates)."""

    def __init__(self, paths: Paths, store: Store) -> None:
        super().__init__()
        self.paths, self.store = paths, store

    async def _list_resources(self) -> list[Any]:
        return await anyio.to_thread.run_sync(self._listing)

    def _listing(self) -> list[Any]:
        from fastmcp.resources import FunctionResource

        from tools.reports import latest_status_doc

        out: list[Any] = []
        for row in self.store.session_summaries():
            docs = self.store.documents(row.id)
            latest = latest_status_doc(docs)
            if latest is not None:
                out.append(FunctionResource.from_function(
                    lambda sid=row.id: views.status_text(self.store, self.paths, sid), uri=status_uri(row.id),
                    name=f"{row.id} status", description=f"Latest status summary of session {row.id} ({row.name})",
                    mime_type="text/markdown"))  # fmt: skip
            for d in docs:
                name = d.path.rsplit("/", 1)[-1]
                out.append(FunctionResource.from_function(
                    lambda sid=row.id, n=name: views.document_text(self.store, self.paths, sid, n),
                    uri=f"pivot://sessions/{row.id}/documents/{name}", name=f"{row.id} {name}",
                    description=f"{d.title} ({d.status})", mime_type="text/markdown"))  # fmt: skip
        return out


def serve(paths: Paths, store: Store, *, http: bool, host: str, port: int, path: str, token: str | None = None,
          roots: FileRoots | None = None) -> None:  # fmt: skip
    """Serve until the client goes (stdio) or Ctrl-C (HTTP: Host and Origin checked on every request, and the
    bearer token when one is given; agent/mcp/guard.py)."""
    from starlette.middleware import Middleware

    from agent.mcp.guard import BearerToken

    server = build_server(paths, store, roots)
    if http:
        middleware = [Middleware(BearerToken, token=token)] if token else None
        server.run(transport="http", host=host, port=port, path=path, show_banner=False,
                   host_origin_protection=True, middleware=middleware)  # fmt: skip
    else:
        from agent.mcp.stdio import answering_stdio

        with answering_stdio():  # a line that is not JSON-RPC is answered (-32700/-32600), never dropped
            server.run(transport="stdio", show_banner=False)
