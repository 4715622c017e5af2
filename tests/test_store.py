"""The ledger: every model round-trips, writes are transactional, and ids and lookups behave."""

from __future__ import annotations

import math
import sqlite3
import threading
from datetime import UTC, datetime

import pytest

from agent import models as m
from agent.errors import PivotError, SessionNotFound
from agent.store import Store
from tests.factories import bench_level

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def _session(plan: m.Plan, sid: str = "abc123", name: str = "run-1") -> m.Session:
    return m.Session(id=sid, name=name, plan=plan, engine="sim", model="autopilot", created_at=T0, updated_at=T0)


def _level(concurrency: int, out_tok_s: float) -> m.BenchLevel:
    return bench_level(
        concurrency,
        out_tok_s,
        random_output_len=256,
        duration=12.5,
        completed=2 * concurrency,
        input_throughput=80.0,
        max_output_tokens_per_s=out_tok_s * 3,
        max_concurrent_requests=concurrency,
        failed=1,
        errors={"HTTP 500": 1},
        mean_in_flight=concurrency * 0.95,
        max_in_flight=concurrency,
        client_cpu_s=0.4,
        warnings=["client held 95% of the requested concurrency"],
        server_info={"version": "0.5.23"},  # a bench_serving key we do not model is kept
    )


def test_session_round_trip_and_lookup(store, small_plan):
    s = store.create_session(_session(small_plan))
    assert store.get_session("abc123") == s
    assert store.get_session("abc") == s  # unique id prefix
    assert store.get_session("run-1") == s  # name
    assert store.get_session("abc123").plan == small_plan
    with pytest.raises(SessionNotFound, match="no session 'zzz'"):
        store.get_session("zzz")
    with pytest.raises(PivotError, match="already exists"):
        store.create_session(_session(small_plan))
    store.create_session(_session(small_plan, sid="abd999", name="run-2"))
    with pytest.raises(SessionNotFound, match="several sessions: abc123, abd999"):
        store.get_session("ab")
    store.set_session_status("abc123", "finished")
    assert store.get_session("abc123").status == "finished"


def test_todos_replace_keeps_order_and_assigns_ids(store, small_plan):
    store.create_session(_session(small_plan))
    todos = [
        m.Todo(content="write docs 01-02", status="in_progress", priority="medium"),
        m.Todo(id="bench", content="baseline", priority="high", plan_item="01"),
        m.Todo(content="later", status="cancelled", priority="low"),
    ]
    stored = store.replace_todos("abc123", todos)
    assert [t.id for t in stored] == ["t1", "bench", "t3"]
    assert store.todos("abc123") == stored
    assert store.replace_todos("abc123", stored[1:2]) == store.todos("abc123") == stored[1:2]


