"""A session's message history (pydantic-ai messages as JSON, one row per message) and its todo list."""

from __future__ import annotations

from collections.abc import Sequence

from agent import models as m
from agent.store.core import StoreCore
from agent.store.rows import RowMap, _ts

TODOS = RowMap(m.Todo)


class HistoryMixin(StoreCore):
    """The `messages` and `todos` tables."""

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
                TODOS.to_row(t, session_id=session_id, position=pos, updated_at=now) for pos, t in enumerate(out)
            )
            self._touch(db, session_id)
        return out

    def todos(self, session_id: str) -> list[m.Todo]:
        with self._read() as db:
            rows = db["todos"].rows_where("session_id = ?", [session_id], order_by="position")
            return [TODOS.from_row(r) for r in rows]
