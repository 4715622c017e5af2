"""`pivot serve`, `pivot launch-bench` and `pivot servers`: an engine's server launched, benchmarked and stopped by hand.

Each opens a session (a new one from a plan unless --session names one), so every server is recorded in the
ledger and one left running by a pivot that was killed is stopped. Progress goes to stderr; stdout carries the
server's URL (serve), the results (launch-bench) or the table of servers.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import click
from rich.status import Status

from agent import models as m
from agent.cli.bench import EXIT_INTERRUPTED, _ProgressView, _report, _spec
from agent.cli.options import PORT, SECONDS, field_number
from agent.console import dump, err, make_table, out, print_json, warn
from agent.contracts import Deployment, engine_names, load_engine
from agent.errors import PivotError
from agent.session import Session
from agent.settings import settings


def _option_value(text: str) -> Any:
    """An engine option's value: JSON when it parses (numbers, true/false, lists), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _engine_options(pairs: tuple[str, ...], host: str | None, port: int | None) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PivotError(f"bad engine option {pair!r}", hint="write -o KEY=VALUE, e.g. -o time_scale=50")
        options[key.replace("-", "_")] = _option_value(value)
    if host is not None:
        options["host"] = host
    if port is not None:
        options["port"] = port
    return options


class EngineName(click.ParamType):
    """An engine's name, checked against the engines installed as `pivot.engines` plugins (found when parsed, so a
    plugin installed later is a choice too)."""

    name = "engine"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "ENGINE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        names = engine_names()
        if value not in names:
            self.fail(f"{value!r} is not an installed engine; installed: {', '.join(names) or 'none'}", param, ctx)
        return str(value)


ENGINE = EngineName()


def engine_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options every command that launches a server shares."""
    for decorator in reversed(
        [
            click.option(
                "--engine",
                "engine_name",
                type=ENGINE,
                help="An installed engine: sglang, vllm, sim-http, command, ... (`pivot tools` lists them; default: "
                "the session's engine, else $PIVOT_SERVE_ENGINE, else sim-http).",
            ),
            click.option(
                "-o",
                "--engine-option",
                "option_pairs",
                multiple=True,
                metavar="KEY=VALUE",
                help="An engine option, e.g. -o time_scale=50, -o python=/opt/sgl/bin/python, "
                "-o 'prefix=docker exec sgl', -o 'command=vllm serve M --port {port}'. Repeatable.",
            ),
            click.option("--session", "session_ref", help="Record the server in this session (default: a new one)."),
            click.option(
                "--plan", "plan_ref", help="Plan of a new session (default: $PIVOT_DEMO_PLAN, else the demo's)."
            ),
            click.option("--host", help="Address the server binds to (default 127.0.0.1)."),
            click.option("--port", type=PORT, help="Port (default: a free one)."),
            click.option(
                "--timeout-s",
                "timeout_s",
                type=SECONDS,
                help="Seconds to wait for the server to be ready (default: the engine's).",
            ),
            click.option("--force", is_flag=True, help="Launch even when the flag audit finds flags it would refuse."),
            click.argument("flags", nargs=-1, type=click.UNPROCESSED),
        ]
    ):
        f = decorator(f)
    return f


def _open_session(ctx: click.Context, session_ref: str | None, plan_ref: str | None, engine_name: str) -> Session:
    from agent.plans import load_plan

    home = ctx.obj
    if session_ref is not None:
        if plan_ref is not None:
            raise PivotError("give --session or --plan, not both")
        session = Session.open(home.store, home.paths, session_ref)
    else:
        from tools.preflight import check_runnable

        plan = load_plan(plan_ref or settings().demo_plan)
        check_runnable(plan, engine=engine_name)  # a target with an error is refused before a session exists
        session = Session.create(
            home.store, home.paths, plan, name=f"{ctx.info_name} {engine_name}", engine_name=engine_name
        )
        err.print(f"session {session.id} (pivot show {session.id})")
    for notice in session.notices:
        warn(notice)
    return session


def _launch(
    ctx: click.Context,
    *,
    engine_name: str | None,
    option_pairs: tuple[str, ...],
    session_ref: str | None,
    plan_ref: str | None,
    host: str | None,
    port: int | None,
    force: bool,
    flags: tuple[str, ...],
) -> tuple[Session, Deployment, float | None]:
    """Open the session, build the engine, launch FLAGS; returns the session, the deployment and the engine's timeout."""
    from tools.engines.http import launch_in_session
    from tools.engines.process import FlagsRefused

    options = _engine_options(option_pairs, host, port)
    config = m.ServerConfig.parse(list(flags))
    if session_ref is not None and engine_name is None:
        engine_name = ctx.obj.store.get_session(session_ref).engine
    engine_name = engine_name or settings().serve_engine
    engine = load_engine(engine_name, **options)
    issues = engine.validate(config)
    blocking = [issue for issue in issues if issue.blocking]
    if blocking and not force:  # before a session is created for nothing
        raise FlagsRefused(engine.name, blocking)
    session = _open_session(ctx, session_ref, plan_ref, engine_name)
    session.engine = engine
    try:
        deployment = launch_in_session(session, config, force=force, issues=issues)
    except BaseException:
        session.close()
        raise
    if deployment.argv is not None:
        err.print(f"launched {engine_name}: {shlex.join(deployment.argv)}")
    return session, deployment, engine.ready_timeout_s


