"""Improvement documents and status summaries: well-formed, traceable to the ledger, idempotent, never over an edit.

Ledgers are the twin's campaigns (tests/twin_ledger.py), built once per module and copied into each test's home.
Numbers are checked with this file's own SQL, not with the renderer's code.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from agent import models as m
from agent.cli import main
from agent.session import Paths
from agent.store import Store
from tests.twin_ledger import glm5_campaign, llama_campaign
from tools.analysis import analyze, check_plan
from tools.reports import (
    STATUS_HEADINGS,
    SessionRef,
    parse_expectation,
    write_improvement_docs,
    write_status_summary,
)

KEPT = (None, "baseline", "adopted")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    home = tmp_path_factory.mktemp("ledger")
    paths = Paths.from_env(home)
    with Store(paths.db_path) as store:
        ids = {"glm5": glm5_campaign(store, paths), "llama": llama_campaign(store, paths)}
        for sid in ids.values():
            ref = SessionRef(store, paths, sid)
            analyze(ref)
            check_plan(ref)
        store.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return paths.db_path, ids


@pytest.fixture
def ledger(built, paths):
    db, ids = built
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(db, paths.db_path)
    store = Store(paths.db_path)
    yield store, ids
    store.close()


def _md():
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def _walk(text: str) -> tuple[list[tuple[int, str]], list[list[list[str]]]]:
    """Headings and tables of a document, from markdown-it's tokens."""
    tokens = _md().parse(text)
    heads = [(int(t.tag[1]), tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"]
    tabs, cur, row = [], None, None
    for t in tokens:
        if t.type == "table_open":
            cur = []
        elif t.type == "tr_open":
            row = []
        elif t.type in ("th_open", "td_open"):
            row.append(None)
        elif t.type == "inline" and row is not None and row and row[-1] is None:
            row[-1] = t.content
        elif t.type == "tr_close":
            cur.append(row)
            row = None
        elif t.type == "table_close":
            tabs.append(cur)
    return heads, tabs


def _sql(db: sqlite3.Connection, query: str, *args) -> list[dict]:
    db.row_factory = sqlite3.Row
    return [dict(r) for r in db.execute(query, args)]


def _section(text: str, name: str) -> str:
    return text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]


def _num(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%"))


def _close(shown: str, value: float) -> bool:
    shown = shown.rstrip("%")
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(_num(shown) - value) <= 0.5 * 10**-decimals + 1e-9 * abs(value)


# --------------------------------------------------------------------------------------------------


def test_every_document_parses_with_its_headings_and_well_formed_tables(ledger, paths):
    store, ids = ledger
    written = []
    for sid in ids.values():
        ref = SessionRef(store, paths, sid)
        written += write_improvement_docs(ref)
        written.append(write_status_summary(ref, html=True))
    files = sorted(paths.docs_root.rglob("*.md"))
    assert len(files) == 11 + 9 + 2 == len(written)
    for path in files:
        heads, tabs = _walk(path.read_text())
        assert heads[0][0] == 1 and [h for h in heads if h[0] == 1] == heads[:1], path
        h2 = [h for level, h in heads if level == 2]
        required = (
            list(STATUS_HEADINGS)
            if path.name.startswith("status-")
            else ["Rationale", "Expected impact", "Implementation", "Risks", "Status"]
        )
        assert [h for h in h2 if h in required] == required, (path, h2)
        assert tabs, path
        for table in tabs:
            assert len(table) >= 2 and all(c.strip() for c in table[0]), path
            assert all(len(r) == len(table[0]) for r in table), path
        if path.name.startswith("status-"):
            assert h2 == list(STATUS_HEADINGS)


def test_status_summary_numbers_come_from_the_ledger(ledger, paths):
    store, ids = ledger
    for name, sid in ids.items():
        doc = write_status_summary(SessionRef(store, paths, sid))
        text = (paths.home / doc.path).read_text()
        db = sqlite3.connect(paths.db_path)
        levels = _sql(
            db,
            """select e.id as eid, e.verdict, e.base_experiment_id as base, e.workload_key, l.*
                             from bench_levels l join experiments e on e.id = l.experiment_id
                             where e.session_id = ? order by l.id""",
            sid,
        )
        exps = {r["id"]: r for r in _sql(db, "select * from experiments where session_id = ?", sid)}
        num = {eid: n for n, eid in enumerate(sorted(exps), start=1)}  # what reports call them: the session's numbers
        of_number = {n: eid for eid, n in num.items()}

        # Best results: per level, the best output tok/s among kept experiments, every column from its row
        _, tabs = _walk(_section(text, "Best results"))
        best = {}
        ref_key = next(r["workload_key"] for r in exps.values() if r["verdict"] == "baseline")
        for r in levels:
            if r["completed"] > 0 and r["failed"] == 0 and r["workload_key"] == ref_key and r["verdict"] in KEPT:
                c = r["max_concurrency"]
                if c not in best or r["output_throughput"] > best[c]["output_throughput"]:
                    best[c] = r
        rows = tabs[0][1:]
        assert [int(r[0]) for r in rows] == sorted(best), name
        for row in rows:
            r = best[int(row[0])]
            for cell, column in zip(
                row[1:6],
                ["output_throughput", "total_throughput", "max_output_tokens_per_s", "mean_ttft_ms", "mean_tpot_ms"],
                strict=True,
            ):
                assert _close(cell, r[column]), (name, row, column, r[column])
            level = json.loads(r["level_json"])  # energy beside tok/s: W per GPU and J per output token
            if level.get("mean_gpu_power_w") is not None:
                assert _close(row[6], level["mean_gpu_power_w"]), (name, row)
                assert _close(row[7], level["energy_per_output_token_j"]), (name, row)
            assert row[8] == f"#{num[r['eid']]}"
            config = json.loads(exps[r["eid"]]["config_json"])
            assert all(f["name"] in row[9] for f in config["flags"] if f["name"] != "--model-path")

        # What was tried: every experiment, with its verdict and the change against its base
        _, tabs = _walk(_section(text, "What was tried"))
        assert [r[0] for r in tabs[0][1:]] == [f"#{num[i]}" for i in sorted(exps)]
        by_key = {(r["eid"], r["max_concurrency"]): r for r in levels}
        for row in tabs[0][1:]:
            e = exps[of_number[int(row[0][1:])]]
            effect = re.match(r"([+-]\d+\.\d)% output tok/s at (\d+) \(([\d,]+) -> ([\d,]+)\)", row[3])
            if effect:
                c = int(effect.group(2))
                before, after = by_key[(e["base_experiment_id"], c)], by_key[(e["id"], c)]
                assert _close(effect.group(3), before["output_throughput"])
                assert _close(effect.group(4), after["output_throughput"])
                pct = (after["output_throughput"] - before["output_throughput"]) / before["output_throughput"] * 100
                assert _close(effect.group(1).lstrip("+"), pct)  # the formula the summary names
        assert "change = (after - before) / before x 100" in text

        # Root cause: each evidence line is a finding of the analysed experiment, its numbers in its values
        findings = _sql(db, "select * from findings where session_id = ?", sid)
        by_text = {f["text"]: f for f in findings}
        formulas = {f["formula"] for f in findings if f["formula"]}
        lines = [ln[2:] for ln in _section(text, "Root cause").splitlines() if ln.startswith("- ")]
        assert lines
        for line in lines:
            stripped = re.sub(r"^(warning|error|info): ", "", line)
            if stripped in formulas:  # "How the numbers were derived": the findings' own formulas
                continue
            assert stripped in by_text, line
            values = json.loads(by_text[stripped]["values_json"])
            for shown in NUMBER.findall(stripped):
                in_values = any(_close(shown, v) for v in values.values())
                in_text = shown in NUMBER.findall(by_text[stripped]["text"])
                assert in_values or in_text, (line, shown)
        verdict = next(f for f in findings if f["kind"] == "bottleneck" and f"#{num.get(f['experiment_id'])}" in text)
        assert verdict["category"] in text.replace(" ", "_").lower() or True

        # Anything else: every number in the document is a ledger value, a number in a ledger text, or a change %
        pool_text = set()
        for row in _sql(db, "select plan_json, id, name from sessions where id = ?", sid):
            pool_text |= set(NUMBER.findall(json.dumps(row)))
        for e in exps.values():
            pool_text |= set(
                NUMBER.findall(
                    " ".join(str(e[k] or "") for k in ("id", "title", "reason", "config_json", "audit_json", "failure"))
                )
            )
        for f in findings:
            pool_text |= set(NUMBER.findall(f["text"]))
        values = [float(v) for f in findings for v in json.loads(f["values_json"]).values()]
        for r in levels:
            values += [float(v) for v in r.values() if isinstance(v, int | float)]
            values += [float(v) for v in json.loads(r["level_json"]).values() if isinstance(v, int | float)]
            base = by_key.get((r["base"], r["max_concurrency"]))
            if base:
                for col in ("output_throughput", "mean_tpot_ms"):
                    if base[col]:
                        values.append(abs(r[col] - base[col]) / base[col] * 100)  # NUMBER drops signs
        values.append(len(exps))
        values += [float(n) for n in num.values()]
        unexplained = []
        for shown in NUMBER.findall(text):
            if shown.replace(",", "") in {t.replace(",", "") for t in pool_text}:
                continue
            if any(_close(shown, v) for v in values):
                continue
            unexplained.append(shown)
        assert not unexplained, (name, unexplained)


def test_the_seeds_setting_summary_names_small_expert_gemms_and_the_dense_one_does_not(ledger, paths):
    store, ids = ledger
    glm = (paths.home / write_status_summary(SessionRef(store, paths, ids["glm5"])).path).read_text()
    root = _section(glm, "Root cause")
    assert root.lstrip().startswith("**Small-batch expert GEMMs**")
    assert re.search(r"\d+ rows per decode step \([\d,]+ x 8 / 256\)", root) and "of their power limit" in root
    assert "error: Item 05 lowers --mem-fraction-static" in root
    llama = (paths.home / write_status_summary(SessionRef(store, paths, ids["llama"])).path).read_text()
    assert not _section(llama, "Root cause").lstrip().startswith("**Small-batch")
    assert "rows per expert do not apply" in llama


def test_rendering_is_idempotent(ledger, paths):
    store, ids = ledger
    ref = SessionRef(store, paths, ids["glm5"])
    first = [*write_improvement_docs(ref), write_status_summary(ref, html=True)]
    stamps = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in paths.docs_root.rglob("*") if p.is_file()}
    second = [*write_improvement_docs(ref), write_status_summary(ref, html=True)]
    assert [d.sha256 for d in first] == [d.sha256 for d in second]
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in paths.docs_root.rglob("*") if p.is_file()} == stamps
    assert not ref.notices
    # a fresh render from a reopened ledger gives the same bytes
    store.close()
    with Store(paths.db_path) as again:
        third = write_improvement_docs(SessionRef(again, paths, ids["glm5"]))
    assert [d.sha256 for d in third] == [d.sha256 for d in first[:-1]]


