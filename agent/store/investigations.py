"""Sub-agent investigations: each question, the read-only tools its sub-agent called, its usage and its report."""

from __future__ import annotations

from agent import models as m
from agent.store.core import StoreCore
from agent.store.rows import RowMap

INVESTIGATIONS = RowMap(m.Investigation, json=("tools_used",))


class InvestigationsMixin(StoreCore):
    """The `investigations` table."""

    def add_investigation(self, session_id: str, investigation: m.Investigation) -> m.Investigation:
        """Record an investigation (usually `running`, before its sub-agent starts); returns it with its id."""
        with self._write() as db:
            table = db["investigations"]
            table.insert(INVESTIGATIONS.to_row(investigation, skip=("id",), session_id=session_id))
            new_id = table.last_pk
            self._touch(db, session_id)
        return investigation.model_copy(update={"id": new_id, "session_id": session_id})

    def finish_investigation(self, investigation: m.Investigation) -> None:
        """Bring a recorded investigation up to date: its tools, usage, status and report."""
        with self._write() as db:
            row = INVESTIGATIONS.to_row(investigation, skip=("id", "session_id", "created_at"))
            db["investigations"].update(investigation.id, row)
            self._touch(db, investigation.session_id or "")

    def investigations(self, session_id: str) -> list[m.Investigation]:
        """The session's investigations, oldest first."""
        with self._read() as db:
            rows = db["investigations"].rows_where("session_id = ?", [session_id], order_by="id")
            return [INVESTIGATIONS.from_row(r) for r in rows]
