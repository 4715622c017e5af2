"""The `pivot` command: sessions, plans and plugins from the terminal.

Tables and text go to stdout; with --json, stdout carries JSON alone and everything else
(warnings, progress) goes to stderr, so output can be piped.
"""

from __future__ import annotations

import errno
import sqlite3
import sys
from collections.abc import Callable
from functools import cached_property
from typing import Any

import click
from rich.text import Text

from agent import __version__, plugins
from agent import models as m
from agent.console import dump, err, make_table, out, print_json, warn
from agent.errors import PivotError, redact
from agent.plans import bundled_plans, load_plan
from agent.session import Paths
from agent.store import Store


class Home:
    """The pivot home a command works in, and its ledger, opened on first use."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    @cached_property
    def store(self) -> Store:
        return Store(self.paths.db_path)


class PivotGroup(click.Group):
    """A click group that shows PivotError as a message and a hint, without a traceback, and exits 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PivotError as e:
            _fail(ctx, e)
        except OSError as e:  # a home that cannot be written (read-only, not ours, full): one line and a hint
            if e.errno not in UNWRITABLE_ERRNOS:
                raise
            where = f" {e.filename}" if e.filename else ""
            home = ctx.obj.paths.home if isinstance(ctx.obj, Home) else "its home"
            _fail(ctx, PivotError(
                f"cannot write{where}: {e.strerror or e}",
                hint=f"pivot writes its ledger, logs and documents under its home ({home}): make it writable, or "
                "point --home/PIVOT_HOME at a directory that is",
            ))  # fmt: skip
        except sqlite3.OperationalError as e:
            if "readonly" not in str(e) and "unable to open" not in str(e):
                raise
            home = ctx.obj.paths.home if isinstance(ctx.obj, Home) else "its home"
            _fail(ctx, PivotError(
                f"cannot write the ledger: {e}",
                hint=f"make {home} writable, or point --home/PIVOT_HOME at a directory that is",
            ))  # fmt: skip


UNWRITABLE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def _fail(ctx: click.Context, e: PivotError) -> None:
    err.print(Text.assemble(("error:", "bold red"), " ", redact(e.message)))
    if e.hint:
        err.print(Text.assemble(("hint:", "yellow"), " ", redact(e.hint)))
    ctx.exit(1)


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else ""


@click.group(cls=PivotGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="pivot", message="%(prog)s %(version)s")
@click.option(
    "--home",
    envvar="PIVOT_HOME",
    type=click.Path(file_okay=False),
    help="Where state/ (the ledger, logs) and docs_out/ live. Default: $PIVOT_HOME, else the current directory.",
)
@click.pass_context
def cli(ctx: click.Context, home: str | None) -> None:
    """pivot: an optimization assistant for LLM inference serving."""
    ctx.obj = Home(Paths.from_env(home))


pass_home = click.make_pass_decorator(Home)


# ---------------------------------------------------------------------------------------------- sessions


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array on stdout.")
@pass_home
def sessions(home: Home, as_json: bool) -> None:
    """List sessions: id, name, target, status, experiments, open pivot, last update."""
    rows = home.store.session_summaries()
    if as_json:
        print_json([dump(r) for r in rows])
        return
    if not rows:
        out.print(f"No sessions in {home.paths.home}.")
        return
    table = make_table("id", "name", "target", "engine", "status", "exps", "open pivot", "updated")
    for r in rows:
        status = r.status + (f" (pid {r.locked_by_pid})" if r.locked_by_pid else "")
        table.add_row(
            r.id, r.name, r.target, r.engine, status, str(r.experiments), _gist(r.open_pivot), _when(r.updated_at)
        )
    out.print(table)


