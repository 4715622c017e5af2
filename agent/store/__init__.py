"""The ledger: one SQLite file (PIVOT_HOME/state/pivot.db) holding everything pivot learns; the only package with SQL.

It is opened through sqlite-utils in WAL mode with a busy timeout. Named migrations (migrations.py) are recorded in
`_migrations` and applied on every open, so the first command on an empty home creates the file. Every write runs in
one `BEGIN IMMEDIATE` transaction (a deferred transaction that reads and then writes fails at once under contention),
and one connection is shared by the threads of a process behind a lock (core.py). A session worked on by a live
process is locked by that process's pid (locks.py). Each table's queries live in a module of their own, as a mixin
that `Store` composes; models become rows and back through the one mapper in rows.py.
"""

from __future__ import annotations

from agent.store.core import BUSY_TIMEOUT_S, SQLITE_MAGIC, StoreCore
from agent.store.documents import DocumentsMixin
from agent.store.experiments import ExperimentsMixin
from agent.store.findings import FindingsMixin
from agent.store.history import HistoryMixin
from agent.store.investigations import InvestigationsMixin
from agent.store.locks import LocksMixin, _pid_alive, _proc_start
from agent.store.migrations import MIGRATIONS, Migration
from agent.store.pivots import PivotsMixin
from agent.store.rows import RowMap, _dt, _fit, _ts
from agent.store.servers import ServersMixin
from agent.store.sessions import SessionsMixin, new_session_id
from agent.store.usage import UsageMixin

__all__ = [
    "BUSY_TIMEOUT_S",
    "MIGRATIONS",
    "SQLITE_MAGIC",
    "Migration",
    "RowMap",
    "Store",
    "_dt",
    "_fit",
    "_pid_alive",
    "_proc_start",
    "_ts",
    "new_session_id",
]


class Store(
    SessionsMixin,
    LocksMixin,
    HistoryMixin,
    ExperimentsMixin,
    DocumentsMixin,
    FindingsMixin,
    PivotsMixin,
    UsageMixin,
    InvestigationsMixin,
    ServersMixin,
    StoreCore,
):
    """The ledger of one PIVOT_HOME. Safe to share between the threads of a process; one per process."""
