"""The ledger: one SQLite file (PIVOT_HOME/state/pivot.db) holding everything pivot learns; the only module with SQL.

It is opened through sqlite-utils in WAL mode with a busy timeout. Named migrations are recorded in
`_migrations` and applied on every open, so the first command on an empty home creates the file.
Every write runs in one `BEGIN IMMEDIATE` transaction (a deferred transaction that reads and then
writes fails at once under contention), and one connection is shared by the threads of a process
behind a lock. A session worked on by a live process is locked by that process's pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlite_utils import Database

from agent import models as m
from agent.errors import LedgerError, PivotError, SessionLocked, SessionNotFound

SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 30.0

Migration = tuple[str, Callable[[Database], None]]
_UNLOCK = "update sessions set lock_pid = null, lock_host = null, lock_proc_start = null, lock_at = null "


# --------------------------------------------------------------------------------------------------
# Migrations: append only. Never edit one that has shipped; add a new one.


def _m001_initial(db: Database) -> None:
    db["sessions"].create(
        {
            "id": str,
            "name": str,
            "plan_name": str,
            "plan_json": str,
            "engine": str,
            "model": str,
            "status": str,
            "created_at": str,
            "updated_at": str,
            "lock_pid": int,
            "lock_host": str,
            "lock_proc_start": str,
            "lock_at": str,
        },
        pk="id",
        not_null={"name", "plan_name", "plan_json", "engine", "model", "status", "created_at", "updated_at"},
    )
    db["messages"].create(
        {"id": int, "session_id": str, "seq": int, "created_at": str, "json": str},
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"session_id", "seq", "json"},
    )
    db["messages"].create_index(["session_id", "seq"], unique=True)
    db["todos"].create(
        {
            "session_id": str,
            "id": str,
            "position": int,
            "content": str,
            "status": str,
            "priority": str,
            "plan_item": str,
            "updated_at": str,
        },
        pk=("session_id", "id"),
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"position", "content", "status", "priority"},
    )
    db["experiments"].create(
        {
            "id": int,
            "session_id": str,
            "plan_item": str,
            "kind": str,
            "title": str,
            "hypothesis": str,
            "config_json": str,
            "base_experiment_id": int,
            "workload_json": str,
            "workload_key": str,
            "status": str,
            "verdict": str,
            "reason": str,
            "audit_json": str,
            "failure": str,
            "log_path": str,
            "created_at": str,
            "started_at": str,
            "finished_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id"), ("base_experiment_id", "experiments", "id")],
        not_null={"session_id", "kind", "config_json", "workload_json", "status", "created_at"},
    )
    db["experiments"].create_index(["session_id"])
    db["bench_runs"].create(
        {
            "id": int,
            "experiment_id": int,
            "spec_json": str,
            "engine": str,
            "source": str,
            "started_at": str,
            "finished_at": str,
            "interrupted": int,
            "raw_path": str,
        },
        pk="id",
        foreign_keys=[("experiment_id", "experiments", "id")],
        not_null={"experiment_id", "spec_json", "engine", "source", "started_at", "interrupted"},
    )
    # The columns a report or a query needs, plus the whole level as JSON for an exact round trip.
    db["bench_levels"].create(
        {
            "id": int,
            "run_id": int,
            "experiment_id": int,
            "max_concurrency": int,
            "completed": int,
            "failed": int,
            "duration": float,
            "request_throughput": float,
            "output_throughput": float,
            "total_throughput": float,
            "max_output_tokens_per_s": float,
            "mean_ttft_ms": float,
            "median_ttft_ms": float,
            "p99_ttft_ms": float,
            "mean_tpot_ms": float,
            "median_tpot_ms": float,
            "p99_tpot_ms": float,
            "mean_itl_ms": float,
            "mean_e2e_latency_ms": float,
            "concurrency": float,
            "level_json": str,
        },
        pk="id",
        foreign_keys=[("run_id", "bench_runs", "id"), ("experiment_id", "experiments", "id")],
        not_null={"run_id", "experiment_id", "level_json"},
    )
    db["telemetry"].create(
        {
            "id": int,
            "experiment_id": int,
            "run_id": int,
            "max_concurrency": int,
            "source": str,
            "started_at": str,
            "finished_at": str,
            "error": str,
            "server_metrics_json": str,
        },
        pk="id",
        foreign_keys=[("experiment_id", "experiments", "id"), ("run_id", "bench_runs", "id")],
        not_null={"experiment_id", "source"},
    )
    db["telemetry_gpus"].create(
        {
            "id": int,
            "telemetry_id": int,
            "gpu": int,
            "power_w_mean": float,
            "power_w_max": float,
            "power_limit_w": float,
            "util_gpu_pct_mean": float,
            "energy_j": float,
            "gpu_json": str,
        },
        pk="id",
        foreign_keys=[("telemetry_id", "telemetry", "id")],
        not_null={"telemetry_id", "gpu", "gpu_json"},
    )
    db["documents"].create(
        {
            "id": int,
            "session_id": str,
            "kind": str,
            "plan_item": str,
            "number": int,
            "title": str,
            "path": str,
            "status": str,
            "sha256": str,
            "experiment_ids_json": str,
            "created_at": str,
            "updated_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"session_id", "kind", "title", "path", "sha256", "created_at", "updated_at"},
    )
    db["documents"].create_index(["session_id", "path"], unique=True)
    db["pivots"].create(
        {
            "id": int,
            "session_id": str,
            "question": str,
            "options_json": str,
            "answer": str,
            "tool_call_id": str,
            "summary_path": str,
            "asked_at": str,
            "answered_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"session_id", "question", "options_json", "asked_at"},
    )


def _m002_server_processes(db: Database) -> None:
    db["servers"].create(
        {
            "id": int,
            "session_id": str,
            "experiment_id": int,
            "engine": str,
            "pid": int,
            "pgid": int,
            "host": str,
            "base_url": str,
            "argv_json": str,
            "log_path": str,
            "status": str,
            "failure": str,
            "started_at": str,
            "stopped_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id"), ("experiment_id", "experiments", "id")],
        not_null={"session_id", "engine", "pid", "pgid", "host", "base_url", "argv_json", "status", "started_at"},
    )
    db["servers"].create_index(["session_id", "status"])


def _m003_server_identity(db: Database) -> None:
    # The kernel's start time of the server's pid, so a pid reused by another process is never signalled.
    db["servers"].add_column("proc_start", str)


def _m004_analysis(db: Database) -> None:
    # What tools/analysis/ finds (one sentence and its numbers per row), and GEMM micro-benchmark results.
    db["findings"].create(
        {
            "id": int,
            "session_id": str,
            "experiment_id": int,
            "kind": str,
            "category": str,
            "plan_item": str,
            "max_concurrency": int,
            "text": str,
            "values_json": str,
            "formula": str,
            "severity": str,
            "created_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id"), ("experiment_id", "experiments", "id")],
        not_null={"session_id", "kind", "text", "values_json", "severity", "created_at"},
    )
    db["findings"].create_index(["session_id", "experiment_id"])
    db["microbench_results"].create(
        {
            "id": int,
            "session_id": str,
            "device": str,
            "dtype": str,
            "m": int,
            "n": int,
            "k": int,
            "groups": int,
            "rows_per_expert": float,
            "tflops": float,
            "share_of_peak": float,
            "share_of_roofline": float,
            "backend": str,
            "source": str,
            "measured_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={
            "device",
            "dtype",
            "m",
            "n",
            "k",
            "groups",
            "tflops",
            "share_of_peak",
            "share_of_roofline",
            "source",
            "measured_at",
        },
    )
    db["microbench_results"].create_index(["device", "dtype"])


def _m005_telemetry_tokens(db: Database) -> None:
    """Output tokens of a level and tokens per joule, so energy efficiency survives a resume."""
    db["telemetry"].add_column("output_tokens", int)
    db["telemetry"].add_column("output_tokens_per_j", float)


def _m006_session_settings(db: Database) -> None:
    """The method's thresholds, the engine's options and the model's server, kept with each session; and the words
    that say why an experiment's server failed, beside its class."""
    db["sessions"].add_column("settings_json", str)
    db["sessions"].add_column("model_base_url", str)
    db["experiments"].add_column("failure_detail", str)


