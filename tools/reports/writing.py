"""Writing files under docs_out/ without overwriting the user's edits, and the documents table.

A file is written whole or not at all; one whose content would not change is not touched. A file edited by hand
since pivot wrote it (its sha256 differs from the one the ledger recorded) is never overwritten: the new version
goes beside it (`NAME.new.md`) and pivot says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

from agent import models as m
from tools.reports.common import SessionLike


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _beside(path: Path, n: int) -> Path:
    suffix = ".new" if n == 1 else f".new-{n}"
    return path.with_name(path.stem + suffix + path.suffix)


def _notify(session: SessionLike, message: str) -> None:
    session.notices.append(message)
    emit: Callable[..., None] | None = getattr(session, "emit", None)
    if emit is not None:
        emit("warning", message)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: a kill mid-write leaves the old file (or none), never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _write(session: SessionLike, path: Path, content: str, doc: m.Document, known: dict[str, m.Document]) -> m.Document:
    """Write `content` to `path` unless it holds a version edited by hand; record it; return its record."""
    paths, store = session.paths, session.store
    data = content.encode("utf-8")
    sha = _sha(data)
    rel = paths.relative(path)
    record = known.get(rel)
    target = path
    if path.exists():
        current = _sha(path.read_bytes())
        if current != sha and (record is None or record.sha256 != current):
            n = 1
            while True:
                candidate = _beside(path, n)
                crel = paths.relative(candidate)
                ours = known.get(crel)
                if not candidate.exists():
                    break
                cur = _sha(candidate.read_bytes())
                if cur == sha or (ours is not None and ours.sha256 == cur):
                    break
                n += 1
            target = candidate
            why = "edited by hand since pivot wrote it" if record is not None else "not written by pivot"
            _notify(
                session,
                f"{rel} was {why}; pivot left it as it is and wrote its new version beside it: "
                f"{paths.relative(candidate)}",
            )
            if record is not None and "edited by hand" not in record.status:
                store.upsert_document(
                    record.model_copy(
                        update={
                            "status": f"edited by hand; pivot's version: {candidate.name}",
                            "updated_at": m.utcnow(),
                        }
                    )
                )
    trel = paths.relative(target)
    if not (target.exists() and _sha(target.read_bytes()) == sha):
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, data)
    old = known.get(trel)
    new = doc.model_copy(update={"path": trel, "sha256": sha})
    if old is not None and all(
        getattr(old, f) == getattr(new, f) for f in ("sha256", "status", "title", "experiment_ids", "kind", "number")
    ):
        return old
    saved = store.upsert_document(new.model_copy(update={"updated_at": m.utcnow()}))
    known[trel] = saved
    return saved


def latest_status_doc(documents: Sequence[m.Document]) -> m.Document | None:
    """The newest status summary's markdown record (its HTML twin has the same number)."""
    md = [d for d in documents if d.kind == "status" and d.path.endswith(".md")]
    return max(md, key=lambda d: d.number or 0, default=None)


def list_documents(session: SessionLike) -> list[m.Document]:
    """The session's documents as the ledger records them (improvement documents by item, then summaries)."""
    return session.store.documents(session.id)
