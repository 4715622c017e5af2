"""`pivot demo`, `pivot run` and `pivot resume`: the agent loop from the command line.

Progress goes to stderr while the agent works; the outcome (the pivot's question and how to answer it, or the
final message) goes to stdout, or as JSON with --json. Nothing needs a terminal.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import click

from agent import defaults
from agent import models as m
from agent.cli.engines import ENGINE, _engine_options
from agent.cli.mcp_options import check_investigator, mcp_options, settings_update, with_mcp_options
from agent.cli.options import NOISE, SEED, field_number
from agent.cli.progress import Progress
from agent.console import err, out, print_json, warn
from agent.defaults import SIMULATED, default_model, session_settings, setting, simulated_gpus
from agent.errors import Interrupted, PivotError
from agent.plans import load_plan
from agent.session import Session
from agent.text import printable


def _start(
    ctx: click.Context,
    plan_ref: str,
    *,
    engine: str,
    name: str | None,
    settings: m.SessionSettings,
    levels: str | None,
    method: dict[str, Any],
    objective: dict[str, Any] | None = None,
) -> None:
    from agent import loop

    home = ctx.obj
    plan = load_plan(plan_ref)
    if levels:
        workload = plan.workload.model_copy(update={"concurrency": m.parse_levels(levels)})
        plan = plan.model_copy(update={"workload": workload})
    if objective:
        plan = plan.with_objective(objective_of(plan.objective, **objective))
    note = check_plan(plan, engine, settings)
    _preflight(engine, plan)
    _check_engine(engine, settings)
    model_name = default_model(method["model"])
    if method["model_base_url"] is not None:  # checked before it is stored: no key in it, a port in range
        method["model_base_url"] = loop.check_model_base_url(method["model_base_url"])
    if model_name != loop.AUTOPILOT:  # a missing key fails here, before a session is recorded for nothing
        loop.provider_model(model_name, method["model_base_url"])
    check_investigator(method.get("investigator_model"))
    executor = _open_executor(settings)  # a cluster out of reach fails before a session is recorded
    try:
        session = Session.create(
            home.store,
            home.paths,
            plan,
            name=name or plan.name,
            engine_name=engine,
            model=model_name,
            model_base_url=method["model_base_url"],
            settings=settings,
            events=Progress(method["quiet"]),
        )
    except BaseException:
        if executor is not None:
            executor.close()
        raise
    session.executor = executor
    err.print(f"session {session.id}: plan {plan.name}, engine {engine}, model {model_name}", highlight=False)
    if note:  # said, not warned: the campaign handles them (the seeds' plan has two, on purpose)
        err.print(note, highlight=False, soft_wrap=True)
    _record_profiles(session)
    with session:
        _install_signals()
        outcome = _run_loop(session)
    _report(session, outcome, method["as_json"], method.get("detailed_exitcode", False))


def _record_profiles(session: Session) -> None:
    """The target's profiles, generated now when the plan names none and recorded with the session (a model whose
    config.json is not here yet is tried again when the analysis first needs it: the engine may download it)."""
    from tools.profiles.target import session_profiles

    try:
        profiles = session_profiles(session.store, session.id)
    except PivotError as e:
        warn(f"{e.message}; the analysis will try again once the model is here")
        return
    if profiles.generated:
        err.print("profiles: " + "; ".join(profiles.notes), highlight=False)


def _run_loop(session: Session, answer: str | None = None) -> Any:
    """The agent loop on `session`; Ctrl-C is one line with the command that goes on where it stopped."""
    from agent import loop

    events = session.events
    try:
        with events.running() if isinstance(events, Progress) else contextlib.nullcontext():
            return loop.run(session, answer=answer)
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted: session {session.id} stopped; everything it recorded is kept (the step cut short is redone)",
            hint=f"pivot resume {session.id} goes on where it stopped",
        ) from None


def check_plan(plan: m.Plan, engine: str, settings: m.SessionSettings) -> str | None:
    """Refuse a plan whose target has an error before a session exists; the line on the item errors the campaign
    handles (an item the engine refuses is ruled out before any launch), said once the session exists."""
    from tools.preflight import check_runnable, item_errors_note

    options = settings.engine_options if engine == plan.target.engine else {}  # the audit's engine is the plan's
    return item_errors_note(plan, check_runnable(plan, options, engine))


def _check_engine(engine: str, settings: m.SessionSettings) -> None:
    """Build the engine once with the session's options, so an option it refuses is one line before a session."""
    from agent.contracts import load_engine

    load_engine(engine, **settings.engine_options)