def _m007_combined_items(db: Database) -> None:
    """Every plan item an experiment combines (a combined step of the search names them all)."""
    db["experiments"].add_column("plan_items_json", str)


def _m008_search(db: Database) -> None:
    """The search's prediction recorded next to what was measured: the corrected twin's output tok/s, the predicted
    change and where the prediction comes from."""
    db["experiments"].add_column("predicted_tok_s", float)
    db["experiments"].add_column("predicted_change_pct", float)
    db["experiments"].add_column("prediction", str)


def _m009_truth(db: Database) -> None:
    """The flags of an experiment's config its engine does not model (a simulated engine's), kept so a verdict
    never calls an unmodelled change measured."""
    db["experiments"].add_column("not_modelled_json", str)
    db["plan_changes"].create(
        {"id": int, "session_id": str, "source": str, "changes_json": str, "old_plan_json": str, "at": str},
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
        not_null={"session_id", "changes_json", "at"},
    )
    db["plan_changes"].create_index(["session_id"])


def _m011_usage(db: Database) -> None:
    """Each agent run's model requests, input and output tokens, and cost where it is known."""
    db["model_usage"].create(
        {
            "id": int,
            "session_id": str,
            "model": str,
            "requests": int,
            "input_tokens": int,
            "output_tokens": int,
            "cost_usd": float,
            "outcome": str,
            "started_at": str,
            "finished_at": str,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
    )
    db["model_usage"].create_index(["session_id"])


MIGRATIONS: list[Migration] = [
    ("001_initial", _m001_initial),
    ("002_server_processes", _m002_server_processes),
    ("003_server_identity", _m003_server_identity),
    ("004_analysis", _m004_analysis),
    ("005_telemetry_tokens", _m005_telemetry_tokens),
    ("006_session_settings", _m006_session_settings),
    ("007_combined_items", _m007_combined_items),
    ("008_search", _m008_search),
    ("009_truth", _m009_truth),
    ("011_usage", _m011_usage),
]


# --------------------------------------------------------------------------------------------------
# Helpers.


def _fit(db: Database, table: str, row: dict[str, Any]) -> dict[str, Any]:
    """`row` without the columns `table` lacks: a Store opened at an older migration (the migration tests) has fewer."""
    columns = db[table].columns_dict
    return {k: v for k, v in row.items() if k in columns}


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of a process (clock ticks since boot), to tell a reused pid apart; None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _pid_alive(pid: int, proc_start: str | None) -> bool:
    """Whether the process that took a lock is still running (not exited, not a zombie, pid not reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): os.kill is all we can know
    if stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X"):
        return False
    return proc_start is None or _proc_start(pid) == proc_start


def new_session_id() -> str:
    """A short, typeable, random session id such as `k3f9ab`."""
    alphabet = "abcdefghjkmnpqrstuvwxyz23456789"
    return "".join(secrets.choice(alphabet) for _ in range(6))


class Store:
    """The ledger of one PIVOT_HOME. Safe to share between the threads of a process; one per process."""

    def __init__(self, path: Path | str, *, migrations: Sequence[Migration] = MIGRATIONS) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._check_file()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise self._unwritable(e.strerror or str(e)) from e
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        except sqlite3.Error as e:
            if not self._writable():
                raise self._unwritable(str(e)) from e
            raise LedgerError(f"cannot open the ledger {self.path}: {e}") from e
        self.db = Database(conn)
        try:
            self._check_integrity(conn)
            self.db.execute("PRAGMA foreign_keys = ON")
            if self.db.journal_mode != "wal":
                self.db.enable_wal()
            self.applied = self._migrate(migrations)
        except sqlite3.DatabaseError as e:
            conn.close()
            if not self._writable() or "readonly" in str(e):
                raise self._unwritable(str(e)) from e
            raise self._corrupt(e) from e

    @classmethod
    def for_home(cls, home: Path | str) -> Store:
        """Open (and create or migrate) the ledger of a pivot home."""
        return cls(Path(home) / "state" / "pivot.db")

    # ---- lifecycle

    def _check_file(self) -> None:
        """Refuse a file that is not SQLite before SQLite touches it, so it is left exactly as it was."""
        if not self.path.exists():
            return
        if self.path.is_dir():
            raise LedgerError(f"the ledger path {self.path} is a directory")
        with self.path.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
        if head and head != SQLITE_MAGIC:
            raise self._corrupt("not an SQLite database")

    def _check_integrity(self, conn: sqlite3.Connection) -> None:
        """SQLite's quick_check, once per open and before anything is written: a ledger damaged in its middle pages
        opens without complaint and would take writes (new sessions) into a broken b-tree."""
        rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check(3)").fetchall()]
        if rows != ["ok"]:
            raise sqlite3.DatabaseError("; ".join(rows))

    def _writable(self) -> bool:
        """Whether this process may write the ledger and create its -wal and -shm files beside it."""
        folder = self.path.parent
        if not os.access(folder, os.W_OK):
            return False
        return not self.path.exists() or os.access(self.path, os.W_OK)

    def _unwritable(self, cause: object) -> LedgerError:
        home = self.path.parent.parent
        return LedgerError(
            f"cannot write the ledger {self.path}: the directory is read-only or not yours ({cause}); nothing was "
            "changed",
            hint=f"pivot keeps its ledger, logs and documents under its home ({home}): make that directory writable, "
            "or point --home/PIVOT_HOME at one that is",
        )

    def _corrupt(self, cause: object) -> LedgerError:
        return LedgerError(
            f"the ledger {self.path} is damaged or not a pivot database ({cause}); it was left untouched",
            hint=f"move it aside (mv {self.path} {self.path}.bad) to start a new ledger, "
            "or point PIVOT_HOME/--home at another directory",
        )

    def close(self) -> None:
        with self._lock:
            self.db.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[Database]:
        """One write transaction, taking SQLite's write lock up front (BEGIN IMMEDIATE)."""
        with self._lock:
            try:
                self.db.execute("BEGIN IMMEDIATE")
            except sqlite3.DatabaseError as e:
                raise self._wrap(e) from e
            try:
                yield self.db
            except BaseException:
                self.db.conn.rollback()
                raise
            else:
                self.db.conn.commit()

    @contextlib.contextmanager
    def _read(self) -> Iterator[Database]:
        with self._lock:
            try:
                yield self.db
            except sqlite3.DatabaseError as e:
                if isinstance(e, sqlite3.IntegrityError):
                    raise
                raise self._wrap(e) from e

    def _wrap(self, e: sqlite3.DatabaseError) -> PivotError:
        text = str(e)
        if "readonly" in text or "read-only" in text:
            return self._unwritable(text)
        if "locked" in text or "busy" in text:
            return LedgerError(f"the ledger {self.path} stayed locked for {BUSY_TIMEOUT_S:.0f} s: {text}")
        return self._corrupt(text)

    def _migrate(self, migrations: Sequence[Migration]) -> list[str]:
        """Apply the migrations this ledger lacks, in order, each recorded by name; return the names applied."""
        with self._write() as db:
            db["_migrations"].create({"name": str, "applied_at": str}, pk="name", if_not_exists=True)
            done = {r["name"] for r in db["_migrations"].rows}
            known = {name for name, _ in migrations}
            unknown = sorted(done - known)
            if unknown:
                raise LedgerError(
                    f"the ledger {self.path} was written by a newer pivot (migrations {', '.join(unknown)})",
                    hint="upgrade pivot, or use another PIVOT_HOME",
                )
            applied = []
            for name, migrate in migrations:
                if name in done:
                    continue
                migrate(db)
                db["_migrations"].insert({"name": name, "applied_at": _ts(m.utcnow())})
                applied.append(name)
            return applied

    def migrations(self) -> list[str]:
        """Names of the migrations this ledger has, in the order they were applied."""
        with self._read() as db:
            return [r["name"] for r in db.query("select name from _migrations order by applied_at, name")]

    def _touch(self, db: Database, session_id: str) -> None:
        db.execute("update sessions set updated_at = ? where id = ?", [_ts(m.utcnow()), session_id])

    # ---- sessions

    def create_session(self, session: m.Session) -> m.Session:
        """Record a new session; its id must be new."""
        with self._write() as db:
            if db["sessions"].count_where("id = ?", [session.id]):
                raise PivotError(f"a session with id {session.id!r} already exists")
            db["sessions"].insert(_fit(db, "sessions", self._session_row(session)))
        return session

    @staticmethod
    def _session_row(s: m.Session) -> dict[str, Any]:
        return {
            "id": s.id,
            "name": s.name,
            "plan_name": s.plan.name,
            "plan_json": s.plan.model_dump_json(),
            "engine": s.engine,
            "model": s.model,
            "model_base_url": s.model_base_url,
            "settings_json": s.settings.model_dump_json(),
            "status": s.status,
            "created_at": _ts(s.created_at),
            "updated_at": _ts(s.updated_at),
        }

    @staticmethod
    def _session(row: dict[str, Any]) -> m.Session:
        try:
            return m.Session(
                id=row["id"],
                name=row["name"],
                plan=m.Plan.model_validate_json(row["plan_json"]),
                engine=row["engine"],
                model=row["model"],
                model_base_url=row.get("model_base_url"),
                settings=m.SessionSettings.model_validate_json(row.get("settings_json") or "{}"),
                status=row["status"],
                created_at=_dt(row["created_at"]),
                updated_at=_dt(row["updated_at"]),
            )
        except (ValidationError, ValueError) as e:
            raise LedgerError(
                f"session {row['id']} in the ledger cannot be read: {e}",
                hint="it may have been written by another version of pivot",
            ) from e

    def get_session(self, ref: str) -> m.Session:
        """The session with this id, a unique id prefix, or this name (the newest of that name)."""
        with self._read() as db:
            rows = list(db["sessions"].rows_where("id = ?", [ref]))
            if not rows:
                rows = list(db["sessions"].rows_where("substr(id, 1, ?) = ?", [len(ref), ref])) if len(ref) >= 2 else []
                if len(rows) > 1:
                    ids = ", ".join(sorted(r["id"] for r in rows))
                    raise SessionNotFound(f"{ref!r} matches several sessions: {ids}", hint="give more of the id")
            if not rows:
                rows = list(db["sessions"].rows_where("name = ?", [ref], order_by="created_at desc", limit=1))
        if not rows:
            raise SessionNotFound(f"no session {ref!r}", hint="`pivot sessions` lists them")
        return self._session(rows[0])

    def list_sessions(self) -> list[m.Session]:
        with self._read() as db:
            return [self._session(r) for r in db["sessions"].rows_where(order_by="updated_at desc")]

    def session_summaries(self) -> list[m.SessionSummary]:
        """One line per session, newest activity first, for `pivot sessions`."""
        sql = """
            select s.*,
              (select count(*) from experiments e where e.session_id = s.id) as n_experiments,
              (select question from pivots p where p.session_id = s.id and p.answer is null
                 order by p.id desc limit 1) as open_question
            from sessions s order by s.updated_at desc
        """
        with self._read() as db:
            rows = list(db.query(sql))
        out = []
        for row in rows:
            session = self._session(row)
            t = session.target
            locked = (
                row["lock_pid"] if row["lock_pid"] and _pid_alive(row["lock_pid"], row["lock_proc_start"]) else None
            )
            out.append(
                m.SessionSummary(
                    id=session.id,
                    name=session.name,
                    plan=session.plan.name,
                    target=f"{t.model} on {t.gpus}x {t.hardware}",
                    engine=session.engine,
                    status=session.status,
                    experiments=row["n_experiments"],
                    open_pivot=row["open_question"],
                    locked_by_pid=locked,
                    updated_at=session.updated_at,
                )
            )
        return out

    def set_session_model(self, session_id: str, model: str) -> None:
        """Drive the session with another model string from now on (never a key)."""
        with self._write() as db:
            db.execute(
                "update sessions set model = ?, updated_at = ? where id = ?", [model, _ts(m.utcnow()), session_id]
            )

    def change_session_plan(self, session_id: str, plan: m.Plan, changes: list[str]) -> m.PlanChange:
        """Replace the session's plan with an edited one, and record what changed (the old plan is kept)."""
        change = m.PlanChange(session_id=session_id, source=plan.source, changes=changes)
        with self._write() as db:
            rows = list(db["sessions"].rows_where("id = ?", [session_id]))
            if not rows:
                raise SessionNotFound(f"no session {session_id!r}")
            table = db["plan_changes"]
            table.insert(
                {
                    "session_id": session_id,
                    "source": change.source,
                    "changes_json": json.dumps(changes),
                    "old_plan_json": rows[0]["plan_json"],
                    "at": _ts(change.at),
                }
            )
            db.execute(
                "update sessions set plan_json = ?, plan_name = ?, updated_at = ? where id = ?",
                [plan.model_dump_json(), plan.name, _ts(m.utcnow()), session_id],
            )
            return change.model_copy(update={"id": table.last_pk})

    def plan_changes(self, session_id: str) -> list[m.PlanChange]:
        """The session's plan changes, oldest first."""
        with self._read() as db:
            if "plan_changes" not in db.table_names():
                return []
            rows = db["plan_changes"].rows_where("session_id = ?", [session_id], order_by="id")
            return [
                m.PlanChange(
                    id=r["id"],
                    session_id=r["session_id"],
                    source=r["source"],
                    changes=json.loads(r["changes_json"]),
                    at=_dt(r["at"]),
                )
                for r in rows
            ]

    def set_session_status(self, session_id: str, status: m.SessionStatus) -> None:
        with self._write() as db:
            db.execute(
                "update sessions set status = ?, updated_at = ? where id = ?",
                [status, _ts(m.utcnow()), session_id],
            )

    def acquire_session(self, session_id: str) -> str | None:
        """Lock the session for this process. Returns a notice when a dead process's lock was taken over.

        Raises SessionLocked when another live process holds it. Re-acquiring in the same process is fine.
        """
        me, host = os.getpid(), socket.gethostname()
        with self._write() as db:
            rows = list(db["sessions"].rows_where("id = ?", [session_id]))
            if not rows:
                raise SessionNotFound(f"no session {session_id!r}")
            row = rows[0]
            notice = None
            pid = row["lock_pid"]
            if pid and not (pid == me and row["lock_host"] == host):
                if row["lock_host"] != host:
                    raise SessionLocked(
                        f"session {session_id} is in use by pid {pid} on host {row['lock_host']}",
                        hint="stop pivot there first; if it is gone (a container that was replaced), "
                        f"`pivot unlock {session_id}` clears the lock",
                    )
                if _pid_alive(pid, row["lock_proc_start"]):
                    raise SessionLocked(
                        f"session {session_id} is in use by pid {pid} (since {row['lock_at']})",
                        hint=f"wait for it to finish, or stop it (kill {pid}); then run the command again",
                    )
                notice = f"session {session_id} was locked by pid {pid}, which is no longer running; lock taken over"
            db.execute(
                "update sessions set lock_pid = ?, lock_host = ?, lock_proc_start = ?, lock_at = ? where id = ?",
                [me, host, _proc_start(me), _ts(m.utcnow()), session_id],
            )
        return notice

    def break_session_lock(self, session_id: str) -> int | None:
        """Clear a session's lock when its holder is gone (or held from another host); returns the old pid.

        A holder alive on this host is always refused: it is a live run, and clearing its lock would let a second
        process stop its server and run its experiments again. Stopping it is the fix; its own exit releases it.
        """
        with self._write() as db:
            rows = list(db["sessions"].rows_where("id = ?", [session_id]))
            if not rows:
                raise SessionNotFound(f"no session {session_id!r}")
            row = rows[0]
            pid = row["lock_pid"]
            if pid is None:
                return None
            here = row["lock_host"] == socket.gethostname()
            if here and _pid_alive(pid, row["lock_proc_start"]):
                raise SessionLocked(
                    f"session {session_id} is in use by pid {pid}, which is running on this host; its lock is not "
                    "cleared while it runs",
                    hint=f"stop that pivot first: Ctrl-C in its terminal, or `kill {pid}` (it stops its servers and "
                    "releases the lock); then run the command again",
                )
            db.execute(_UNLOCK + "where id = ?", [session_id])
            return pid

    def release_session(self, session_id: str) -> None:
        """Drop this process's lock on the session (a lock held by another process is left alone)."""
        with self._write() as db:
            db.execute(
                _UNLOCK + "where id = ? and lock_pid = ? and lock_host = ?",
                [session_id, os.getpid(), socket.gethostname()],
            )

    def session_lock(self, session_id: str) -> int | None:
        """The pid holding the session's lock, if that process is alive."""
        with self._read() as db:
            row = db["sessions"].get(session_id)
        pid = row["lock_pid"]
        return pid if pid and _pid_alive(pid, row["lock_proc_start"]) else None

    # ---- message history (pydantic-ai messages as JSON, one row per message)

    def append_messages(self, session_id: str, messages_json: Sequence[str]) -> None:
        """Append serialized messages to the session's history, in order, in one transaction."""
        if not messages_json:
            return
        with self._write() as db:
            row = next(db.query("select coalesce(max(seq), 0) as n from messages where session_id = ?", [session_id]))
            now = _ts(m.utcnow())
            db["messages"].insert_all(
                {"session_id": session_id, "seq": row["n"] + i + 1, "created_at": now, "json": text}
                for i, text in enumerate(messages_json)
            )
            self._touch(db, session_id)

    def messages(self, session_id: str) -> list[str]:
        with self._read() as db:
            return [r["json"] for r in db["messages"].rows_where("session_id = ?", [session_id], order_by="seq")]

    # ---- todos

    def replace_todos(self, session_id: str, todos: Sequence[m.Todo]) -> list[m.Todo]:
        """Make the session's todo list exactly `todos` (the todo_write semantics); ids are kept or assigned."""
        out = []
        used: set[str] = set()
        for i, todo in enumerate(todos, start=1):
            tid = todo.id or f"t{i}"
            while tid in used:
                tid = f"{tid}-{i}"
            used.add(tid)
            out.append(todo.model_copy(update={"id": tid}))
        with self._write() as db:
            db.execute("delete from todos where session_id = ?", [session_id])
            now = _ts(m.utcnow())
            db["todos"].insert_all(
                {"session_id": session_id, "position": pos, "updated_at": now, **t.model_dump()}
                for pos, t in enumerate(out)
            )
            self._touch(db, session_id)
        return out

    def todos(self, session_id: str) -> list[m.Todo]:
        with self._read() as db:
            rows = db["todos"].rows_where("session_id = ?", [session_id], order_by="position")
            return [m.Todo(**{k: r[k] for k in m.Todo.model_fields}) for r in rows]

    # ---- experiments

    @staticmethod
    def _experiment_row(e: m.Experiment) -> dict[str, Any]:
        return {
            "session_id": e.session_id,
            "plan_item": e.plan_item,
            "plan_items_json": json.dumps(e.plan_items),
            "kind": e.kind,
            "title": e.title,
            "hypothesis": e.hypothesis,
            "config_json": e.config.model_dump_json(),
            "base_experiment_id": e.base_experiment_id,
            "workload_json": e.workload.model_dump_json(),
            "workload_key": e.workload.workload_key(),
            "status": e.status,
            "verdict": e.verdict,
            "reason": e.reason,
            "audit_json": json.dumps([issue.model_dump() for issue in e.audit]),
            "not_modelled_json": json.dumps(e.not_modelled),
            "failure": e.failure,
            "failure_detail": e.failure_detail,
            "log_path": e.log_path,
            "predicted_tok_s": e.predicted_tok_s,
            "predicted_change_pct": e.predicted_change_pct,
            "prediction": e.prediction,
            "created_at": _ts(e.created_at),
            "started_at": _ts(e.started_at),
            "finished_at": _ts(e.finished_at),
        }

    @staticmethod
    def _experiment(row: dict[str, Any]) -> m.Experiment:
        return m.Experiment(
            id=row["id"],
            session_id=row["session_id"],
            plan_item=row["plan_item"],
            plan_items=json.loads(row.get("plan_items_json") or "[]"),
            kind=row["kind"],
            title=row["title"] or "",
            hypothesis=row["hypothesis"] or "",
            config=m.ServerConfig.model_validate_json(row["config_json"]),
            base_experiment_id=row["base_experiment_id"],
            workload=m.BenchSpec.model_validate_json(row["workload_json"]),
            status=row["status"],
            verdict=row["verdict"],
            reason=row["reason"],
            audit=json.loads(row["audit_json"] or "[]"),
            not_modelled=json.loads(row.get("not_modelled_json") or "[]"),
            failure=row["failure"],
            failure_detail=row.get("failure_detail"),
            log_path=row["log_path"],
            predicted_tok_s=row.get("predicted_tok_s"),
            predicted_change_pct=row.get("predicted_change_pct"),
            prediction=row.get("prediction"),
            created_at=_dt(row["created_at"]),
            started_at=_dt(row["started_at"]),
            finished_at=_dt(row["finished_at"]),
        )

    def add_experiment(self, session_id: str, experiment: m.Experiment) -> m.Experiment:
        """Record an experiment in the session; returns it with its id."""
        e = experiment.model_copy(update={"session_id": session_id, "id": None})
        with self._write() as db:
            table = db["experiments"]
            table.insert(_fit(db, "experiments", self._experiment_row(e)))
            self._touch(db, session_id)
            return e.model_copy(update={"id": table.last_pk})

    def mark_interrupted(self, session_id: str) -> list[int]:
        """Experiments left `running` by a process that is gone become `interrupted` (call with the session's lock
        held, which proves no live process runs them); returns their ids."""
        with self._write() as db:
            ids = [r["id"] for r in db.query(
                "select id from experiments where session_id = ? and status = 'running' order by id", [session_id]
            )]  # fmt: skip
            if ids:
                db.execute(
                    "update experiments set status = 'interrupted' where session_id = ? and status = 'running'",
                    [session_id],
                )
        return ids

    def update_experiment(self, experiment: m.Experiment) -> m.Experiment:
        """Write back a recorded experiment (status, verdict, reason, ...)."""
        if experiment.id is None or experiment.session_id is None:
            raise PivotError("only a recorded experiment (with id and session) can be updated")
        with self._write() as db:
            db["experiments"].update(experiment.id, _fit(db, "experiments", self._experiment_row(experiment)))
            self._touch(db, experiment.session_id)
        return experiment

    def get_experiment(self, experiment_id: int) -> m.Experiment:
        with self._read() as db:
            rows = list(db["experiments"].rows_where("id = ?", [experiment_id]))
        if not rows:
            raise PivotError(f"no experiment {experiment_id}")
        return self._experiment(rows[0])

    def experiments(self, session_id: str) -> list[m.Experiment]:
        with self._read() as db:
            rows = db["experiments"].rows_where("session_id = ?", [session_id], order_by="id")
            return [self._experiment(r) for r in rows]

    # ---- benchmark results and telemetry

    def add_bench_result(self, experiment_id: int, result: m.BenchResult) -> int:
        """Record a sweep and all its levels in one transaction; returns the run id."""
        with self._write() as db:
            runs = db["bench_runs"]
            runs.insert(
                {
                    "experiment_id": experiment_id,
                    "spec_json": result.spec.model_dump_json(),
                    "engine": result.engine,
                    "source": result.source,
                    "started_at": _ts(result.started_at),
                    "finished_at": _ts(result.finished_at),
                    "interrupted": int(result.interrupted),
                    "raw_path": result.raw_path,
                }
            )
            run_id = runs.last_pk
            columns = [c for c in db["bench_levels"].columns_dict if c not in ("id", "run_id", "experiment_id")]
            db["bench_levels"].insert_all(
                {
                    "run_id": run_id,
                    "experiment_id": experiment_id,
                    **{c: getattr(level, c) for c in columns if c != "level_json"},
                    "level_json": level.model_dump_json(),
                }
                for level in result.levels
            )
            self._touch_experiment(db, experiment_id)
        return run_id

    def _touch_experiment(self, db: Database, experiment_id: int) -> None:
        row = db["experiments"].get(experiment_id)
        self._touch(db, row["session_id"])

    def bench_results(self, experiment_id: int) -> list[m.BenchResult]:
        """The experiment's sweeps, oldest first, each with its levels in the order they ran."""
        with self._read() as db:
            runs = list(db["bench_runs"].rows_where("experiment_id = ?", [experiment_id], order_by="id"))
            out = []
            for run in runs:
                levels = db["bench_levels"].rows_where("run_id = ?", [run["id"]], order_by="id")
                out.append(
                    m.BenchResult(
                        spec=m.BenchSpec.model_validate_json(run["spec_json"]),
                        levels=[m.BenchLevel.model_validate_json(lv["level_json"]) for lv in levels],
                        engine=run["engine"],
                        source=run["source"],
                        started_at=_dt(run["started_at"]),
                        finished_at=_dt(run["finished_at"]),
                        interrupted=bool(run["interrupted"]),
                        raw_path=run["raw_path"],
                    )
                )
            return out

    def add_telemetry(self, experiment_id: int, telemetry: m.Telemetry, run_id: int | None = None) -> int:
        """Record one level's telemetry and its per-GPU rows in one transaction; returns its id."""
        with self._write() as db:
            table = db["telemetry"]
            table.insert(
                {
                    "experiment_id": experiment_id,
                    "run_id": run_id,
                    "max_concurrency": telemetry.max_concurrency,
                    "source": telemetry.source,
                    "started_at": _ts(telemetry.started_at),
                    "finished_at": _ts(telemetry.finished_at),
                    "error": telemetry.error,
                    "server_metrics_json": json.dumps(telemetry.server_metrics),
                    "output_tokens": telemetry.output_tokens,
                    "output_tokens_per_j": telemetry.output_tokens_per_j,
                }
            )
            tid = table.last_pk
            db["telemetry_gpus"].insert_all(
                {
                    "telemetry_id": tid,
                    "gpu": g.gpu,
                    "power_w_mean": g.power_w_mean,
                    "power_w_max": g.power_w_max,
                    "power_limit_w": g.power_limit_w,
                    "util_gpu_pct_mean": g.util_gpu_pct_mean,
                    "energy_j": g.energy_j,
                    "gpu_json": g.model_dump_json(),
                }
                for g in telemetry.gpus
            )
            self._touch_experiment(db, experiment_id)
        return tid

    def telemetry(self, experiment_id: int) -> list[m.Telemetry]:
        with self._read() as db:
            rows = list(db["telemetry"].rows_where("experiment_id = ?", [experiment_id], order_by="id"))
            out = []
            for row in rows:
                gpus = db["telemetry_gpus"].rows_where("telemetry_id = ?", [row["id"]], order_by="gpu")
                out.append(
                    m.Telemetry(
                        source=row["source"],
                        max_concurrency=row["max_concurrency"],
                        started_at=_dt(row["started_at"]),
                        finished_at=_dt(row["finished_at"]),
                        error=row["error"],
                        server_metrics=json.loads(row["server_metrics_json"] or "{}"),
                        gpus=[m.GpuTelemetry.model_validate_json(g["gpu_json"]) for g in gpus],
                        output_tokens=row.get("output_tokens"),
                        output_tokens_per_j=row.get("output_tokens_per_j"),
                    )
                )
            return out

    # ---- documents

    def upsert_document(self, doc: m.Document) -> m.Document:
        """Record a generated document, replacing the record of the same path in the same session."""
        with self._write() as db:
            existing = list(db["documents"].rows_where("session_id = ? and path = ?", [doc.session_id, doc.path]))
            row = {
                "session_id": doc.session_id,
                "kind": doc.kind,
                "plan_item": doc.plan_item,
                "number": doc.number,
                "title": doc.title,
                "path": doc.path,
                "status": doc.status,
                "sha256": doc.sha256,
                "experiment_ids_json": json.dumps(doc.experiment_ids),
                "created_at": existing[0]["created_at"] if existing else _ts(doc.created_at),
                "updated_at": _ts(doc.updated_at),
            }
            table = db["documents"]
            if existing:
                doc_id = existing[0]["id"]
                table.update(doc_id, row)
            else:
                table.insert(row)
                doc_id = table.last_pk
            self._touch(db, doc.session_id)
        return doc.model_copy(update={"id": doc_id, "created_at": _dt(row["created_at"])})

    def documents(self, session_id: str) -> list[m.Document]:
        with self._read() as db:
            rows = db["documents"].rows_where("session_id = ?", [session_id], order_by="kind, plan_item, number, id")
            return [
                m.Document(
                    id=r["id"],
                    session_id=r["session_id"],
                    kind=r["kind"],
                    plan_item=r["plan_item"],
                    number=r["number"],
                    title=r["title"],
                    path=r["path"],
                    status=r["status"] or "",
                    sha256=r["sha256"],
                    experiment_ids=json.loads(r["experiment_ids_json"] or "[]"),
                    created_at=_dt(r["created_at"]),
                    updated_at=_dt(r["updated_at"]),
                )
                for r in rows
            ]

    # ---- analysis findings and micro-benchmarks

    def replace_findings(
        self, session_id: str, experiment_id: int | None, findings: Sequence[m.Finding]
    ) -> list[m.Finding]:
        """Make `findings` the analysis of one experiment (or, with None, the plan-level checks), in one transaction.

        Re-running an analysis replaces what it found before, so the ledger holds one current analysis each.
        """
        with self._write() as db:
            if experiment_id is None:
                db.execute("delete from findings where session_id = ? and experiment_id is null", [session_id])
            else:
                db.execute(
                    "delete from findings where session_id = ? and experiment_id = ?", [session_id, experiment_id]
                )
            table = db["findings"]
            out = []
            for f in findings:
                row = {
                    "session_id": session_id,
                    "experiment_id": experiment_id,
                    "kind": f.kind,
                    "category": f.category,
                    "plan_item": f.plan_item,
                    "max_concurrency": f.max_concurrency,
                    "text": f.text,
                    "values_json": json.dumps(f.values),
                    "formula": f.formula,
                    "severity": f.severity,
                    "created_at": _ts(f.created_at),
                }
                table.insert(row)
                out.append(f.model_copy(update={"id": table.last_pk, "session_id": session_id,
                                                "experiment_id": experiment_id}))  # fmt: skip
            self._touch(db, session_id)
        return out

    def findings(
        self, session_id: str, *, experiment_id: int | None = None, plan_level: bool = False, kind: str | None = None
    ) -> list[m.Finding]:
        """The session's findings in the order they were written: all of them, one experiment's, or
        (plan_level) those that belong to no experiment; optionally of one kind."""
        where, args = "session_id = ?", [session_id]
        if plan_level:
            where += " and experiment_id is null"
        elif experiment_id is not None:
            where += " and experiment_id = ?"
            args.append(experiment_id)
        if kind is not None:
            where += " and kind = ?"
            args.append(kind)
        with self._read() as db:
            rows = list(db["findings"].rows_where(where, args, order_by="id"))
        return [
            m.Finding(
                id=r["id"],
                session_id=r["session_id"],
                experiment_id=r["experiment_id"],
                kind=r["kind"],
                category=r["category"],
                plan_item=r["plan_item"],
                max_concurrency=r["max_concurrency"],
                text=r["text"],
                values=json.loads(r["values_json"] or "{}"),
                formula=r["formula"],
                severity=r["severity"],
                created_at=_dt(r["created_at"]),
            )
            for r in rows
        ]

    def add_microbench(self, result: m.MicrobenchResult) -> m.MicrobenchResult:
        """Record one GEMM micro-benchmark; returns it with its id."""
        with self._write() as db:
            table = db["microbench_results"]
            row = result.model_dump(exclude={"id"})
            row["measured_at"] = _ts(result.measured_at)
            table.insert(row)
            return result.model_copy(update={"id": table.last_pk})

    def microbench_results(self, *, device: str | None = None, dtype: str | None = None) -> list[m.MicrobenchResult]:
        """Recorded micro-benchmarks, oldest first, optionally for one device and one dtype."""
        where, args = "1 = 1", []
        if device is not None:
            where += " and device = ?"
            args.append(device)
        if dtype is not None:
            where += " and dtype = ?"
            args.append(dtype)
        with self._read() as db:
            rows = list(db["microbench_results"].rows_where(where, args, order_by="id"))
        return [m.MicrobenchResult(**{**r, "measured_at": _dt(r["measured_at"])}) for r in rows]

    # ---- pivots

    @staticmethod
    def _pivot(r: dict[str, Any]) -> m.Pivot:
        return m.Pivot(
            id=r["id"],
            session_id=r["session_id"],
            question=r["question"],
            options=json.loads(r["options_json"]),
            answer=r["answer"],
            tool_call_id=r["tool_call_id"],
            summary_path=r["summary_path"],
            asked_at=_dt(r["asked_at"]),
            answered_at=_dt(r["answered_at"]),
        )

    def add_pivot(self, session_id: str, pivot: m.Pivot) -> m.Pivot:
        """Record a question for the user and mark the session as waiting, in one transaction."""
        with self._write() as db:
            table = db["pivots"]
            table.insert(
                {
                    "session_id": session_id,
                    "question": pivot.question,
                    "options_json": json.dumps(pivot.options),
                    "answer": pivot.answer,
                    "tool_call_id": pivot.tool_call_id,
                    "summary_path": pivot.summary_path,
                    "asked_at": _ts(pivot.asked_at),
                    "answered_at": _ts(pivot.answered_at),
                }
            )
            pivot_id = table.last_pk
            if pivot.answer is None:
                db.execute(
                    "update sessions set status = 'waiting', updated_at = ? where id = ?",
                    [_ts(m.utcnow()), session_id],
                )
        return pivot.model_copy(update={"id": pivot_id, "session_id": session_id})

    def answer_pivot(self, pivot_id: int, answer: str) -> m.Pivot:
        """Record the user's answer and make the session active again."""
        with self._write() as db:
            rows = list(db["pivots"].rows_where("id = ?", [pivot_id]))
            if not rows:
                raise PivotError(f"no pivot {pivot_id}")
            if rows[0]["answer"] is not None:
                raise PivotError(f"pivot {pivot_id} was already answered: {rows[0]['answer']!r}")
            now = _ts(m.utcnow())
            db["pivots"].update(pivot_id, {"answer": answer, "answered_at": now})
            db.execute(
                "update sessions set status = 'active', updated_at = ? where id = ?", [now, rows[0]["session_id"]]
            )
            return self._pivot(db["pivots"].get(pivot_id))

    # ---- model usage

    def add_usage(self, session_id: str, usage: m.ModelUsage) -> m.ModelUsage:
        """Record one agent run's model usage."""
        with self._write() as db:
            table = db["model_usage"]
            table.insert(
                {
                    "session_id": session_id,
                    "model": usage.model,
                    "requests": usage.requests,
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "cost_usd": usage.cost_usd,
                    "outcome": usage.outcome,
                    "started_at": _ts(usage.started_at),
                    "finished_at": _ts(usage.finished_at),
                }
            )
            usage_id = table.last_pk
        return usage.model_copy(update={"id": usage_id, "session_id": session_id})

    def update_usage(self, usage: m.ModelUsage) -> None:
        """Bring a run's usage row up to date (the run goes on: its numbers so far)."""
        with self._write() as db:
            db["model_usage"].update(
                usage.id,
                {
                    "requests": usage.requests,
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "cost_usd": usage.cost_usd,
                    "outcome": usage.outcome,
                    "finished_at": _ts(usage.finished_at),
                },
            )

    def usage(self, session_id: str) -> list[m.ModelUsage]:
        """The session's model usage, one row per agent run, oldest first."""
        with self._read() as db:
            return [
                m.ModelUsage(
                    id=r["id"],
                    session_id=r["session_id"],
                    model=r["model"],
                    requests=r["requests"] or 0,
                    input_tokens=r["input_tokens"] or 0,
                    output_tokens=r["output_tokens"] or 0,
                    cost_usd=r["cost_usd"],
                    outcome=r["outcome"] or "",
                    started_at=_dt(r["started_at"]),
                    finished_at=_dt(r["finished_at"]),
                )
                for r in db["model_usage"].rows_where("session_id = ?", [session_id], order_by="id")
            ]

    def pivots(self, session_id: str) -> list[m.Pivot]:
        with self._read() as db:
            return [self._pivot(r) for r in db["pivots"].rows_where("session_id = ?", [session_id], order_by="id")]

    def open_pivot(self, session_id: str) -> m.Pivot | None:
        """The newest unanswered question of the session, if any."""
        open_ = [p for p in self.pivots(session_id) if p.open]
        return open_[-1] if open_ else None

    # ---- server processes

    def add_server(self, server: m.ServerProcess) -> m.ServerProcess:
        """Record a server process as soon as it is started, before waiting for it."""
        with self._write() as db:
            row = server.model_dump(exclude={"id", "argv"})
            row.update(
                argv_json=json.dumps(server.argv),
                started_at=_ts(server.started_at),
                stopped_at=_ts(server.stopped_at),
            )
            table = db["servers"]
            table.insert(row)
            server_id = table.last_pk
            self._touch(db, server.session_id)
        return server.model_copy(update={"id": server_id})

    def update_server(self, server_id: int, *, status: m.ServerStatus, failure: str | None = None) -> None:
        """Record a server's new state; stopping or crashing also records when."""
        stopped = _ts(m.utcnow()) if status in ("stopped", "crashed") else None
        with self._write() as db:
            db.execute(
                "update servers set status = ?, failure = coalesce(?, failure), "
                "stopped_at = coalesce(?, stopped_at) where id = ?",
                [status, failure, stopped, server_id],
            )

    def servers(self, session_id: str, *, running_only: bool = False) -> list[m.ServerProcess]:
        """The session's server processes; with running_only, those not recorded as stopped or crashed."""
        where = "session_id = ?" + (" and status in ('starting', 'ready')" if running_only else "")
        with self._read() as db:
            rows = list(db["servers"].rows_where(where, [session_id], order_by="id"))
        out = []
        for r in rows:
            r = dict(r)
            r["argv"] = json.loads(r.pop("argv_json"))
            r["started_at"], r["stopped_at"] = _dt(r["started_at"]), _dt(r["stopped_at"])
            out.append(m.ServerProcess(**r))
        return out
