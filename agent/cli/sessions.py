"""`pivot sessions`, `show` and `unlock`: the sessions of the ledger."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from agent import models as m
from agent.cli.base import Home, _when, cli, pass_home
from agent.console import dump, line_table, make_table, out, print_json
from agent.errors import PivotError
from agent.store import Store


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
@click.option(
    "--fit",
    is_flag=True,
    help="With --json: fit the twin's target parameters to the measurements (seconds of simulation).",
)
@click.option("-v", "--verbose", is_flag=True, help="Whole reasons and pivots, wrapped (default: one line each).")
@click.option("--csv", "as_csv", is_flag=True, help="Print the experiments as CSV on stdout (one row each).")
@click.option(
    "--experiment",
    "experiment_no",
    type=click.IntRange(min=1),
    help="Show experiment N of the session whole: its flags, runs, verdict and reason.",
)
@pass_home
def show(home: Home, session_ref: str, as_json: bool, fit: bool, verbose: bool, as_csv: bool,
         experiment_no: int | None) -> None:  # fmt: skip
    """Show a session: its todos, experiments with verdicts, and pivots, one line each (cut with an ellipsis; -v
    for the whole text, --experiment N for one experiment).

    \b
    Examples:
      pivot show abc123
      pivot show abc123 --experiment 7
      pivot show abc123 --json | jq .experiments
      pivot show abc123 --csv > experiments.csv
    """
    from tools.reports import Ledger

    store = home.store
    session = store.get_session(session_ref)
    experiments = store.experiments(session.id)
    change = _change_of(session, experiments)
    ledger = Ledger.read(store, session.id)
    if as_json:
        print_json(_show_json(store, session, experiments, change, ledger, fit))
        return
    if as_csv:
        _print_csv(store, experiments, change, ledger)
        return
    if experiment_no is not None:
        _print_experiment(session, experiments, experiment_no, change, ledger)
        return
    _print_head(store, session)
    _print_todos(store.todos(session.id), verbose)
    _print_experiments(experiments, change, ledger, verbose)
    _print_plan_changes(store.plan_changes(session.id))
    _print_pivots(store.pivots(session.id), verbose)
    _print_documents(store.documents(session.id))
    if not verbose:
        out.print(f"\n(one line each: `pivot show {session.id} -v` for the whole text)", highlight=False)


def _change_of(session: m.Session, experiments: list[m.Experiment]) -> Callable[[m.Experiment], str]:
    """An experiment's change from its base experiment (else from the target's base flags), as text."""
    by_id = {e.id: e for e in experiments}
    base_config = session.target.base_config()

    def change(e: m.Experiment) -> str:
        base = by_id[e.base_experiment_id].config if e.base_experiment_id in by_id else base_config
        if e.kind != "imported":
            return str(e.config.diff(base))
        # the label given at import, so the user finds the run they named; then its flags (against its base if any)
        flags = str(e.config.diff(base)) if e.base_experiment_id in by_id else " ".join(e.config.argv())
        return f"imported {e.title!r}: {flags or '(flags not given)'}" if e.title else f"imported: {flags}"

    return change


def _show_json(
    store: Store,
    session: m.Session,
    experiments: list[m.Experiment],
    change: Callable[[m.Experiment], str],
    ledger: Any,
    fit: bool = False,
) -> dict[str, Any]:
    """`pivot show --json`: the session and everything recorded under it."""

    def figure(e: m.Experiment) -> dict[str, float | int] | None:
        found = ledger.figure(e)
        if found is None:
            return None
        return {"output_tok_s": found[0], "max_concurrency": found[1], "runs": found[2]}

    return {
        "session": dump(session),
        "locked_by_pid": store.session_lock(session.id),
        "todos": [dump(t) for t in store.todos(session.id)],
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
        "pivots": [dump(p) for p in store.pivots(session.id)],
        "plan_changes": [dump(c) for c in store.plan_changes(session.id)],
        "documents": [dump(d) for d in store.documents(session.id)],
        "usage": [dump(u) for u in store.usage(session.id)],
        "twin_lessons": _lessons_json(store, session, fit),
    }


def _lessons_json(store: Store, session: m.Session, fit: bool) -> dict[str, Any] | None:
    """What the campaign concluded about the twin (tools/lessons.py), with its fitted target parameters when `fit`
    or the session ranks by the fitted twin (`--fit-twin`; tools/fit.py); None without a twin or a measurement."""
    from tools.lessons import fitted, lessons
    from tools.method.reading import Method

    try:
        method = Method.read(store, session.id)
        found = lessons(method)
        target = fitted(method) if (fit or method.settings.fit_twin) and found is not None else None
    except PivotError as e:
        return {"error": e.message}
    if found is None:
        return None
    return {**found.as_json(), "fit": target.as_json() if target is not None else None}


def _print_head(store: Store, session: m.Session) -> None:
    t = session.target
    out.print(f"[bold]{session.name}[/] ({session.id}) - {session.status}", markup=True)
    width = max(out.width, 40)
    out.print(_gist(f"plan {session.plan.name}: {session.plan.title}", width), highlight=False)
    out.print(_gist(f"target {t.model} on {session.hardware_text}, engine {session.engine}, model {session.model}",
                    width), highlight=False)  # fmt: skip
    out.print(f"created {_when(session.created_at)}, updated {_when(session.updated_at)}")
    if pid := store.session_lock(session.id):
        out.print(f"in use by pid {pid}")
    if usage := store.usage(session.id):
        from tools.reports import usage_text

        out.print(usage_text(usage), highlight=False)


def _print_todos(todos: list[m.Todo], verbose: bool = True) -> None:
    out.print("\n[bold]Todos[/]", markup=True)
    if todos:
        table = make_table("", "todo", "priority", "item") if verbose else line_table("", "todo", "item", wide="todo")
        marks = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]", "cancelled": "[-]"}
        for todo in todos:
            if verbose:
                table.add_row(marks[todo.status], todo.content, todo.priority, todo.plan_item or "")
            else:
                table.add_row(marks[todo.status], todo.content, todo.plan_item or "")
        out.print(table)
    else:
        out.print("  (none)")


def _print_experiments(experiments: list[m.Experiment], change: Callable[[m.Experiment], str], ledger: Any,
                       verbose: bool = True) -> None:  # fmt: skip
    out.print("\n[bold]Experiments[/] " + experiment_counts(experiments, ledger.runs), markup=True, highlight=False)
    if experiments and not verbose:
        table = line_table("#", "item", "change", "value @level", "verdict", "reason", wide="reason")
        for e in experiments:
            flags = change(e) if e.kind != "baseline" else "(baseline)"
            table.add_row(str(e.number), "+".join(e.plan_items), _gist(flags, 22), ledger.figure_text(e),
                          e.verdict or e.status, e.reason or "")  # fmt: skip
        out.print(table)
    elif experiments:
        table = make_table(
            "#", "item", "kind", "change", "status", "out tok/s @judged level (mean of runs)", "verdict", "reason"
        )
        for e in experiments:
            best_text = ledger.figure_text(e)
            reason = e.reason or ""
            if e.predicted_change_pct is not None and e.verdict != "predicted":
                reason = f"{reason} [predicted {e.predicted_change_pct:+.1f}% before launch]".strip()
            status = e.status
            if (p := e.placement) is not None and p.executor != "local":  # where a cluster ran it
                status += f" on {p.host}" + (f" GPUs {','.join(p.gpu_ids)}" if p.gpu_ids else "")
                status += f" (attempt {p.attempt})" if p.attempt > 1 else ""
            table.add_row(
                str(e.number), "+".join(e.plan_items), e.kind, change(e), status, best_text, e.verdict or "", reason
            )
        out.print(table)
    else:
        out.print("  (none)")


CSV_COLUMNS = ("number", "items", "kind", "change", "status", "failure", "runs", "concurrency", "value", "unit",
               "verdict", "predicted_change_pct", "reason")  # fmt: skip


def _print_csv(store: Store, experiments: list[m.Experiment], change: Callable[[m.Experiment], str],
               ledger: Any) -> None:  # fmt: skip
    """The experiments as CSV (the objective's value at the judged level, the mean of its runs)."""
    import csv
    import sys

    from tools.method.objective import objective_for

    objective = objective_for(ledger.plan)
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for e in experiments:
        values: dict[int, list[float]] = {}
        for result in store.bench_results(e.id or 0):
            for c, v in objective.value_of_run(result).items():
                values.setdefault(c, []).append(v)
        top = max(values) if values else None
        value = round(sum(values[top]) / len(values[top]), 4) if top is not None else None
        writer.writerow([e.number, "+".join(e.plan_items), e.kind, change(e), e.status, e.failure or "",
                         ledger.runs.get(e.id or 0, 0), top or "", "" if value is None else value,
                         objective.unit, e.verdict or "", "" if e.predicted_change_pct is None else
                         e.predicted_change_pct, e.reason or ""])  # fmt: skip


def experiment_counts(experiments: list[m.Experiment], runs: dict[int, int]) -> str:
    """How many experiments ran and how many did not, apart: '(4 measured, 1 crashed, 3 predicted, 1 refused)'."""
    counts: dict[str, int] = {}
    for e in experiments:
        if runs.get(e.id or 0):
            what = "measured"
        elif e.verdict == "predicted":
            what = "predicted, not launched"
        elif e.verdict == "crashed" or (e.status == "failed" and e.verdict != "ruled_out"):
            what = "crashed or did not start"
        elif e.verdict == "ruled_out" or e.failure:
            what = "refused"
        elif e.verdict == "not_measured":
            what = "not measured"
        else:
            what = e.status  # planned, running, interrupted
        counts[what] = counts.get(what, 0) + 1
    return "(" + ", ".join(f"{n} {what}" for what, n in counts.items()) + ")" if counts else ""


def _print_experiment(session: m.Session, experiments: list[m.Experiment], number: int,
                      change: Callable[[m.Experiment], str], ledger: Any) -> None:  # fmt: skip
    """One experiment whole: what it changed, how it ran, its numbers and its verdict's reason."""
    e = next((x for x in experiments if x.number == number), None)
    if e is None:
        raise PivotError(f"session {session.id} has no experiment {number}",
                         hint=f"it has {len(experiments)}: `pivot show {session.id}` lists them")  # fmt: skip
    rows = [
        ("experiment", f"{e.number} ({e.kind}{', item ' + '+'.join(e.plan_items) if e.plan_items else ''})"),
        ("change", change(e) or "(none)"),
        ("flags", str(e.config)),
        ("status", e.status + (f" ({e.failure})" if e.failure else "")),
        ("runs", str(ledger.runs.get(e.id or 0, 0))),
        ("value", ledger.figure_text(e) or "-"),
        ("verdict", e.verdict or "-"),
        ("reason", e.reason or "-"),
    ]
    if e.failure_detail:
        rows.append(("failure", e.failure_detail))
    if e.predicted_change_pct is not None:
        rows.append(("predicted", f"{e.predicted_change_pct:+.1f}% before launch"))
    for key, value in rows:
        out.print(f"{key:>10}  {value}", highlight=False)


def _print_plan_changes(changes: list[m.PlanChange]) -> None:
    if changes:
        out.print("\n[bold]Plan changes[/]", markup=True)
        for c in changes:
            out.print(f"  {_when(c.at)} from {c.source or '(no file)'}:", highlight=False)
            for line in c.changes:
                out.print(f"     {line}", highlight=False)


def _print_pivots(pivots: list[m.Pivot], verbose: bool = True) -> None:
    out.print("\n[bold]Pivots[/]", markup=True)
    width = max(out.width - 8, 30)
    if pivots:
        for number, p in enumerate(pivots, 1):
            whole = verbose or p.answer is None  # the open pivot's question is read whole: it is asked now
            out.print(f"  #{number} " + (p.question if whole else _gist(p.question, width)), highlight=False)
            for i, option in enumerate(p.options, start=1):
                out.print(f"     {i}. " + (option if verbose else _gist(option, width - 3)), highlight=False)
            out.print(f"     answer: {p.answer}" if p.answer is not None else "     (waiting for an answer)")
    else:
        out.print("  (none)")


def _print_documents(documents: list[m.Document]) -> None:
    if documents:
        out.print("\n[bold]Documents[/]", markup=True)
        for d in documents:
            out.print(_gist(f"  {d.path}  {d.status}", max(out.width, 40)), highlight=False)