def _gist(text: str | None, limit: int = 48) -> str:
    """The start of a long text on one line, cut at a word ('pivot show' and --json give it whole)."""
    text = " ".join((text or "").split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "…"


@cli.command()
@click.argument("session_ref", metavar="SESSION")
@click.option(
    "--force", is_flag=True, hidden=True, help="Refused like the plain command while the lock's process runs here."
)
@pass_home
def unlock(home: Home, session_ref: str, force: bool) -> None:
    """Clear a session's lock left by a process that is gone (or by a host that no longer exists).

    A lock whose process still runs on this host is never cleared (not with --force either): stop that process.
    """
    session = home.store.get_session(session_ref)
    pid = home.store.break_session_lock(session.id)
    out.print(f"session {session.id}: " + (f"lock of pid {pid} cleared" if pid else "was not locked"))


@cli.command()
@click.argument("session_ref", metavar="SESSION")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@pass_home
def show(home: Home, session_ref: str, as_json: bool) -> None:
    """Show a session: its todos, experiments with verdicts, and pivots."""
    store = home.store
    session = store.get_session(session_ref)
    todos = store.todos(session.id)
    experiments = store.experiments(session.id)
    pivots = store.pivots(session.id)
    documents = store.documents(session.id)
    by_id = {e.id: e for e in experiments}
    base_config = session.target.base_config()

    def change(e: m.Experiment) -> str:
        base = by_id[e.base_experiment_id].config if e.base_experiment_id in by_id else base_config
        return str(e.config.diff(base))

    from agent.reports import Ledger

    ledger = Ledger.read(store, session.id)

    def figure(e: m.Experiment) -> dict[str, float | int] | None:
        found = ledger.figure(e)
        if found is None:
            return None
        return {"output_tok_s": found[0], "max_concurrency": found[1], "runs": found[2]}

    if as_json:
        print_json(
            {
                "session": dump(session),
                "locked_by_pid": store.session_lock(session.id),
                "todos": [dump(t) for t in todos],
                "experiments": [
                    {
                        **dump(e),
                        "change": change(e),
                        "figure": figure(e),
                        "results": [dump(r) for r in store.bench_results(e.id or 0)],
                        "telemetry": [dump(t) for t in store.telemetry(e.id or 0)],
                    }
                    for e in experiments
                ],
                "pivots": [dump(p) for p in pivots],
                "plan_changes": [dump(c) for c in store.plan_changes(session.id)],
                "documents": [dump(d) for d in documents],
                "usage": [dump(u) for u in store.usage(session.id)],
            }
        )
        return

    t = session.target
    out.print(f"[bold]{session.name}[/] ({session.id}) - {session.status}", markup=True)
    out.print(f"plan {session.plan.name}: {session.plan.title}")
    out.print(f"target {t.model} on {t.gpus}x {t.hardware}, engine {session.engine}, model {session.model}")
    out.print(f"created {_when(session.created_at)}, updated {_when(session.updated_at)}")
    if pid := store.session_lock(session.id):
        out.print(f"in use by pid {pid}")
    if usage := store.usage(session.id):
        from agent.reports import usage_text

        out.print(usage_text(usage), highlight=False)

    out.print("\n[bold]Todos[/]", markup=True)
    if todos:
        table = make_table("", "todo", "priority", "item")
        marks = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]", "cancelled": "[-]"}
        for todo in todos:
            table.add_row(marks[todo.status], todo.content, todo.priority, todo.plan_item or "")
        out.print(table)
    else:
        out.print("  (none)")

    out.print("\n[bold]Experiments[/]", markup=True)
    if experiments:
        table = make_table("id", "item", "kind", "change", "status", "out tok/s (mean of runs)", "verdict", "reason")
        for e in experiments:
            best_text = ledger.figure_text(e)
            reason = e.reason or ""
            if e.predicted_change_pct is not None and e.verdict != "predicted":
                reason = f"{reason} [predicted {e.predicted_change_pct:+.1f}% before launch]".strip()
            table.add_row(
                str(e.id), "+".join(e.plan_items), e.kind, change(e), e.status, best_text, e.verdict or "", reason
            )
        out.print(table)
    else:
        out.print("  (none)")

    changes = store.plan_changes(session.id)
    if changes:
        out.print("\n[bold]Plan changes[/]", markup=True)
        for c in changes:
            out.print(f"  {_when(c.at)} from {c.source or '(no file)'}:", highlight=False)
            for line in c.changes:
                out.print(f"     {line}", highlight=False)

    out.print("\n[bold]Pivots[/]", markup=True)
    if pivots:
        for p in pivots:
            out.print(f"  #{p.id} {p.question}")
            for i, option in enumerate(p.options, start=1):
                out.print(f"     {i}. {option}")
            out.print(f"     answer: {p.answer}" if p.answer is not None else "     (waiting for an answer)")
    else:
        out.print("  (none)")

    if documents:
        out.print("\n[bold]Documents[/]", markup=True)
        for d in documents:
            out.print(f"  {d.path}  {d.status}")


