"""The `sessions` table (and `plan_changes`, the record of a session's plan being replaced)."""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import ValidationError

from agent import models as m
from agent.errors import LedgerError, PivotError, SessionNotFound
from agent.store.core import StoreCore
from agent.store.locks import _pid_alive
from agent.store.rows import RowMap, _fit, _ts

SESSIONS = RowMap(m.Session, json=("plan", "settings"))
PLAN_CHANGES = RowMap(m.PlanChange, json=("changes",))


def new_session_id() -> str:
    """A short, typeable, random session id such as `k3f9ab`."""
    alphabet = "abcdefghjkmnpqrstuvwxyz23456789"
    return "".join(secrets.choice(alphabet) for _ in range(6))


class SessionsMixin(StoreCore):
    """Sessions: create, find, list, summarize, and change their model, status and plan."""

    def create_session(self, session: m.Session) -> m.Session:
        """Record a new session; its id must be new."""
        with self._write() as db:
            if db["sessions"].count_where("id = ?", [session.id]):
                raise PivotError(f"a session with id {session.id!r} already exists")
            db["sessions"].insert(_fit(db, "sessions", self._session_row(session)))
        return session

    @staticmethod
    def _session_row(s: m.Session) -> dict[str, Any]:
        return SESSIONS.to_row(s, plan_name=s.plan.name)

    @staticmethod
    def _session(row: dict[str, Any]) -> m.Session:
        try:
            return SESSIONS.from_row(row)
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
                    target=f"{t.model} on {session.hardware_text}",
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

    def set_session_settings(self, session_id: str, settings: m.SessionSettings) -> None:
        """Go on with other settings from now on (`pivot resume --ray/--parallel`)."""
        with self._write() as db:
            db.execute(
                "update sessions set settings_json = ?, updated_at = ? where id = ?",
                [settings.model_dump_json(), _ts(m.utcnow()), session_id],
            )

    def change_session_plan(self, session_id: str, plan: m.Plan, changes: list[str]) -> m.PlanChange:
        """Replace the session's plan with an edited one, and record what changed (the old plan is kept)."""
        change = m.PlanChange(session_id=session_id, source=plan.source, changes=changes)
        with self._write() as db:
            rows = list(db["sessions"].rows_where("id = ?", [session_id]))
            if not rows:
                raise SessionNotFound(f"no session {session_id!r}")
            table = db["plan_changes"]
            table.insert(PLAN_CHANGES.to_row(change, skip=("id",), old_plan_json=rows[0]["plan_json"]))
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
            return [PLAN_CHANGES.from_row(r) for r in rows]

    def set_session_status(self, session_id: str, status: m.SessionStatus) -> None:
        with self._write() as db:
            db.execute(
                "update sessions set status = ?, updated_at = ? where id = ?",
                [status, _ts(m.utcnow()), session_id],
            )
