"""`pivot summary`, `pivot docs`, `pivot analyze` and `pivot import`: reports from the ledger, and results run by hand.

A command that writes a session's documents or findings takes the session's lock while it writes, so it never
rewrites a file a live campaign is writing (a live pivot holds the lock; the command says so and changes
nothing); `pivot docs --no-write` and `pivot show` only read. A file you edited by hand is never overwritten, and
the command says where the new version went.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from agent import models as m
from agent.cli.options import Number
from agent.console import dump, err, make_table, out, print_json, warn
from agent.errors import PivotError, SessionNotFound
from tools.reports import (
    SessionRef,
    latest_status_doc,
    list_documents,
    write_improvement_docs,
    write_status_summary,
)


def _home(ctx: click.Context):
    return ctx.find_root().obj


def _analyse(ref: SessionRef, experiment_id: int | None = None, *, quiet: bool = False):
    """Analyse the best (or the given) experiment and check the plan; warn and go on when it cannot be done."""
    from tools import analysis

    try:
        result = analysis.analyze(ref, experiment_id)
        analysis.check_plan(ref)
        return result
    except PivotError as e:
        if not quiet:
            warn(f"analysis skipped: {e.message}" + (f" ({e.hint})" if e.hint else ""))
        return None


@contextmanager
def _locked(home: Any, session_id: str) -> Iterator[SessionRef]:
    """The session, locked for this process while a report is written (SessionLocked when a live pivot holds it)."""
    notice = home.store.acquire_session(session_id)
    try:
        ref = SessionRef(home.store, home.paths, session_id)
        if notice:
            ref.notices.append(notice)
        yield ref
    finally:
        home.store.release_session(session_id)


def _ledger_id(home: Any, session_id: str, number: int | None) -> int | None:
    """The ledger's id of the session's experiment `number` (as reports show it); a clear error when there is none."""
    if number is None:
        return None
    e = home.store.experiment_by_number(session_id, number)
    if e is None:
        count = len(home.store.experiments(session_id))
        raise PivotError(
            f"session {session_id} has no experiment {number}",
            hint=f"its experiments are 1 to {count}" if count else "it has no experiments yet",
        )
    return e.id


def _notices(ref: SessionRef) -> None:
    for notice in ref.notices:
        warn(notice)


@click.command()
@click.argument("session_ref", metavar="SESSION")
@click.option("--html", is_flag=True, help="Also write status-NNN.html with its charts (PNGs under charts/).")
@click.option("--new", "new", is_flag=True, help="Start the next summary number instead of rebuilding the latest.")
@click.option("--question", help="The question to end on (default: the open pivot's, else one from the next steps).")
@click.option("--option", "options", multiple=True, help="An answer to offer; repeat for several.")
@click.option("--json", "as_json", is_flag=True, help="Print path, HTML path, notices and text as JSON on stdout.")
@click.option("--fit", is_flag=True, help="Fit the twin's target parameters to the measurements (seconds).")
@click.pass_context
def summary(
    ctx: click.Context,
    session_ref: str,
    html: bool,
    new: bool,
    question: str | None,
    options: tuple[str, ...],
    as_json: bool,
    fit: bool,
) -> None:
    """Rebuild the latest status summary of SESSION from the ledger and print its path and text.

    The best experiment is analysed first (the findings go to the ledger), the plan's claims are checked,
    and the improvement documents are rebuilt too.
    """
    home = _home(ctx)
    record = home.store.get_session(session_ref)
    with _locked(home, record.id) as ref:
        if question is not None and not new:
            _refuse_rewording(ref)
        _analyse(ref)
        write_improvement_docs(ref)
        from tools.lessons import learnt_lines

        doc = write_status_summary(
            ref, question, list(options) or None, new=new, html=html, learnt=learnt_lines(ref, fit=fit)
        )
    path = home.paths.home / doc.path
    html_path = path.with_suffix(".html") if html else None
    if html_path is not None and not html_path.exists():  # the .md went beside an edited file
        html_path = None
    text = path.read_text(encoding="utf-8")
    if as_json:
        print_json(
            {"path": str(path), "html": str(html_path) if html_path else None, "notices": ref.notices, "text": text}
        )
        return
    _notices(ref)
    err.print(f"status summary: {path}" + (f"\nHTML: {html_path}" if html_path else ""))
    click.echo(text, nl=False)


def _refuse_rewording(ref: SessionRef) -> None:
    """A summary that went with an open pivot keeps its question: answering its options from the file must do what
    the ledger's pivot says."""
    pivot = ref.store.open_pivot(ref.id)
    latest = latest_status_doc(ref.store.documents(ref.id))
    if pivot is not None and latest is not None and pivot.summary_path == latest.path:
        raise PivotError(
            f"{latest.path} goes with the open pivot, whose question it keeps",
            hint=f"answer it with `pivot resume {ref.id} --answer ...`, or give --new to write another summary with "
            "your question",
        )