# ---------------------------------------------------------------------------------------------- tools


@cli.command("tools")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def tools_cmd(as_json: bool) -> None:
    """List the tool plugins with their tools, and the engines."""
    failures: list[plugins.PluginFailure] = []
    toolsets = plugins.load_all(plugins.TOOLS_GROUP, on_failure=failures.append)
    engines = plugins.load_all(plugins.ENGINES_GROUP, on_failure=failures.append)
    for failure in failures:
        warn(str(failure))
    tool_rows = [
        {
            "plugin": name,
            "distribution": toolsets.infos[name].dist,
            "entry_point": toolsets.infos[name].value,
            "tools": [{"name": n, "description": d} for n, d in plugins.describe_tools(ts)],
        }
        for name, ts in toolsets.plugins.items()
    ]
    engine_rows = [
        {
            "engine": name,
            "distribution": engines.infos[name].dist,
            "entry_point": engines.infos[name].value,
            "description": plugins.describe(factory),
        }
        for name, factory in engines.plugins.items()
    ]
    if as_json:
        print_json({"tools": tool_rows, "engines": engine_rows, "failed": [str(f) for f in failures]})
        return
    out.print("[bold]Tool plugins[/]", markup=True)
    if not tool_rows:
        out.print("  (none)")
    for row in tool_rows:
        out.print(f"  {row['plugin']}  [dim]({row['distribution'] or 'no distribution'})[/]", markup=True)
        for tool in row["tools"]:
            out.print(f"    {tool['name']:<24} {tool['description']}")
    out.print("\n[bold]Engines[/]", markup=True)
    if not engine_rows:
        out.print("  (none installed)")
    for row in engine_rows:
        out.print(f"  {row['engine']:<12} {row['description']}  [dim]({row['distribution']})[/]", markup=True)


# ---------------------------------------------------------------------------------------------- plans


@cli.group()
def plan() -> None:
    """Check and list optimization plans."""