def _preflight(engine: str, plan: m.Plan) -> None:
    """What would stop the campaign at its first benchmark, refused before a session or a server exists: a
    concurrency this process cannot open the sockets for (engines benchmarked over HTTP; sim runs in process)."""
    if engine == "sim":
        return
    from tools import loadgen

    top = max(plan.workload.concurrency)
    try:
        loadgen.check_open_files(top)
    except PivotError as e:
        raise PivotError(f"concurrency {top} cannot be benchmarked here: {e.message}; nothing was launched",
                         hint=e.hint) from e  # fmt: skip


def _install_signals() -> None:
    from tools.engines.process import install_signal_handlers

    install_signal_handlers()


def best_line(session: Session) -> str | None:
    """Where the campaign stands, in one line: the best configuration against the baseline, or that nothing has
    beaten the baseline yet (None before the baseline is measured)."""
    from tools.method.reading import Method

    try:
        method = Method.read(session.store, session.id)
    except PivotError:
        return None
    base, best = method.baseline(), method.best()
    if base is None or best is None:
        return None
    values, n = method.ok_values(base), method.objective.number
    if not values:
        return None
    top = max(values)
    b = sum(values[top]) / len(values[top])
    if best.id == base.id:
        return (
            f"best: nothing has beaten the baseline yet (experiment {base.number}, {n(b)} {method.objective.at(top)})"
        )
    after = method.ok_values(best).get(top) or []
    items = "+".join(best.plan_items) or "a change"
    if best.reverts:  # a step that took items back says so, and what the best holds now
        held = "+".join(method.active_items()) or "no plan item"
        items = f"{'+'.join(best.plan_items) + ' ' if best.plan_items else ''}without {'+'.join(best.reverts)}: {held}"
    if not after:
        return f"best: experiment {best.number} ({items})"
    a = sum(after) / len(after)
    pct = f" ({(a - b) / b * 100:+.1f}%)" if b > 0 else ""
    return (
        f"best: experiment {best.number} ({items}), {n(a)} {method.objective.at(top)} against the baseline's {n(b)}"
        f"{pct}"
    )


EXIT_PIVOT = 3  # --detailed-exitcode: the campaign waits at a pivot (0: finished; 1: an error; 2: a usage error)
DETAILED_EXITCODE = click.option(
    "--detailed-exitcode",
    "detailed_exitcode",
    is_flag=True,
    help=f"Exit {EXIT_PIVOT} when the campaign stops at a pivot, 0 only when it finished (for scripts; without it a "
    "stop at a pivot is a success, 0).",
)


def _report(session: Session, outcome: Any, as_json: bool, detailed: bool = False) -> None:
    _show_outcome(session, outcome, as_json)
    if detailed and outcome.status == "pivot":
        raise SystemExit(EXIT_PIVOT)


def _show_outcome(session: Session, outcome: Any, as_json: bool) -> None:
    best = best_line(session)
    if as_json:
        print_json(
            {
                "session": session.id,
                "status": outcome.status,
                "best": best,
                "message": outcome.message,
                "summary": outcome.summary_path,
                "question": outcome.pivot.question if outcome.pivot else None,
                "options": outcome.pivot.options if outcome.pivot else [],
                "hint": outcome.hint,
            }
        )
        if outcome.status == "failed":
            raise SystemExit(1)
        return
    if outcome.status == "pivot" and outcome.pivot is not None:
        p = outcome.pivot
        out.print(f"pivot: session {session.id} stopped at a pivot point.", highlight=False)
        if best:
            out.print(best, highlight=False)
        if outcome.summary_path:
            out.print(f"summary: {session.paths.home / outcome.summary_path}", highlight=False)
        out.print(f"question: {printable(p.question)}", highlight=False, soft_wrap=True)
        for i, option in enumerate(p.options, start=1):
            out.print(f"  {i}. {printable(option)}", highlight=False, soft_wrap=True)
        out.print(
            f"answer with: pivot resume {session.id} --answer 1   (a number, an item id, 'continue' or 'stop')",
            highlight=False,
        )
        return
    if outcome.status == "failed":  # the model failed: one line and a hint, the session left resumable
        raise PivotError(outcome.message, hint=outcome.hint)
    out.print(f"{outcome.status}: {printable(outcome.message)}", highlight=False, soft_wrap=True)
    if best:
        out.print(best, highlight=False)
    if outcome.status == "stopped":
        raise SystemExit(1)