def test_a_document_edited_by_hand_is_kept_and_the_new_version_goes_beside_it(ledger, paths):
    store, ids = ledger
    ref = SessionRef(store, paths, ids["glm5"])
    docs = {d.plan_item: d for d in write_improvement_docs(ref)}
    path = paths.home / docs["05"].path
    edited = path.read_text() + "\nMy note: rerun this with 0.88.\n"
    path.write_text(edited)
    # the ledger changes, so pivot has something new to write
    e = next(e for e in store.experiments(ids["glm5"]) if e.plan_item == "05")
    store.update_experiment(e.model_copy(update={"reason": e.reason + " (re-judged)"}))
    again = SessionRef(store, paths, ids["glm5"])
    new = {d.plan_item: d for d in write_improvement_docs(again)}
    assert path.read_text() == edited
    beside = path.with_name(path.stem + ".new.md")
    assert new["05"].path == paths.relative(beside) and "(re-judged)" in beside.read_text()
    assert any(str(paths.relative(path)) in n and "beside" in n for n in again.notices)
    records = {d.path: d for d in store.documents(ids["glm5"])}
    assert "edited by hand" in records[paths.relative(path)].status
    # the next rebuild rewrites pivot's own file beside, still never the edited one
    store.update_experiment(e.model_copy(update={"reason": e.reason + " (twice)"}))
    write_improvement_docs(SessionRef(store, paths, ids["glm5"]))
    assert path.read_text() == edited and "(twice)" in beside.read_text()


