"""Generated documents (improvement documents and status summaries) the ledger knows of."""

from __future__ import annotations

from agent import models as m
from agent.store.core import StoreCore
from agent.store.rows import RowMap, _dt, _ts

DOCUMENTS = RowMap(m.Document, json=("experiment_ids",))


class DocumentsMixin(StoreCore):
    """The `documents` table."""

    def upsert_document(self, doc: m.Document) -> m.Document:
        """Record a generated document, replacing the record of the same path in the same session."""
        with self._write() as db:
            existing = list(db["documents"].rows_where("session_id = ? and path = ?", [doc.session_id, doc.path]))
            created = existing[0]["created_at"] if existing else _ts(doc.created_at)
            row = DOCUMENTS.to_row(doc, skip=("id",), created_at=created)
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
            return [DOCUMENTS.from_row(r) for r in rows]