def _take_plan(session: Session, plan: m.Plan) -> None:
    """Replace the session's plan with `plan`, recording what changed (nothing when nothing did)."""
    from agent.plans import plan_changes

    store = session.store
    if "objective" not in plan.model_fields_set:  # a file without [objective] keeps the session's (--objective)
        plan = plan.with_objective(session.record.plan.objective)
    changes = plan_changes(session.record.plan, plan, store.experiments(session.id))
    if not changes:
        warn(f"the plan {plan.source or plan.name} is the session's plan as it is: nothing changed")
        return
    store.change_session_plan(session.id, plan, changes)
    session.refresh()
    err.print(f"session {session.id} goes on with the edited plan {plan.source or plan.name}:", highlight=False)
    for line in changes:
        err.print(f"  {line}", highlight=False, soft_wrap=True)


def _baseline_failed(session: Session) -> bool:
    """Whether the session's baseline was tried and never measured (it did not start)."""
    from tools.method import Method

    method = Method.read(session.store, session.id)
    base = method.baseline()
    return base is not None and base.status == "failed" and method.run_count(base) == 0


def _take_edited_source(session: Session) -> None:
    """After a failed baseline: the plan file the session came from, when it was edited since (else nothing)."""
    source = session.record.plan.source
    if not source or not Path(source).is_file():
        return
    try:
        edited = load_plan(source)
    except PivotError as e:
        warn(f"the plan file {source} does not load ({e.message}); the session keeps its plan")
        return
    if edited.model_dump(exclude={"source"}) != session.record.plan.model_dump(exclude={"source"}):
        _take_plan(session, edited)


def _executor_options(resume: bool = False) -> list[Any]:
    """--ray, --parallel and --ray-gpus: where experiments run (see tools/executors/)."""
    return [
        click.option(
            "--ray",
            "ray",
            metavar="ADDRESS",
            default=None,
            help="Run each experiment as a task on the Ray cluster at ADDRESS (auto, HOST:6379, ray://HOST:10001; "
            "local starts one on this host), on whichever node has its GPUs free. Needs pivot[ray]."
            + (" `off` runs the rest here. Default: the session's." if resume else ""),
        ),
        click.option(
            "--parallel",
            type=field_number(m.SessionSettings, "parallel", max=1024),
            default=None if resume else setting("parallel"),
            show_default=not resume,
            help="With --ray: run up to N independent experiments of one search step at once.",
        ),
        click.option(
            "--ray-gpus",
            type=field_number(m.SessionSettings, "ray_gpus", max=1024),
            default=None,
            help="With --ray local: the GPUs the local instance offers (default: those Ray detects; a simulated engine's "
            "are the plan's GPUs x --parallel)" + ("; default: the session's." if resume else "."),
        ),
    ]


def _open_executor(settings: m.SessionSettings) -> Any:
    """The executor the settings name (None: this process), or a clear error before anything is launched."""
    if settings.parallel > 1 and settings.executor is None:
        raise PivotError(
            f"--parallel {settings.parallel} runs experiments at once on a Ray cluster: give --ray ADDRESS",
            hint="--ray local runs them side by side on this host's GPUs",
        )
    if settings.ray_gpus is not None and settings.executor != "local":
        raise PivotError("--ray-gpus applies to --ray local only (a cluster's nodes declare their own GPUs)")
    from tools.executors import open_executor

    executor = open_executor(settings.executor, settings.parallel, num_gpus=settings.ray_gpus)
    if executor is not None:
        err.print(f"experiments run on {executor.describe()}", highlight=False)
    return executor