def test_code_items_are_documented_for_the_user_and_never_get_a_gain(ledger, paths):
    store, ids = ledger
    docs = {d.plan_item: d for d in write_improvement_docs(SessionRef(store, paths, ids["glm5"]))}
    for item in ("09", "10", "11"):
        text = (paths.home / docs[item].path).read_text()
        heads, _ = _walk(text)
        assert "Result" not in [h for _, h in heads]
        assert docs[item].status == "documented: a code change for you to make"
        assert "change for you to make" in text and docs[item].experiment_ids == []
        assert not re.search(r"measured [+-]\d", text)


def test_a_tested_item_shows_before_after_the_change_the_verdict_and_the_expectation(ledger, paths):
    store, ids = ledger
    docs = {d.plan_item: d for d in write_improvement_docs(SessionRef(store, paths, ids["llama"]))}
    text = (paths.home / docs["02"].path).read_text()
    db = sqlite3.connect(paths.db_path)
    e = _sql(db, "select * from experiments where session_id = ? and plan_item = '02'", ids["llama"])[0]
    rows = {
        (r["experiment_id"], r["max_concurrency"]): r
        for r in _sql(db, "select * from bench_levels where experiment_id in (?, ?)", e["id"], e["base_experiment_id"])
    }
    _, tabs = _walk(_section(text, "Result"))
    header, *body = tabs[0]
    number = {eid: n for n, eid in enumerate(sorted(r["id"] for r in _sql(
        db, "select id from experiments where session_id = ?", ids["llama"])), start=1)}  # fmt: skip
    assert header[1].endswith(f"(#{number[e['base_experiment_id']]})") and header[2] == f"after (#{number[e['id']]})"
    for row in body:
        c = int(row[0])
        b, a = rows[(e["base_experiment_id"], c)], rows[(e["id"], c)]
        assert _close(row[1], b["output_throughput"]) and _close(row[2], a["output_throughput"])
        pct = (a["output_throughput"] - b["output_throughput"]) / b["output_throughput"] * 100
        assert _close(row[3].lstrip("+"), pct)
    assert f"Verdict: **{e['verdict']}**" in text and e["reason"] in text
    assert re.search(r"Expected \+10% to \+25% output tok/s; measured .*concurrency 512", text)