def test_experiment_bench_and_telemetry_round_trip(store, small_plan):
    store.create_session(_session(small_plan))
    base = store.add_experiment(
        "abc123",
        m.Experiment(
            kind="baseline",
            title="baseline",
            config=small_plan.target.base_config(),
            workload=small_plan.workload,
            created_at=T0,
        ),
    )
    item = small_plan.item("01")
    e = store.add_experiment(
        "abc123",
        m.Experiment(
            plan_item="01",
            title=item.title,
            hypothesis=item.hypothesis,
            config=item.apply(base.config),
            base_experiment_id=base.id,
            workload=small_plan.workload,
            created_at=T0,
        ),
    )
    assert (base.id, e.id) == (1, 2) and e.session_id == "abc123"
    audit = [
        m.FlagIssue(flag="--tp-size", status="ok"),
        m.FlagIssue(flag="--enable-piecewise-cuda-graph", status="unknown", message="removed in 0.5.23"),
    ]
    done = e.model_copy(
        update=dict(
            status="finished",
            verdict="no_gain",
            reason="+0.8%, inside 2% noise",
            started_at=T0,
            finished_at=T0,
            log_path="state/abc123/logs/2.log",
            audit=audit,
        )
    )
    store.update_experiment(done)
    assert store.get_experiment(e.id) == done
    assert store.experiments("abc123") == [base, done]

    result = m.BenchResult(
        spec=small_plan.workload,
        levels=[_level(1, 10.5), _level(8, 75.25)],
        engine="sim",
        source="simulated",
        started_at=T0,
        finished_at=T0,
        raw_path="state/x.jsonl",
    )
    run_id = store.add_bench_result(e.id, result)
    back = store.bench_results(e.id)
    assert back == [result]
    assert math.isinf(back[0].levels[0].request_rate)
    assert back[0].levels[0].model_extra == {"server_info": {"version": "0.5.23"}}
    assert back[0].level(8).output_throughput == 75.25

    tel = m.Telemetry(
        source="simulated",
        max_concurrency=8,
        started_at=T0,
        finished_at=T0,
        gpus=[
            m.GpuTelemetry(
                gpu=g,
                name="H200",
                samples=10,
                power_w_mean=235.0 + g,
                power_limit_w=600.0,
                energy_j=1234.5,
                util_gpu_pct_mean=97.0,
            )
            for g in range(2)
        ],
        server_metrics={"sglang:num_running_reqs": 8.0},
        output_tokens=4096,
        output_tokens_per_j=4096 / 2469.0,
    )
    store.add_telemetry(e.id, tel, run_id=run_id)
    store.add_telemetry(e.id, m.Telemetry(source="unavailable", error="NVML Shared Library Not Found"))
    assert store.telemetry(e.id) == [tel, m.Telemetry(source="unavailable", error="NVML Shared Library Not Found")]
    assert tel.gpus[0].power_share_of_limit == pytest.approx(235 / 600)
    # the query columns agree with the JSON
    row = next(
        store.db.query(
            "select output_throughput, max_concurrency from bench_levels where run_id = ? order by id desc limit 1",
            [run_id],
        )
    )
    assert row == {"output_throughput": 75.25, "max_concurrency": 8}


def test_documents_pivots_servers_messages_round_trip(store, small_plan):
    store.create_session(_session(small_plan))
    doc = m.Document(
        session_id="abc123",
        kind="improvement",
        plan_item="01",
        title="Bigger batch",
        path="docs_out/abc123/01-bigger-batch.md",
        status="proposed",
        sha256="0" * 64,
        experiment_ids=[1, 2],
        created_at=T0,
        updated_at=T0,
    )
    saved = store.upsert_document(doc)
    assert store.documents("abc123") == [saved]
    again = store.upsert_document(doc.model_copy(update={"status": "tested", "sha256": "1" * 64}))
    assert again.id == saved.id and [d.status for d in store.documents("abc123")] == ["tested"]

    p = store.add_pivot(
        "abc123",
        m.Pivot(
            question="Which way?",
            options=["Tier 2", "stop"],
            tool_call_id="c1",
            summary_path="docs_out/abc123/status-001.md",
            asked_at=T0,
        ),
    )
    assert store.get_session("abc123").status == "waiting"
    assert store.open_pivot("abc123") == p and store.pivots("abc123") == [p]
    answered = store.answer_pivot(p.id, "1")
    assert answered.answer == "1" and answered.answered_at is not None and not answered.open
    assert store.open_pivot("abc123") is None and store.get_session("abc123").status == "active"
    with pytest.raises(PivotError, match="already answered"):
        store.answer_pivot(p.id, "2")

    srv = store.add_server(
        m.ServerProcess(
            session_id="abc123",
            engine="sglang",
            pid=4242,
            pgid=4242,
            host="h",
            base_url="http://127.0.0.1:30000",
            argv=["sglang", "serve", "--tp", "8"],
            started_at=T0,
        )
    )
    assert store.servers("abc123", running_only=True) == [srv]
    store.update_server(srv.id, status="crashed", failure="oom")
    assert store.servers("abc123", running_only=True) == []
    (back,) = store.servers("abc123")
    assert back.status == "crashed" and back.failure == "oom" and back.stopped_at is not None

    store.append_messages("abc123", ['{"a": 1}', '{"b": 2}'])
    store.append_messages("abc123", ['{"c": 3}'])
    assert store.messages("abc123") == ['{"a": 1}', '{"b": 2}', '{"c": 3}']