def _method_options(f: Any) -> Any:
    for decorator in reversed(
        [
            click.option(
                "--model",
                "model",
                help="A pydantic-ai model string (anthropic:..., openai-chat:...), autopilot, or "
                "script:FILE.jsonl (replays one step a line). Default: $PIVOT_MODEL, else autopilot.",
            ),
            click.option(
                "--model-base-url", help="An OpenAI-compatible server for --model (its key: $PIVOT_MODEL_API_KEY)."
            ),
            click.option(
                "--seed",
                type=SEED,
                default=setting("seed"),
                show_default=True,
                help="Seeds the simulated engines' noise.",
            ),
            click.option(
                "--min-gain",
                type=field_number(m.SessionSettings, "min_gain_pct", max=100),
                default=setting("min_gain_pct"),
                show_default=True,
                help="Percent a change must gain (and beat the measured noise) to be adopted.",
            ),
            click.option(
                "--reruns",
                type=field_number(m.SessionSettings, "reruns", max=20),
                default=setting("reruns"),
                show_default=True,
                help="Reruns of a gain inside the noise.",
            ),
            click.option(
                "--stall-after",
                type=field_number(m.SessionSettings, "stall_after", max=1000),
                default=setting("stall_after"),
                show_default=True,
                help="Pivot after this many changes in a row without gain.",
            ),
            click.option(
                "--search",
                "search_kind",
                type=click.Choice(["twin", "optuna-tpe", "optuna-gp", "random", "plan-order"]),
                default=setting("proposer"),
                show_default=True,
                help="What proposes the launches: the twin-guided search with confirmed adoptions (tools/search.py), "
                "a peer under the same method (Optuna's TPE or GP sampler, random configurations: tools/peers.py, "
                "needs pip install -e '.[optuna]', and PyTorch for the GP), or the plain greedy path in the plan's "
                "order, to compare.",
            ),
            click.option("--no-search", is_flag=True, help="An alias of --search plan-order."),
            click.option(
                "--fit-twin",
                is_flag=True,
                default=setting("fit_twin"),
                help="Rank by the twin fitted to this target: its host overhead, GEMM efficiency, bandwidth and power "
                "scaled to every level measured so far (tools/fit.py; seconds of simulation after each measurement).",
            ),
            click.option(
                "--max-launches",
                type=field_number(m.SessionSettings, "max_launches", max=100_000),
                default=None,
                help="A launch budget any search respects: no new launch once this many servers were started (a "
                "verdict's confirming rerun may follow the last). Example: --search optuna-tpe --max-launches 12.",
            ),
            click.option(
                "--paired",
                type=click.Choice(["auto", "on", "off"]),
                default=setting("paired"),
                show_default=True,
                help="Judge a decisive change in pairs with its base measured again after it (A/B/A, so a drifting "
                "host moves both): auto pairs an engine that measures, not a simulated one.",
            ),
            click.option(
                "--request-limit",
                type=field_number(m.SessionSettings, "request_limit", max=1_000_000),
                default=setting("request_limit"),
                show_default=True,
                help="Model requests per run before pivot stops it (resume goes on).",
            ),
            *_executor_options(),
            *mcp_options(),
            click.option("--quiet", "-q", is_flag=True, help="No progress on stderr (warnings only)."),
            click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON on stdout."),
            DETAILED_EXITCODE,
        ]
    ):
        f = decorator(f)
    return f


@click.command()
@_method_options
@click.pass_context
def demo(ctx: click.Context, **method: Any) -> None:
    """The seeds' campaign on the digital twin: GLM-5-NVFP4 on 8x RTX PRO 6000, the built-in autopilot, noise on.

    Writes the improvement documents, measures the baseline and Tier 1, and stops at the first pivot with a status
    summary and a question; `pivot resume SESSION --answer 1` goes on.
    """
    plan_ref, noise = defaults.demo()
    plan = load_plan(plan_ref)
    engine = defaults.default_engine()
    settings = session_settings(plan.target, engine, {}, noise, method)
    _start(ctx, plan_ref, engine=engine, name="demo", settings=settings, levels=None, method=method)