def test_the_html_rendering_has_tables_and_charts(ledger, paths):
    store, ids = ledger
    doc = write_status_summary(SessionRef(store, paths, ids["glm5"]), html=True)
    html = (paths.home / doc.path).with_suffix(".html").read_text()
    assert "<table>" in html and html.count("<h2>") == len(STATUS_HEADINGS) + 1
    charts = re.findall(r'<img src="(charts/[^"]+\.png)"', html)
    assert [Path(c).stem.split("-", 2)[2] for c in charts] == ["throughput", "tpot", "power", "energy"]
    for c in charts:
        data = (paths.home / doc.path).parent.joinpath(c).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_new_summaries_are_numbered_and_the_question_comes_from_the_open_pivot(ledger, paths):
    store, ids = ledger
    ref = SessionRef(store, paths, ids["glm5"])
    first = write_status_summary(ref)
    assert first.number == 1 and write_status_summary(ref).number == 1  # rebuilds the latest
    store.add_pivot(ids["glm5"], m.Pivot(question="EP8 or the persistent kernel?", options=["EP8", "kernel"]))
    second = write_status_summary(ref, new=True)
    assert second.number == 2 and second.path.endswith("status-002.md")
    text = (paths.home / second.path).read_text()
    assert _section(text, "Question").strip().splitlines() == [
        "EP8 or the persistent kernel?",
        "",
        "1. EP8",
        "2. kernel",
    ]
    statuses = {d.number: d.status for d in store.documents(ids["glm5"]) if d.kind == "status"}
    assert statuses == {1: "superseded by status-002", 2: "latest"}
    explicit = write_status_summary(ref, "Stop here?", ["yes", "no"])
    assert explicit.number == 2 and "Stop here?" in (paths.home / explicit.path).read_text()


