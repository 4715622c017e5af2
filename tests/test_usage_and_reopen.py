"""The model's use kept per run in the ledger (shown by `pivot show` and the final summary), and a finished session
reopened by an answer that names an item: that item is tested, then the campaign finishes again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import loop
from agent.session import Session
from tests.procs import pivot_here
from tests.test_method_guard import DOCS, _new

ROOT = Path(__file__).resolve().parent.parent


def test_a_price_where_genai_prices_knows_the_model():
    cost = loop.usage_cost("anthropic:claude-sonnet-4-5", None, 100_000, 10_000)
    assert cost is not None and cost == pytest.approx(0.3 + 0.15)  # $3 / $15 per million tokens
    assert loop.usage_cost("openai-chat:gpt-4.1", None, 100_000, 0) == pytest.approx(0.2)
    assert loop.usage_cost("autopilot", None, 1000, 10) is None
    assert loop.usage_cost("openai-chat:gpt-4.1", "http://127.0.0.1:30000/v1", 1000, 10) is None  # self-hosted
    assert loop.usage_cost("anthropic:no-such-model-xyz", None, 1000, 10) is None


def test_usage_is_kept_per_run_and_shown(tmp_path):
    ledger = _new(tmp_path)
    ledger.run(DOCS[:2])
    question = "The campaign is finished: nothing else to test. Anything else?"
    ledger.run([{"tool": "write_status_summary", "args": {"question": question, "options": []}}])
    rows = ledger.store.usage(ledger.sid)
    assert len(rows) == 2 and all(r.requests >= 2 and r.input_tokens > 0 and r.output_tokens > 0 for r in rows)
    assert rows[0].requests == 3 and rows[0].outcome == "waiting"  # two tool calls and the end of the script
    assert all(r.model.startswith("script:") and r.cost_usd is None for r in rows)
    env = {"PIVOT_HOME": str(tmp_path)}
    shown = pivot_here("show", ledger.sid, env=env)
    total_in = sum(r.input_tokens for r in rows)
    assert f"{sum(r.requests for r in rows)} requests, {total_in:,} input" in shown.stdout, shown.stdout
    as_json = pivot_here("show", ledger.sid, "--json", env=env)
    assert [u["input_tokens"] for u in json.loads(as_json.stdout)["usage"]] == [r.input_tokens for r in rows]
    # the final summary (no options) says what the model's use was up to the step that wrote it
    summary = max(
        (d for d in ledger.store.documents(ledger.sid) if d.kind == "status" and d.path.endswith(".md")),
        key=lambda d: d.number or 0,
    )
    text = (tmp_path / summary.path).read_text()
    assert "Model use (script:" in text and "no price known for this model" in text


def test_an_item_asked_for_after_the_end_reopens_the_campaign(tmp_path):
    ledger = _new(tmp_path)
    ledger.store.set_session_model(ledger.sid, "autopilot")
    with Session.open(ledger.store, ledger.paths, ledger.sid) as s:
        first = loop.run(s)
    assert first.status == "pivot"
    with Session.open(ledger.store, ledger.paths, ledger.sid) as s:
        done = loop.run(s, answer="stop")
    assert done.status == "finished"
    before = ledger.store.experiments(ledger.sid)
    with Session.open(ledger.store, ledger.paths, ledger.sid) as s:
        again = loop.run(s, answer="01")
    assert again.status == "finished", again.message
    new = ledger.store.experiments(ledger.sid)[len(before) :]
    assert new and {tuple(e.plan_items) for e in new} == {("01",)}  # that item, and nothing else
    assert all(e.verdict is not None for e in new)
    assert ledger.store.get_session(ledger.sid).status == "finished"
    # the CLI takes the same road: a finished session with --answer runs; what ran already on this configuration
    # is not launched as a new experiment: it gets one more run
    runs = len(ledger.store.bench_results(new[-1].id))
    cli = pivot_here("resume", ledger.sid, "--answer", "01", env={"PIVOT_HOME": str(tmp_path)})
    assert cli.returncode == 0 and "finished" in cli.stdout, cli.stdout + cli.stderr
    assert ledger.store.experiments(ledger.sid)[len(before) + len(new) :] == []
    assert len(ledger.store.bench_results(new[-1].id)) == runs + 1