class _StartupView:
    """Startup progress on stderr: a spinner on a terminal, else a line whenever the server logs something new."""

    def __init__(self) -> None:
        self.status: Status | None = err.status("starting") if err.is_terminal else None
        self.last = ""

    def __enter__(self) -> _StartupView:
        if self.status is not None:
            self.status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.status is not None:
            self.status.stop()

    def __call__(self, text: str) -> None:
        if self.status is not None:
            self.status.update(text)
            return
        line = text.split(": ", 1)[-1]
        if line != self.last or text.startswith("ready"):
            self.last = line
            err.print(text)


def _wait_ready(deployment: Deployment, timeout_s: float | None) -> None:
    from tools.engines.process import DEFAULT_READY_TIMEOUT_S

    with _StartupView() as view:
        deployment.wait_ready(timeout_s or DEFAULT_READY_TIMEOUT_S, on_progress=view)


def _crash_error(deployment: Deployment, what: str) -> PivotError:
    failure = deployment.failure or "unknown"
    tail = "\n".join(deployment.log_tail(10))
    return PivotError(f"{what}: {failure}", hint=f"the server's last log lines:\n{tail}")


@click.command("serve", context_settings={"ignore_unknown_options": True})
@engine_options
@click.pass_context
def serve(ctx, engine_name, option_pairs, session_ref, plan_ref, host, port, timeout_s, force, flags) -> None:
    """Launch a server with FLAGS (after --), wait until it is ready, print its URL, and keep it until Ctrl-C.

    Example: pivot serve --engine sim-http -o time_scale=10 -- --tp-size 8. The server is stopped (its whole
    process group) on Ctrl-C, on SIGTERM, and when pivot exits for any other reason.
    """
    session, deployment, default_timeout = _launch(
        ctx, engine_name=engine_name, option_pairs=option_pairs, session_ref=session_ref, plan_ref=plan_ref,
        host=host, port=port, force=force, flags=flags,
    )  # fmt: skip
    try:
        if not deployment.base_url.startswith("http"):
            raise PivotError(
                f"engine {session.engine.name if session.engine else '?'} runs in process and serves nothing",
                hint="use sim-http to serve the twin over HTTP",
            )
        _wait_ready(deployment, timeout_s or default_timeout)
        out.print(deployment.base_url)
        err.print("serving; Ctrl-C stops the server")
        while deployment.alive():
            time.sleep(0.2)
        raise _crash_error(deployment, "the server stopped on its own")
    except KeyboardInterrupt:
        err.print("stopping the server")
        deployment.stop()
        sys.exit(EXIT_INTERRUPTED)
    finally:
        deployment.stop()
        session.close()


@click.command("launch-bench", context_settings={"ignore_unknown_options": True})
@engine_options
@click.option("--concurrency", "levels", default="1,64,256", show_default=True, help="Levels, e.g. 1,64,256.")
@click.option("--endpoint", type=click.Choice(["generate", "completions", "chat"]), help="Default generate.")
@click.option("--input-len", type=field_number(m.BenchSpec, "random_input_len"), help="Random input tokens (1024).")
@click.option("--output-len", type=field_number(m.BenchSpec, "random_output_len"), help="Random output tokens (1024).")
@click.option("--range-ratio", type=field_number(m.BenchSpec, "random_range_ratio"),
              help="bench_serving's --random-range-ratio (0.0).")  # fmt: skip
@click.option("--num-prompts", type=field_number(m.BenchSpec, "num_prompts"),
              help="Prompts per level (default 2 x concurrency, >= 8).")  # fmt: skip
