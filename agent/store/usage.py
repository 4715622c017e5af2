"""Model usage: each agent run's model requests, tokens and cost."""

from __future__ import annotations

from agent import models as m
from agent.store.core import StoreCore
from agent.store.rows import RowMap

USAGE = RowMap(m.ModelUsage)


class UsageMixin(StoreCore):
    """The `model_usage` table."""

    def add_usage(self, session_id: str, usage: m.ModelUsage) -> m.ModelUsage:
        """Record one agent run's model usage."""
        with self._write() as db:
            table = db["model_usage"]
            table.insert(USAGE.to_row(usage, skip=("id",), session_id=session_id))
            usage_id = table.last_pk
        return usage.model_copy(update={"id": usage_id, "session_id": session_id})

    def update_usage(self, usage: m.ModelUsage) -> None:
        """Bring a run's usage row up to date (the run goes on: its numbers so far)."""
        with self._write() as db:
            db["model_usage"].update(usage.id, USAGE.to_row(usage, skip=("id", "session_id", "model", "started_at")))

    def usage(self, session_id: str) -> list[m.ModelUsage]:
        """The session's model usage, one row per agent run, oldest first."""
        with self._read() as db:
            rows = db["model_usage"].rows_where("session_id = ?", [session_id], order_by="id")
            return [USAGE.from_row(r) for r in rows]