def test_summaries_count_experiments_and_show_open_pivot(store, small_plan):
    store.create_session(_session(small_plan))
    store.add_experiment("abc123", m.Experiment(config=m.ServerConfig(), workload=small_plan.workload))
    store.add_pivot("abc123", m.Pivot(question="Go on?", options=["yes", "no"]))
    (row,) = store.session_summaries()
    assert (row.experiments, row.open_pivot, row.status) == (1, "Go on?", "waiting")
    assert row.target == "org/model-7b on 1x h200"


def test_a_failed_multi_row_write_leaves_nothing(store, small_plan):
    store.create_session(_session(small_plan))
    levels = [_level(1, 1.0), _level(2, 2.0)]
    with pytest.raises(sqlite3.IntegrityError):  # no experiment 99: the foreign key refuses the run
        store.add_bench_result(
            99, m.BenchResult(spec=small_plan.workload, levels=levels, engine="sim", source="simulated")
        )
    assert store.db["bench_runs"].count == 0 and store.db["bench_levels"].count == 0


def test_threads_share_one_store(store, small_plan):
    store.create_session(_session(small_plan))
    errors = []

    def work(n: int) -> None:
        try:
            for i in range(20):
                store.add_experiment(
                    "abc123", m.Experiment(title=f"{n}-{i}", config=m.ServerConfig(), workload=small_plan.workload)
                )
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(store.experiments("abc123")) == 80


def test_reopening_keeps_everything(paths, small_plan):
    with Store(paths.db_path) as s:
        s.create_session(_session(small_plan))
    with Store(paths.db_path) as s:
        assert s.get_session("abc123").plan == small_plan
        assert s.applied == []  # nothing left to migrate


def test_a_full_plan_round_trips(store):
    from agent.plans import load_plan

    plan = load_plan("glm5-nvfp4-rtxpro6000x8")
    store.create_session(_session(plan))
    back = store.get_session("abc123").plan
    assert back == plan and back.prior[0].flags.argv() == ["--tp-size", "4", "--pp-size", "2"]
    assert back.tiers == {1: "Flag flips", 2: "Configuration", 3: "Code changes"}


def test_an_unreadable_session_row_is_a_clear_error(store, small_plan):
    store.create_session(_session(small_plan))
    store.db.conn.execute("update sessions set plan_json = '{\"name\": 3}'")
    with pytest.raises(PivotError, match="session abc123 in the ledger cannot be read"):
        store.get_session("abc123")


def test_the_row_mapper_stores_json_and_datetimes_as_text_and_fills_missing_columns_with_defaults():
    from agent.store.rows import RowMap

    rows = RowMap(m.Pivot, json=("options",))
    pivot = m.Pivot(id=4, session_id="abc123", question="which?", options=["a", "b"], asked_at=T0)
    row = rows.to_row(pivot, skip=("id",), extra_column=1)
    assert row["options_json"] == '["a", "b"]' and "options" not in row and "id" not in row
    assert row["asked_at"] == T0.isoformat() and row["answered_at"] is None and row["extra_column"] == 1
    assert rows.from_row({**row, "id": 4}) == pivot
    # a ledger at an older migration lacks columns, and NULLs stand for the defaults: both give the field's default
    old = rows.from_row({"id": 5, "question": "q?", "asked_at": T0.isoformat(), "options_json": None, "answer": None})
    assert old.options == [] and old.answer is None and old.asked_at == T0 and old.tool_call_id is None
    usage = RowMap(m.ModelUsage).from_row({"model": "x", "requests": None, "outcome": None}, id=7)
    assert (usage.id, usage.requests, usage.outcome) == (7, 0, "")