@click.option("--seed", type=field_number(m.BenchSpec, "seed"), help="Workload seed (42).")
@click.option(
    "--disable-ignore-eos", is_flag=True, help="Let requests stop at EOS (strict OpenAI servers refuse ignore_eos)."
)
@click.option("--output-file", type=click.Path(dir_okay=False), help="Append one JSON line per level.")
@click.option(
    "--telemetry-file", type=click.Path(dir_okay=False), help="Append each level's GPU readings (JSON lines)."
)
@click.option("--json", "as_json", is_flag=True, help="Print only a JSON array of levels on stdout.")
@click.pass_context
def launch_bench(ctx, engine_name, option_pairs, session_ref, plan_ref, host, port, timeout_s, force, flags, levels,
                 endpoint, input_len, output_len, range_ratio, num_prompts, seed, disable_ignore_eos, output_file,
                 telemetry_file, as_json) -> None:  # fmt: skip
    """Launch a server with FLAGS (after --), benchmark it over concurrency levels, stop it.

    Example: pivot launch-bench --engine sim-http -o time_scale=20 --concurrency 1,64 -- --tp-size 8.
    A server that crashes under load gives failed levels and the classified reason, and exits 1.
    """
    from pathlib import Path

    spec = _spec(
        concurrency=m.parse_levels(levels), endpoint=endpoint, random_input_len=input_len,
        random_output_len=output_len, random_range_ratio=range_ratio, num_prompts=num_prompts, seed=seed,
        ignore_eos=False if disable_ignore_eos else None,
    )  # fmt: skip
    session, deployment, default_timeout = _launch(
        ctx, engine_name=engine_name, option_pairs=option_pairs, session_ref=session_ref, plan_ref=plan_ref,
        host=host, port=port, force=force, flags=flags,
    )  # fmt: skip
    try:
        _wait_ready(deployment, timeout_s or default_timeout)
        with _ProgressView(err) as view:
            target = Path(output_file) if output_file else None
            result = deployment.benchmark(spec, on_level=view, output_file=target)
        _report(result, as_json=as_json)
        _report_telemetry(deployment.level_telemetry, telemetry_file)
        if result.interrupted:
            err.print(f"interrupted: {len(result.levels)} of {len(spec.concurrency)} levels finished")
            sys.exit(EXIT_INTERRUPTED)
        if not deployment.alive():
            raise _crash_error(deployment, "the server crashed during the benchmark")
    except KeyboardInterrupt:
        deployment.stop()
        sys.exit(EXIT_INTERRUPTED)
    finally:
        deployment.stop()
        session.close()


def _report_telemetry(levels: list[m.Telemetry], path: str | None) -> None:
    """Each level's mean GPU power and energy on stderr; every reading as one JSON line per level in `path`."""
    for t in levels:
        if t.gpus:
            power = " ".join(f"gpu{g.gpu} {g.power_w_mean or 0:,.0f} W (max {g.power_w_max or 0:,.0f})" for g in t.gpus)
            energy = f", {t.energy_j:,.0f} J" if t.energy_j is not None else ""
            per_j = f", {t.output_tokens_per_j:,.2f} tok/J" if t.output_tokens_per_j else ""
            err.print(f"concurrency {t.max_concurrency} ({t.source}): {power}{energy}{per_j}")
        elif t.error:
            err.print(f"concurrency {t.max_concurrency}: no GPU readings ({t.error})")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            for t in levels:
                f.write(t.model_dump_json() + "\n")


@click.command("servers")
@click.argument("session_ref", metavar="SESSION")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array on stdout.")
@click.pass_context
def servers(ctx, session_ref: str, as_json: bool) -> None:
    """Show a session's servers, first stopping any that a killed pivot left running."""
    home = ctx.obj
    session = Session.open(home.store, home.paths, session_ref)
    try:
        for notice in session.notices:
            warn(notice)
        rows = home.store.servers(session.id)
    finally:
        session.close()
    if as_json:
        print_json([dump(r) for r in rows])
        return
    if not rows:
        out.print(f"session {session.id} has launched no server")
        return
    table = make_table("id", "engine", "pid", "status", "failure", "url", "started", "log")
    for r in rows:
        table.add_row(str(r.id), r.engine, str(r.pid), r.status, r.failure or "", r.base_url,
                      r.started_at.strftime("%Y-%m-%d %H:%M:%S"), r.log_path or "")  # fmt: skip
    out.print(table)
