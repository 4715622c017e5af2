"""Named migrations: applied on every open, once each, on a blank ledger and on one left at an older migration."""

from __future__ import annotations

import pytest
from sqlite_utils import Database

from agent import models as m
from agent.errors import LedgerError
from agent.store import MIGRATIONS, Store

TABLES = {
    "_migrations",
    "model_usage",
    "sessions",
    "messages",
    "todos",
    "experiments",
    "bench_runs",
    "bench_levels",
    "telemetry",
    "telemetry_gpus",
    "documents",
    "pivots",
    "servers",
    "findings",
    "microbench_results",
    "plan_changes",
    "investigations",
}


def test_blank_ledger_gets_every_migration(paths):
    assert not paths.db_path.exists()
    with Store(paths.db_path) as s:
        assert s.applied == [name for name, _ in MIGRATIONS]
        assert s.migrations() == [name for name, _ in MIGRATIONS]
        assert set(s.db.table_names()) == TABLES
        assert s.db.journal_mode == "wal"
    with Store(paths.db_path) as s:
        assert s.applied == []


def test_ledger_at_an_older_migration_is_upgraded_and_keeps_its_data(paths, small_plan):
    with Store(paths.db_path, migrations=MIGRATIONS[:1]) as old:
        assert "servers" not in old.db.table_names()
        old.create_session(m.Session(id="old001", name="before", plan=small_plan, engine="sim"))
        old.add_experiment("old001", m.Experiment(config=m.ServerConfig(), workload=small_plan.workload))
    with Store(paths.db_path) as s:
        assert s.applied == [name for name, _ in MIGRATIONS[1:]]
        assert s.get_session("old001").name == "before"
        assert len(s.experiments("old001")) == 1
        assert "servers" in s.db.table_names()
        s.add_server(
            m.ServerProcess(
                session_id="old001", engine="sim", pid=1, pgid=1, host="h", base_url="http://127.0.0.1:1", argv=["x"]
            )
        )


def test_servers_recorded_before_003_read_back_without_a_start_time(paths, small_plan):
    with Store(paths.db_path, migrations=MIGRATIONS[:2]) as old:
        old.create_session(m.Session(id="old002", name="before", plan=small_plan, engine="sim-http"))
        old.db["servers"].insert(
            {"session_id": "old002", "engine": "sim-http", "pid": 7, "pgid": 7, "host": "127.0.0.1",
             "base_url": "http://127.0.0.1:1", "argv_json": '["x"]', "status": "ready",
             "started_at": m.utcnow().isoformat()}
        )  # fmt: skip
    with Store(paths.db_path) as s:
        assert s.applied == [name for name, _ in MIGRATIONS[2:]]
        (server,) = s.servers("old002")
        assert server.pid == 7 and server.proc_start is None
        added = s.add_server(server.model_copy(update={"id": None, "proc_start": "12345"}))
        assert s.servers("old002")[-1] == added


def test_a_failing_migration_changes_nothing(paths):
    def broken(db: Database) -> None:
        db["half_done"].create({"id": int}, pk="id")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Store(paths.db_path, migrations=[*MIGRATIONS, ("003_broken", broken)])
    with Store(paths.db_path) as s:  # the good migrations of that attempt were rolled back with it
        assert "half_done" not in s.db.table_names()
        assert s.applied == [name for name, _ in MIGRATIONS]


def test_a_ledger_from_a_newer_pivot_is_refused(paths):
    extra = ("099_future", lambda db: db["future"].create({"id": int}, pk="id"))
    Store(paths.db_path, migrations=[*MIGRATIONS, extra]).close()
    with pytest.raises(LedgerError, match=r"newer pivot.*099_future"):
        Store(paths.db_path)


def test_new_migrations_run_in_order_once(paths):
    calls = []
    extra = [
        ("003_a", lambda db: calls.append("a") or db["sessions"].add_column("tag_a", str)),
        ("004_b", lambda db: calls.append("b") or db["sessions"].add_column("tag_b", str)),
    ]
    Store(paths.db_path).close()
    for _ in range(2):
        Store(paths.db_path, migrations=[*MIGRATIONS, *extra]).close()
    assert calls == ["a", "b"]
    with Store(paths.db_path, migrations=[*MIGRATIONS, *extra]) as s:
        assert {"tag_a", "tag_b"} <= set(s.db["sessions"].columns_dict)


# The names shipped in users' ledgers, in order: a rename or reorder of a migration function fails here.
SHIPPED = ["001_initial", "002_server_processes", "003_server_identity", "004_analysis", "005_telemetry_tokens",
           "006_session_settings", "007_combined_items", "008_search", "009_truth", "011_usage", "012_placement",
           "013_investigations", "014_capacity"]  # fmt: skip


def test_the_registered_names_are_the_shipped_ones_in_order():
    names = [name for name, _ in MIGRATIONS]
    assert names[: len(SHIPPED)] == SHIPPED
    assert all(f"_m{name}" == fn.__name__ for name, fn in MIGRATIONS)  # the name is the function's own


def test_a_migration_is_named_by_its_function_and_numbered_after_the_last(monkeypatch):
    from agent.store import migrations

    monkeypatch.setattr(migrations, "MIGRATIONS", list(migrations.MIGRATIONS))

    def _m099_more(db):
        pass

    migrations.migration(_m099_more)
    assert migrations.MIGRATIONS[-1] == ("099_more", _m099_more)

    def _m099_again(db):
        pass

    def add_column(db):
        pass

    with pytest.raises(ValueError, match="comes after 099_more"):
        migrations.migration(_m099_again)
    with pytest.raises(ValueError, match="named _mNNN_what, not add_column"):
        migrations.migration(add_column)
