"""The ledger's core: open (and migrate) the SQLite file, WAL, the quick_check, one `BEGIN IMMEDIATE` transaction
per write, and the errors a damaged, locked or read-only ledger gives. The per-table code (sessions.py,
experiments.py, ...) builds on it; `agent.store.Store` composes them.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Self

from sqlite_utils import Database

from agent import models as m
from agent.errors import LedgerError, PivotError
from agent.store.migrations import MIGRATIONS, Migration
from agent.store.rows import _ts

SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 30.0


def expected_tables(applied: Sequence[str]) -> set[str]:
    """The tables a ledger has once the named migrations of pivot's own (MIGRATIONS) ran: they are run on an empty
    database in memory, in their order (a name pivot does not ship is not counted)."""
    key = frozenset(applied)
    if not key:
        return set()
    if key not in _EXPECTED:
        db = Database(sqlite3.connect(":memory:"))
        for name, migrate in MIGRATIONS:
            if name in key:
                migrate(db)
        _EXPECTED[key] = {r[0] for r in db.execute("select name from sqlite_master where type = 'table'")}
        db.conn.close()
    return _EXPECTED[key]


_EXPECTED: dict[frozenset[str], set[str]] = {}


class StoreCore:
    """The ledger of one PIVOT_HOME. Safe to share between the threads of a process; one per process."""

    def __init__(self, path: Path | str, *, migrations: Sequence[Migration] = MIGRATIONS) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._check_file()
        self._inspect()
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
    def for_home(cls, home: Path | str) -> Self:
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

    def _inspect(self) -> None:
        """An existing ledger checked through a read-only connection before any that could write opens: closing a
        read-write connection checkpoints a WAL into the file, which would write a damaged ledger pivot said it left
        untouched. Its integrity (quick_check, the WAL included) and its tables: a ledger that lacks a table its
        migrations made is refused too, before `no such table` surfaces halfway through a write."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as e:
            raise (self._unwritable(e) if not self._writable() else self._corrupt(e)) from e
        try:
            self._check_integrity(conn)
            tables = {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}
            applied = [r[0] for r in conn.execute("select name from _migrations")] if "_migrations" in tables else []
        except sqlite3.DatabaseError as e:
            if "unable to open" in str(e) and not self._writable():
                raise self._unwritable(e) from e
            raise self._corrupt(e) from e
        finally:
            conn.close()
        missing = sorted(expected_tables(applied) - tables)
        if missing:
            raise LedgerError(
                f"the ledger {self.path} lacks the table{'s' if len(missing) > 1 else ''} {', '.join(missing)} its "
                "migrations made; it was left untouched",
                hint=f"move it aside (mv {self.path} {self.path}.bad) to start a new ledger, or restore it from a copy",
            )

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

    def __enter__(self) -> Self:
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
            except sqlite3.DatabaseError as e:  # the ledger failed under the write: one line, nothing half-written
                self.db.conn.rollback()
                if isinstance(e, sqlite3.IntegrityError):
                    raise
                raise self._wrap(e) from e
            except BaseException:
                self.db.conn.rollback()
                raise
            else:
                try:  # a full disk fails here, at the commit: one line, the transaction rolled back
                    self.db.conn.commit()
                except sqlite3.DatabaseError as e:
                    with contextlib.suppress(sqlite3.Error):
                        self.db.conn.rollback()
                    raise self._wrap(e) from e

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
        if "disk is full" in text or getattr(e, "sqlite_errorname", "") == "SQLITE_FULL":
            return LedgerError(
                f"cannot write the ledger {self.path}: the disk is full ({text}); nothing was changed",
                hint=f"free space on the disk that holds {self.path.parent} and run the command again",
            )
        if "unable to open" in text and not self._writable():
            return self._unwritable(text)
        if "disk I/O error" in text:
            return LedgerError(
                f"cannot write the ledger {self.path}: the disk failed under it ({text}); nothing was changed",
                hint="check the disk (full, removed, a network mount gone), then run the command again",
            )
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

    def _touch_experiment(self, db: Database, experiment_id: int) -> None:
        row = db["experiments"].get(experiment_id)
        self._touch(db, row["session_id"])
