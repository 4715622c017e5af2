"""`pivot summary` keeps what the ledger says was asked: a finished campaign stays finished through `summary --html`,
a summary that went with a pivot keeps that pivot's question and options, and the command never writes while a live
pivot holds the session (it takes the session's lock)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import loop
from agent.cli import cli
from agent.session import Session
from tests.test_method_guard import _new
from tools.reports import FINISHED_QUESTION

ROOT = Path(__file__).resolve().parent.parent


def _summary(ledger, *args: str):
    return CliRunner(env={"PIVOT_HOME": str(ledger.home)}).invoke(
        cli, ["summary", ledger.sid, *args], catch_exceptions=False
    )


def _latest_markdown(ledger) -> Path:
    docs = [d for d in ledger.store.documents(ledger.sid) if d.kind == "status"]
    return ledger.home / max(docs, key=lambda d: d.number or 0).path


@pytest.fixture(scope="module")
def at_pivot(tmp_path_factory):
    """A session of the guarded plan run by the autopilot to its first pivot."""
    home = tmp_path_factory.mktemp("pivot")
    ledger = _new(home)
    ledger.store.set_session_model(ledger.sid, "autopilot")
    with Session.open(ledger.store, ledger.paths, ledger.sid) as s:
        assert loop.run(s).status == "pivot"
    return ledger


def test_a_finished_session_stays_finished_through_summary_html(at_pivot, tmp_path):
    import shutil

    shutil.copytree(at_pivot.home, tmp_path / "copy")
    ledger = type(at_pivot)(tmp_path / "copy", at_pivot.sid)
    ledger.store.set_session_model(ledger.sid, "autopilot")
    with Session.open(ledger.store, ledger.paths, ledger.sid) as s:
        assert loop.run(s, answer="stop").status == "finished"
    final = _latest_markdown(ledger)
    assert FINISHED_QUESTION in final.read_text()
    result = _summary(ledger, "--html")
    assert result.exit_code == 0, result.output
    text = _latest_markdown(ledger).read_text()
    assert _latest_markdown(ledger) == final
    question = text[text.index("## Question") :]
    assert FINISHED_QUESTION in question and "\n1. " not in question  # before: a new question, option 1 a code item
    assert FINISHED_QUESTION in final.with_suffix(".html").read_text()
    assert ledger.store.get_session(ledger.sid).status == "finished"
    assert ledger.store.open_pivot(ledger.sid) is None


def test_a_summary_that_went_with_a_pivot_keeps_its_question(at_pivot, tmp_path):
    import shutil

    shutil.copytree(at_pivot.home, tmp_path / "copy")
    ledger = type(at_pivot)(tmp_path / "copy", at_pivot.sid)
    pivot = ledger.store.open_pivot(ledger.sid)
    assert pivot is not None
    before = _latest_markdown(ledger).read_text()
    assert _summary(ledger).exit_code == 0
    after = _latest_markdown(ledger).read_text()
    assert pivot.question in after and all(f"{i}. {o}" in after for i, o in enumerate(pivot.options, start=1))
    assert after[after.index("## Question") :] == before[before.index("## Question") :]
    refused = _summary(ledger, "--question", "Something else entirely, then?")
    assert refused.exit_code == 1 and "goes with the open pivot" in refused.stderr
    assert _latest_markdown(ledger).read_text() == after
    again = _summary(ledger, "--new", "--question", "Something else entirely, then?", "--option", "a")
    assert again.exit_code == 0 and "Something else entirely" in _latest_markdown(ledger).read_text()
    assert ledger.store.open_pivot(ledger.sid) == pivot


def test_a_built_question_offers_no_code_item(tmp_path):
    from tools.reports import Ledger, next_steps
    from tools.reports.status import summary_question

    ledger = _new(tmp_path)
    steps = next_steps(Ledger.read(ledger.store, ledger.sid))
    assert any(item.kind == "code" for item, _ in steps)
    _, options = summary_question(Ledger.read(ledger.store, ledger.sid), 1, steps)
    assert options and not any(o.startswith("04 ") for o in options)  # 04 is the plan's code item


HOLDER = textwrap.dedent(
    """
    import sys, time
    from agent.store import Store
    store = Store(sys.argv[1])
    store.acquire_session(sys.argv[2])
    print("locked", flush=True)
    time.sleep(120)
    """
)


def test_summary_never_writes_while_a_live_pivot_holds_the_session(at_pivot, tmp_path):
    import shutil

    shutil.copytree(at_pivot.home, tmp_path / "copy")
    ledger = type(at_pivot)(tmp_path / "copy", at_pivot.sid)
    path = _latest_markdown(ledger)
    path.write_text(path.read_text().replace("## Question", "## Question\n\n(being written by the campaign)"))
    ledger.store.upsert_document(
        next(d for d in ledger.store.documents(ledger.sid) if d.path.endswith(path.name))
    )  # the campaign's own bytes, not yet recorded: the red team's 2.5 s window
    written = path.read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(ledger.paths.db_path), ledger.sid],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        for args in ((), ("--html",), ("--new",)):
            result = _summary(ledger, *args)
            assert result.exit_code == 1 and f"in use by pid {holder.pid}" in result.stderr, result.output
        for command in (["docs", ledger.sid], ["analyze", ledger.sid]):
            result = CliRunner(env={"PIVOT_HOME": str(ledger.home)}).invoke(cli, command, catch_exceptions=False)
            assert result.exit_code == 1 and "in use by pid" in result.stderr
        assert path.read_bytes() == written
    finally:
        holder.kill()
        holder.wait()
    assert _summary(ledger).exit_code == 0  # the holder is gone: its lock is taken over