def objective_of(
    base: m.Objective,
    *,
    kind: str | None,
    slos: tuple[str, ...],
    attainment: float | None,
    goodput_kind: str | None,
    load: str | None,
) -> m.Objective:
    """The plan's objective with the command line's --objective, --slo, --attainment, --goodput-kind and --load
    (kept with the session's plan); a clear error for one that does not hold together."""
    from pydantic import ValidationError

    try:
        parsed = m.parse_slos(slos) if slos else None
    except ValueError as e:
        raise PivotError(f"bad --slo: {e}", hint="write SLOs in ms: --slo ttft:500,tpot:50") from e
    try:
        return m.Objective.build(kind, parsed, base, attainment_target=attainment, goodput=goodput_kind, load=load)
    except ValidationError as e:
        reason = e.errors()[0]["msg"].removeprefix("Value error, ")
        raise PivotError(
            f"bad objective: {reason}", hint="e.g. --objective capacity --slo ttft:500,tpot:50 (SLOs in ms)"
        ) from e


OBJECTIVE_OPTIONS = [
    click.option(
        "--objective",
        "objective_kind",
        type=click.Choice(["throughput", "goodput", "capacity", "energy"]),
        help="What to optimize (default: the plan's [objective], else throughput, output tok/s).",
    ),
    click.option(
        "--slo",
        "slos",
        multiple=True,
        metavar="METRIC:MS,...",
        help="SLOs per request in ms (ttft, tpot, e2el), e.g. --slo ttft:500,tpot:50; they replace the plan's.",
    ),
    click.option(
        "--attainment",
        type=click.FloatRange(0, 1, min_open=True),
        help="The share of requests that must meet the SLOs (default 0.95).",
    ),
    click.option(
        "--goodput-kind",
        type=click.Choice(["request", "token"]),
        help="goodput: request goodput (req/s, SGLang's) or token goodput (output tok/s of good requests).",
    ),
    click.option(
        "--load",
        type=click.Choice(["concurrency", "request_rate"]),
        help="capacity: the load that grows, concurrency or request rate (Poisson arrivals).",
    ),
]


def _objective_options(f: Any) -> Any:
    for decorator in reversed(OBJECTIVE_OPTIONS):
        f = decorator(f)
    return f


@click.command("run")
@click.argument("plan_ref", metavar="PLAN")
@click.option(
    "--engine",
    type=ENGINE,
    help="An installed engine (`pivot tools` lists them). Default: $PIVOT_ENGINE, else sim.",
)
@click.option(
    "-o",
    "--engine-option",
    "option_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="An engine option, e.g. -o time_scale=200 (sim-http), -o prefix='docker exec box' (sglang, vllm).",
)
@click.option("--name", help="The session's name (default: the plan's).")
@click.option("--noise", type=NOISE, help="Simulated engines: run-to-run noise (e.g. 0.015). Default: none.")
@click.option("--concurrency", "levels", help="Replace the plan's concurrency levels (e.g. 1,64,256: a shorter run).")
@_objective_options
@_method_options
@click.pass_context
def run_cmd(
    ctx: click.Context,
    plan_ref: str,
    engine: str | None,
    option_pairs: tuple[str, ...],
    name: str | None,
    noise: float | None,
    levels: str | None,
    objective_kind: str | None,
    slos: tuple[str, ...],
    attainment: float | None,
    goodput_kind: str | None,
    load: str | None,
    **method: Any,
) -> None:
    """Start a session on PLAN (a file or a shipped plan's name) and run the agent until its first pivot.

    --objective and --slo set what the campaign optimizes (kept with the session): throughput (output tok/s),
    goodput, capacity (the highest load meeting the SLOs) or energy (output tokens per joule)."""
    engine = engine or defaults.default_engine()
    plan = load_plan(plan_ref)
    objective = dict(kind=objective_kind, slos=slos, attainment=attainment, goodput_kind=goodput_kind, load=load)
    given = any(v for v in objective.values())
    if given:  # checked before any session is recorded
        objective_of(plan.objective, **objective)
    settings = session_settings(plan.target, engine, _engine_options(option_pairs, None, None), noise, method)
    _start(ctx, plan_ref, engine=engine, name=name, settings=settings, levels=levels, method=method,
           objective=objective if given else None)  # fmt: skip


def _executor_options_for_resume(f: Any) -> Any:
    for decorator in reversed(_executor_options(resume=True)):
        f = decorator(f)
    return f