@plan.command("check")
@click.argument("plan_ref", metavar="FILE")
@click.option("--json", "as_json", is_flag=True, help="Print the validated plan as JSON on stdout.")
def plan_check(plan_ref: str, as_json: bool) -> None:
    """Validate a plan file (or a shipped plan by name), check everything knowable before a launch, summarize it.

    Checked: the model and hardware profiles exist; the base flags and every item's flags pass SGLang's audit
    (unknown, removed, ambiguous or invalid: error; no-op or deprecated: warning); the plan checks (physics and
    direction of each item's claims). Exit 1 when there is an error.
    """
    from tools.preflight import preflight

    p = load_plan(plan_ref)
    problems = preflight(p)
    errors = [x for x in problems if x.severity == "error"]
    warnings = [x for x in problems if x.severity == "warning"]
    if as_json:
        print_json({**dump(p), "problems": [x.model_dump() for x in problems]})
        if errors:
            raise SystemExit(1)
        return
    t = p.target
    if errors:
        out.print(f"[red]{len(errors)} error{'s' if len(errors) != 1 else ''}[/] {p.source}", markup=True)
    else:
        out.print(f"[green]ok[/] {p.source}", markup=True)
    out.print(f"[bold]{p.name}[/]: {p.title}", markup=True)
    out.print(f"target {t.model} on {t.gpus}x {t.hardware}, {t.engine} {t.engine_version or ''}".rstrip())
    out.print(f"base flags: {t.flags or '(none)'}")
    w = p.workload
    out.print(
        f"workload: {w.dataset_name} in {w.random_input_len} / out {w.random_output_len} "
        f"(range ratio {w.random_range_ratio}), concurrency {', '.join(map(str, w.concurrency))}, "
        f"endpoint {w.endpoint}"
    )
    table = make_table("id", "tier", "kind", "title", "change")
    for item in p.items:
        if item.kind == "code":
            what = "(code change)"
        elif item.kind == "workload":
            what = ", ".join(f"{k}={v}" for k, v in (item.workload or {}).items())
        elif item.kind == "profile":
            what = "(measurement)"
        else:
            what = " ".join([str(item.flags or ""), *(f"(drop {f})" for f in item.remove_flags)]).strip()
        tier = f"{item.tier} {p.tiers.get(item.tier, '')}".strip()
        table.add_row(item.id, tier, item.kind, item.title, what)
    out.print(table)
    if p.prior:
        out.print(f"prior results: {len(p.prior)} (" + "; ".join(f"{r.title}: {r.verdict}" for r in p.prior) + ")")
    checks = make_table("severity", "where", "check", "finding")
    for x in problems:
        checks.add_row(x.severity, x.where, x.check, x.message)
    if problems:
        out.print(checks)
    out.print(
        f"{len(errors)} error{'s' if len(errors) != 1 else ''}, {len(warnings)} warning{'s' if len(warnings) != 1 else ''}"
        + (": fix the errors before a launch spends GPU time on them" if errors else "")
    )
    if errors:
        raise SystemExit(1)


@plan.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array on stdout.")
def plan_list(as_json: bool) -> None:
    """List the plans that ship with pivot."""
    rows = []
    for name, path in bundled_plans().items():
        try:
            p = load_plan(path)
            rows.append({"name": name, "title": p.title, "items": len(p.items), "path": str(path), "error": None})
        except PivotError as e:
            rows.append({"name": name, "title": "", "items": 0, "path": str(path), "error": e.message})
    if as_json:
        print_json(rows)
        return
    table = make_table("name", "items", "title")
    for row in rows:
        table.add_row(row["name"], str(row["items"]), row["title"] or f"[red]{row['error']}[/]")
    out.print(table)


from agent.cli_sim import sim  # noqa: E402  (commands of their own modules)

cli.add_command(sim)

from agent.cli_bench import bench  # noqa: E402

cli.add_command(bench)

from agent.cli_engines import launch_bench, serve, servers  # noqa: E402

for command in (serve, launch_bench, servers):
    cli.add_command(command)

from agent.cli_engine_tools import audit_flags_cmd, power, profile  # noqa: E402

cli.add_command(audit_flags_cmd)
cli.add_command(power)
cli.add_command(profile)

from agent.cli_reports import analyze, docs, import_cmd, summary  # noqa: E402

for command in (summary, docs, analyze, import_cmd):
    cli.add_command(command)

from agent.cli_microbench import microbench  # noqa: E402

cli.add_command(microbench)


from agent.cli_agent import demo, resume, run_cmd  # noqa: E402

for command in (demo, run_cmd, resume):
    cli.add_command(command)

from agent.cli_chat import chat  # noqa: E402

cli.add_command(chat)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    runner: Callable[..., Any] = cli
    runner(args=argv if argv is not None else sys.argv[1:], prog_name="pivot")


if __name__ == "__main__":
    main()