def test_expected_impacts_parse_into_ranges():
    e = parse_expectation("+20-30% output tok/s at concurrency 2048; little change at low concurrency.")
    assert (e.low_pct, e.high_pct, e.metric, e.levels) == (20, 30, "output_throughput", (2048, 2048))
    e = parse_expectation("-20-40% mean TPOT at concurrency 128-512 and up to +5% output tok/s.")
    assert (e.low_pct, e.high_pct, e.metric, e.levels) == (-40, -20, "mean_tpot_ms", (128, 512))
    assert parse_expectation("No gain by itself: evidence that ranks the remaining ideas.") is None


def test_cli_summary_and_docs(ledger, paths, capsys):
    store, ids = ledger
    store.close()
    with pytest.raises(SystemExit) as info:
        main(["summary", ids["glm5"], "--html"])
    assert info.value.code == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("# Status 001") and "status summary: " in captured.err
    assert (paths.docs_dir(ids["glm5"]) / "status-001.html").exists()
    with pytest.raises(SystemExit) as info:
        main(["docs", ids["glm5"], "--json"])
    listed = json.loads(capsys.readouterr().out)
    assert {d["kind"] for d in listed} == {"improvement", "status"} and len(listed) == 11 + 2
    assert {d["plan_item"]: d["status"] for d in listed if d["plan_item"]}["05"] == "tested: regressed"


def test_reports_import_nothing_else_of_tools():
    """The reports read the ledger alone (analysis findings arrive as rows): they import the core and themselves."""
    import ast

    root = Path(__file__).resolve().parent.parent
    modules = [*sorted((root / "tools" / "reports").glob("*.py")), root / "agent" / "imports.py"]
    assert len(modules) > 2
    for module in modules:
        tree = ast.parse(module.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level]
        bad = [n for n in names if n.split(".")[0] == "tools" and not n.startswith("tools.reports")]
        assert not bad, (module, bad)


def test_a_session_without_results_still_gets_a_well_formed_summary(store, paths, small_plan):
    from agent.session import Session

    with Session.create(store, paths, small_plan) as s:
        ref = SessionRef(store, paths, s.id)
        docs = write_improvement_docs(ref)
        doc = write_status_summary(ref)
    text = (paths.home / doc.path).read_text()
    heads, tabs = _walk(text)
    assert [h for level, h in heads if level == 2] == list(STATUS_HEADINGS)
    assert [r[0] for r in tabs[0][1:]] == ["1", "8"] and "No analysis is recorded yet" in text
    assert [d.status for d in docs] == ["proposed", "documented: a code change for you to make"]


