"""Pivots: the questions put to the user, and their answers."""

from __future__ import annotations

from typing import Any

from agent import models as m
from agent.errors import PivotError
from agent.store.core import StoreCore
from agent.store.rows import RowMap, _ts

PIVOTS = RowMap(m.Pivot, json=("options", "closes_tiers"))


class PivotsMixin(StoreCore):
    """The `pivots` table; asking and answering also set the session's status."""

    @staticmethod
    def _pivot(r: dict[str, Any]) -> m.Pivot:
        return PIVOTS.from_row(r)

    def add_pivot(self, session_id: str, pivot: m.Pivot) -> m.Pivot:
        """Record a question for the user and mark the session as waiting, in one transaction."""
        with self._write() as db:
            table = db["pivots"]
            table.insert(PIVOTS.to_row(pivot, skip=("id",), session_id=session_id))
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

    def pivots(self, session_id: str) -> list[m.Pivot]:
        with self._read() as db:
            return [self._pivot(r) for r in db["pivots"].rows_where("session_id = ?", [session_id], order_by="id")]

    def open_pivot(self, session_id: str) -> m.Pivot | None:
        """The newest unanswered question of the session, if any."""
        open_ = [p for p in self.pivots(session_id) if p.open]
        return open_[-1] if open_ else None
