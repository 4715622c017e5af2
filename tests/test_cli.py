"""The `pivot` command as a user meets it: versions, sessions, show, tools; JSON alone on stdout; errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from agent import __version__
from agent import models as m
from agent.cli import cli
from agent.store import Store


def run(*args: str, **kw):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, **kw)


def _populate(store: Store, plan: m.Plan) -> str:
    store.create_session(m.Session(id="demo01", name="demo", plan=plan, engine="sim"))
    store.replace_todos(
        "demo01",
        [
            m.Todo(content="baseline", status="completed", priority="high"),
            m.Todo(content="try 01", status="in_progress", plan_item="01"),
        ],
    )
    base = store.add_experiment(
        "demo01",
        m.Experiment(
            kind="baseline",
            config=plan.target.base_config(),
            workload=plan.workload,
            status="finished",
            verdict="baseline",
        ),
    )
    item = plan.item("01")
    e = store.add_experiment(
        "demo01",
        m.Experiment(
            plan_item="01",
            config=item.apply(base.config),
            base_experiment_id=base.id,
            workload=plan.workload,
            status="finished",
            verdict="no_gain",
            reason="+0.4% at 8, inside the 2% noise",
        ),
    )
    store.add_pivot("demo01", m.Pivot(question="Tier 1 done. Go on to Tier 2?", options=["Tier 2", "stop"]))
    return f"{base.id},{e.id}"


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"pivot {__version__}"


def test_sessions_on_an_empty_home_creates_the_ledger(pivot_home):
    result = run("sessions")
    assert result.exit_code == 0 and "No sessions" in result.stdout
    assert (pivot_home / "state" / "pivot.db").is_file()
    result = run("sessions", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout) == []


def test_home_option_beats_the_environment(tmp_path, pivot_home):
    other = tmp_path / "other"
    assert run("--home", str(other), "sessions").exit_code == 0
    assert (other / "state" / "pivot.db").is_file()
    assert not (pivot_home / "state").exists()


def test_sessions_and_show(store, small_plan, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal, so table cells are not folded
    _populate(store, small_plan)
    result = run("sessions", "--json")
    assert result.exit_code == 0
    (row,) = json.loads(result.stdout)
    assert row["id"] == "demo01" and row["experiments"] == 2 and row["status"] == "waiting"
    assert row["open_pivot"] == "Tier 1 done. Go on to Tier 2?" and row["target"] == "org/model-7b on 1x h200"
    text = run("sessions").stdout
    assert "demo01" in text and "Tier 1 done" in text
    long = "07 Expert parallelism EP8 crashed (experiment 8: requests failed at concurrency 1024). How go on?"
    store.answer_pivot(store.open_pivot("demo01").id, "Tier 2")
    store.add_pivot("demo01", m.Pivot(question=long, options=["continue", "stop"]))
    assert "07 Expert parallelism EP8 crashed (experiment…" in run("sessions").stdout  # the list gives its start
    assert json.loads(run("sessions", "--json").stdout)[0]["open_pivot"] == long

    shown = run("show", "demo", "--json")
    assert shown.exit_code == 0
    data = json.loads(shown.stdout)
    assert [t["content"] for t in data["todos"]] == ["baseline", "try 01"]
    assert [(e["verdict"], e["change"]) for e in data["experiments"]] == [
        ("baseline", "(no change)"),
        ("no_gain", "--max-running-requests 64"),
    ]
    assert data["pivots"][0]["options"] == ["Tier 2", "stop"] and data["locked_by_pid"] is None

    monkeypatch.setenv("COLUMNS", "80")
    short = run("show", "demo01").stdout  # one line per todo and experiment, cut to the width
    lines = [" ".join(line.split()) for line in short.splitlines()]
    assert "[x] baseline" in lines and "[>] try 01 01" in lines
    assert all(len(line) <= 80 for line in short.splitlines() if not line.startswith("  #")), short
    monkeypatch.setenv("COLUMNS", "200")
    assert "Experiments (" in short and "-v` for the whole text" in short, short
    text = run("show", "demo01", "-v").stdout
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "[x] baseline high" in lines and "[>] try 01 medium 01" in lines
    for expected in (
        "no_gain",
        "inside the 2% noise",
        "1. Tier 2",
        "(waiting for an answer)",
        "--max-running-requests 64",
    ):
        assert expected in text, expected


def test_show_unknown_session_is_a_clear_error():
    result = run("show", "nope")
    assert result.exit_code == 1
    assert "error: no session 'nope'" in result.stderr and "hint: `pivot sessions` lists them" in result.stderr
    assert result.stdout == ""


def test_tools_lists_builtin_plugins():
    result = run("tools", "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    todo = next(row for row in data["tools"] if row["plugin"] == "todo")
    assert [t["name"] for t in todo["tools"]] == ["todo_read", "todo_write", "plan_read"]


def test_console_script_runs_without_traceback_on_errors(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "show", "x"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "no session 'x'" in proc.stderr


def test_tables_keep_numbers_whole_on_a_narrow_terminal():
    from rich.console import Console

    from agent.console import make_table

    def show(table, width: int) -> str:
        console = Console(width=width, record=True)
        console.print(table)
        return console.export_text()

    # pivot sim predict's table on an 80-column terminal
    head = (
        "conc",
        "ok/fail",
        "out tok/s",
        "total tok/s",
        "peak out",
        "TTFT ms",
        "TPOT ms",
        "ITL ms",
        "W/GPU",
        "KV use",
    )
    row = ("2048", "2048/0", "1,339", "2,684", "4,036", "30,336", "1,329.7", "796.4", "173", "0.41")
    table = make_table(*head)
    table.add_row(*row)
    text = show(table, 80)
    assert all(value in text for value in (*row, "ok/fail", "TPOT ms"))
    # a long word still folds rather than being cut
    table = make_table("id", "reason")
    table.add_row("0042", "x" * 60)
    text = show(table, 40)
    assert "0042" in text and text.count("x") == 60


def test_show_the_summary_and_the_tui_give_the_same_figure(store, paths, small_plan, monkeypatch):
    """One figure per view: the mean of the runs at the best level, with the count (not the best single run)."""
    from agent.tui.view import board
    from tests.factories import bench_level
    from tools import reports

    monkeypatch.setenv("COLUMNS", "200")
    ids = _populate(store, small_plan)
    base_id = int(ids.split(",")[0])
    for out in (2082.0, 2010.0):  # two runs of the baseline: mean 2,046
        store.add_bench_result(
            base_id,
            m.BenchResult(
                spec=small_plan.workload,
                levels=[bench_level(1, 100.0), bench_level(8, out)],
                engine="sglang",
                source="measured",
            ),
        )
    shown = json.loads(run("show", "demo01", "--json").stdout)
    assert shown["experiments"][0]["figure"] == {"output_tok_s": 2046.0, "max_concurrency": 8, "runs": 2}
    text = " ".join(run("show", "demo01").stdout.split())
    assert "2,046 @8 (2 runs)" in text and "2,082" not in text
    row = board(store, "demo01").experiments[0]
    assert row.best == "2,046 @8 (2 runs)"
    ledger = reports.Ledger.read(store, "demo01")
    summary = reports.render_status(ledger, 1, "q?", ["a"]).markdown
    assert "2,046" in summary and "2,082" not in summary