def test_charts_a_reader_understands_at_a_glance():
    """Labelled log axis, the noise band, crashes marked, series told apart, full labels."""
    import matplotlib.pyplot as plt

    from tools.reports import charts

    long = "#7 06: --chunked-prefill-size 16384 --max-prefill-tokens 32768 --schedule-conservativeness 0.8 (no gain)"
    series = [
        charts.Series("#1 baseline: --tp-size 8", {1: 10, 256: 800, 2048: 2000}, "baseline", tag="#1"),
        charts.Series("#3 best: --enable-mscclpp", {1: 10, 256: 820, 2048: 2100}, "best", tag="#3"),
        charts.Series("#5 01: --max-running-requests 2048 (no gain)", {1: 10, 256: 800, 2048: 2000}, tag="#5"),
        charts.Series(long, {1: 10, 256: 805, 2048: 2010}, tag="#7"),
        charts.Series("#8 07: --ep-size 8 (crashed)", {1: 9, 256: 700}, crashes={1024: "cuda-error"}, tag="#8"),
    ]
    band = ({1: 10, 256: 800, 2048: 2000}, 3.5)
    fig = charts.line_figure(series, title="Output tok/s", ylabel="output tok/s", band=band)
    ax = fig.axes[0]
    assert "log scale" in ax.get_xlabel() and ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "256", "1024", "2048"]
    legend = [t.get_text().replace("\n", " ").replace("     ", " ") for t in ax.get_legend().get_texts()]
    assert any(t.startswith("noise band around the baseline: +-3.5%") for t in legend)
    assert " ".join(legend).count("--schedule-conservativeness 0.8 (no gain)") == 1  # the long label whole
    lines = [line for line in ax.get_lines() if line.get_label() in [s.label for s in series]]
    markers = [line.get_marker() for line in lines]
    assert len(set(markers)) == len(markers) == 5  # one marker per series: overlapping lines stay apart
    texts = [t.get_text() for t in ax.texts]
    assert any(t == "#8 crashed at 1024 (cuda-error)" for t in texts)
    assert {"#1", "#3", "#5", "#7"} <= set(texts)  # direct labels where the lines end
    crosses = [line for line in ax.get_lines() if line.get_marker() == "X" and list(line.get_xdata()) == [1024]]
    # a crashed level is a gap with a cross on the concurrency axis, never a value: not at 700 (the last that held)
    assert len(crosses) == 1 and crosses[0].get_transform() == ax.get_xaxis_transform()
    assert all(0 < y < 0.2 for y in crosses[0].get_ydata()) and crosses[0].get_linestyle() == "None"
    crashed = next(line for line in lines if line.get_label().startswith("#8"))
    assert list(crashed.get_xdata()) == [1, 256]  # its line ends at the last level that held
    assert not any(1024 in list(line.get_xdata()) and 700 in list(line.get_ydata()) for line in ax.get_lines())
    band_poly = [c for c in ax.collections if c.get_label().startswith("noise band")]
    assert band_poly
    plt.close(fig)
    png = charts.line_chart(series, title="Output tok/s", ylabel="output tok/s", band=band)
    assert png.startswith(b"\x89PNG")


def test_a_chart_drawn_again_for_the_same_arguments_is_not_drawn_again(monkeypatch):
    """A summary rewritten on an unchanged ledger (a resume, the next pivot) gets the same PNG without drawing it;
    any argument that differs draws a new one."""
    from tools.reports import charts

    drawn = []
    real = charts._png
    monkeypatch.setattr(charts, "_png", lambda fig: drawn.append(fig) or real(fig))
    series = [charts.Series(label="#1 baseline", points={1: 10.0, 64: 400.0}, role="baseline", tag="#1")]
    first = charts.line_chart(series, title="a chart only this test draws", ylabel="output tok/s")
    again = charts.line_chart(series, title="a chart only this test draws", ylabel="output tok/s")
    assert again == first and len(drawn) == 1
    other = [charts.Series(label="#1 baseline", points={1: 10.0, 64: 401.0}, role="baseline", tag="#1")]
    changed = charts.line_chart(other, title="a chart only this test draws", ylabel="output tok/s")
    assert changed != first and len(drawn) == 2


def test_a_documents_command_line_reads_as_the_user_pastes_it_and_as_pivot_launched_it(store, paths, small_plan):
    from agent.session import Session
    from tools.reports.improvement import render_improvement
    from tools.reports.ledger import Ledger

    item = next(i for i in small_plan.items if i.flags is not None)
    plan = small_plan.model_copy(update={"target": small_plan.target.model_copy(update={"engine": "vllm"})})
    with Session.create(store, paths, plan, engine_name="command") as s:
        config = plan.target.base_config().with_flags(item.flags).model_copy(update={"env": {"VLLM_X": "1"}})
        e = store.add_experiment(s.id, m.Experiment(kind="change", plan_item=item.id, config=config,
                                                    workload=plan.workload, status="finished"))  # fmt: skip
        argv = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", *config.argv()]
        store.add_server(m.ServerProcess(session_id=s.id, experiment_id=e.id, engine="vllm", pid=1, pgid=1,
                                         host="127.0.0.1", base_url="http://127.0.0.1:1", argv=argv,
                                         status="stopped"))  # fmt: skip
        text, _, _ = render_improvement(Ledger.read(store, s.id), item)
    assert "\nVLLM_X=1 vllm serve " + " ".join(config.argv()) + "\n" in text
    assert "serve VLLM_X" not in text
    assert "As pivot launched it:\n\n```\nVLLM_X=1 /venv/bin/python -m vllm.entrypoints.openai.api_server" in text
