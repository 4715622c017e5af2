"""Server processes pivot started, recorded before it waits for them, so none is ever orphaned."""

from __future__ import annotations

from agent import models as m
from agent.store.core import StoreCore
from agent.store.rows import RowMap, _ts

SERVERS = RowMap(m.ServerProcess, json=("argv",))


class ServersMixin(StoreCore):
    """The `servers` table."""

    def add_server(self, server: m.ServerProcess) -> m.ServerProcess:
        """Record a server process as soon as it is started, before waiting for it."""
        with self._write() as db:
            row = SERVERS.to_row(server, skip=("id",))
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
        return [SERVERS.from_row(r) for r in rows]