@click.command()
@click.argument("session_ref", metavar="SESSION")
@click.option("--no-write", is_flag=True, help="Only list; do not rebuild the improvement documents first.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array on stdout.")
@click.pass_context
def docs(ctx: click.Context, session_ref: str, no_write: bool, as_json: bool) -> None:
    """List SESSION's documents with their status, after rebuilding the improvement documents from the ledger.

    Files whose content would not change are left untouched; a file edited by hand keeps your edits and
    pivot's new version is written beside it.
    """
    home = _home(ctx)
    record = home.store.get_session(session_ref)
    ref = SessionRef(home.store, home.paths, record.id)
    if not no_write:
        with _locked(home, record.id) as ref:
            write_improvement_docs(ref)
    documents = list_documents(ref)
    if as_json:
        print_json([dump(d) for d in documents])
        return
    _notices(ref)
    if not documents:
        out.print(f"No documents for session {record.id} yet.")
        return
    numbers = {e.id: e.number for e in home.store.experiments(record.id)}  # what reports call them
    table = make_table("document", "kind", "status", "experiments")
    for d in documents:
        table.add_row(d.path, d.kind, d.status, ", ".join(f"#{numbers.get(i, i)}" for i in d.experiment_ids))
    out.print(table)


@click.command()
@click.argument("session_ref", metavar="SESSION")
@click.option(
    "--experiment",
    "experiment_id",
    type=Number(int, min=1, max=2**62),
    help="The experiment to analyse, by its number in the session as reports show it (default: the best).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the analysis as JSON on stdout.")
@click.pass_context
def analyze(ctx: click.Context, session_ref: str, experiment_id: int | None, as_json: bool) -> None:
    """Analyse an experiment of SESSION against the roofline: the dominant bottleneck and its evidence."""
    from tools import analysis

    home = _home(ctx)
    record = home.store.get_session(session_ref)
    with _locked(home, record.id) as ref:
        result = analysis.analyze(ref, _ledger_id(home, record.id, experiment_id))
        claims = analysis.check_plan(ref)
    if as_json:
        print_json({"analysis": dump(result), "plan_checks": [dump(c) for c in claims]})
        return
    title = m.BOTTLENECK_TITLES.get(result.bottleneck or "", "none")
    out.print(f"[bold]experiment #{home.store.get_experiment(result.experiment_id).number}[/]: {title}", markup=True)
    if result.bottleneck is None:
        out.print(f"  {result.summary}")
        for f in result.findings:
            if f.kind in ("note", "level"):
                out.print(f"  - {f.text}")
    for f in result.evidence:
        out.print(f"  - {f.text}")
    if result.secondary:
        out.print("also:")
        for f in result.secondary:
            out.print(f"  - {f.text}")
    flagged = [c for c in claims if c.severity != "info"]
    if flagged:
        out.print("plan checks:")
        for c in flagged:
            out.print(f"  - {c.severity}: {c.text}")


@click.command("import")
@click.argument("session_ref", metavar="SESSION")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--label", required=True, help="A name for this experiment, e.g. 'tp8 mrr2048'.")
@click.option("--flags", help='The server\'s flags as launched, e.g. "--tp-size 8 --max-running-requests 2048".')
@click.option(
    "--base",
    "base_id",
    type=Number(int, min=1, max=2**62),
    help="The experiment this run changed (its number in the session), for before/after comparisons.",
)
@click.option(
    "--plan",
    "plan_ref",
    help="Create SESSION with this plan (file or shipped name) when no session of that id or name exists.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was imported as JSON on stdout.")
@click.pass_context
def import_cmd(
    ctx: click.Context,
    session_ref: str,
    file: str,
    label: str,
    flags: str | None,
    base_id: int | None,
    plan_ref: str | None,
    as_json: bool,
) -> None:
    """Import sglang.bench_serving results (FILE: its --output-file, one JSON object per run) into SESSION.

    The runs become one experiment, so results benchmarked without pivot get the same tables, analysis and
    summaries. Malformed lines are reported with their line numbers and skipped; nothing already in the
    session is changed. A session that does not exist yet is created when --plan is given (SESSION is then
    its name); the first experiment of a session becomes its baseline.
    """
    from agent.imports import import_bench_serving
    from agent.plans import load_plan
    from agent.session import Session

    home = _home(ctx)
    store = home.store
    created = False
    try:
        record = store.get_session(session_ref)
    except SessionNotFound:
        if plan_ref is None:
            raise PivotError(
                f"no session {session_ref!r}",
                hint=f"add --plan NAME to create it (`pivot plan list` shows the shipped plans), e.g. "
                f"pivot import {session_ref} {file} --label {label!r} --plan glm5-nvfp4-rtxpro6000x8",
            ) from None
        from tools.preflight import check_runnable

        plan = load_plan(plan_ref)
        check_runnable(plan)  # a target with an error is refused before a session exists
        with Session.create(store, home.paths, plan, name=session_ref, engine_name=plan.target.engine) as s:
            record = s.record
        created = True
    with Session.open(store, home.paths, record.id) as session:
        for notice in session.notices:
            warn(notice)
        result = import_bench_serving(
            store,
            home.paths,
            session.id,
            file,
            label=label,
            flags=flags,
            base_experiment_id=_ledger_id(home, session.id, base_id),
        )
    if as_json:
        print_json({**dump(result), "created_session": created})
        return
    for p in result.skipped:
        warn(f"{file}:{p.line}: skipped: {p.message}")
    for p in result.replaced:
        warn(f"{file}:{p.line}: replaced: {p.message}")
    if created:
        out.print(f"created session {record.id} ({session_ref}) with plan {record.plan.name}")
    what = " (the session's baseline)" if result.baseline else ""
    out.print(
        f"imported {len(result.levels)} runs (concurrency {', '.join(map(str, result.levels))}) as experiment "
        f"#{store.get_experiment(result.experiment_id).number} {label!r}{what} into session {result.session_id}; "
        f"{len(result.skipped)} line{'s' if len(result.skipped) != 1 else ''} skipped. "
        f"Next: pivot summary {result.session_id}"
    )