def _resume_executor(session: Session, ray: str | None, parallel: int | None, ray_gpus: int | None) -> None:
    """The executor a resumed session goes on with: the one it was started with, unless --ray/--parallel say
    otherwise (recorded, so the next resume goes on the same way)."""
    settings = session.settings
    update: dict[str, Any] = {}
    if ray is not None:
        update["executor"] = None if ray.lower() in ("off", "none", "here") else ray
    if parallel is not None:
        update["parallel"] = parallel
    elif ray is not None and update["executor"] is None:
        update["parallel"] = 1
    if ray_gpus is not None:
        update["ray_gpus"] = ray_gpus
    elif ray is not None and update["executor"] != "local":
        update["ray_gpus"] = None
    elif ray is not None and session.record.engine in SIMULATED:  # the twin's GPUs are the plan's
        gpus = int(settings.engine_options.get("gpus") or session.target.gpus)
        update["ray_gpus"] = simulated_gpus(gpus, update.get("parallel") or settings.parallel)
    if update:
        settings = settings.model_copy(update=update)
    session.executor = _open_executor(settings)
    if update and settings != session.settings:
        session.store.set_session_settings(session.id, settings)
        session.refresh()


def _mcp_options_for_resume(f: Any) -> Any:
    return with_mcp_options(f, resume=True)


@click.command()
@click.argument("session_ref", metavar="SESSION")
@click.option(
    "--answer",
    help="The answer to the open pivot (an option's number, an item id, 'continue', 'stop'), "
    "or a message when none is open.",
)
@click.option("--model", help="Drive this run with another model (the session keeps it).")
@click.option(
    "--plan",
    "plan_ref",
    metavar="FILE",
    help="Go on with this edited plan (same target): the session's plan is replaced and the change recorded.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr (warnings only).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON on stdout.")
@DETAILED_EXITCODE
@_executor_options_for_resume
@_mcp_options_for_resume
@click.pass_context
def resume(
    ctx: click.Context,
    session_ref: str,
    answer: str | None,
    model: str | None,
    plan_ref: str | None,
    quiet: bool,
    as_json: bool,
    detailed_exitcode: bool,
    ray: str | None,
    parallel: int | None,
    ray_gpus: int | None,
    mcp: str | None,
    mcp_instructions: bool | None,
    investigator_model: str | None,
) -> None:
    """Resume a session where it stopped: answer its pivot, or go on after a kill (leftover servers are stopped).

    With --plan FILE the session goes on with the edited plan (its base flags, items and text; the target must stay
    the same). After a baseline that did not start, `--answer continue` also takes the plan file the session was
    started from when it was edited since.
    """
    from agent import loop
    from agent.cli.mcp_options import apply_to_session

    home = ctx.obj
    update = settings_update(mcp, mcp_instructions, investigator_model)  # checked before the session is opened
    session = Session.open(home.store, home.paths, session_ref, events=Progress(quiet))
    with session:
        apply_to_session(session, update)
        if plan_ref is not None:
            _take_plan(session, load_plan(plan_ref))
        elif answer is not None and _baseline_failed(session):
            _take_edited_source(session)
        if model is not None and model != session.record.model:
            if model != loop.AUTOPILOT:  # checked before the session is changed
                loop.provider_model(model, session.record.model_base_url)
            home.store.set_session_model(session.id, model)
            session.refresh()
        if answer is None and session.record.status == "finished":
            out.print(f"session {session.id} is finished; give --answer to go on (an item id to test it again).")
            return
        open_pivot = home.store.open_pivot(session.id)
        if open_pivot is not None and answer is not None:  # a non-answer is refused: the question stays as asked
            from tools.method.answers import check_answer

            check_answer(answer, open_pivot, session.plan, session.id)
        if open_pivot is not None and answer is None:
            _report(
                session,
                loop.RunOutcome("pivot", open_pivot.question, pivot=open_pivot, summary_path=open_pivot.summary_path),
                as_json,
                detailed_exitcode,
            )
            return
        loop.resolve_model(session)
        _preflight(session.record.engine, session.plan)
        _resume_executor(session, ray, parallel, ray_gpus)
        _install_signals()
        outcome = _run_loop(session, answer=answer)
    _report(session, outcome, as_json, detailed_exitcode)
