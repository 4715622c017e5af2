"""The base of pivot's models, and the ledger's clock."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict


def utcnow() -> datetime:
    """The current time in UTC, the only clock the ledger records."""
    return datetime.now(UTC)


class _Model(BaseModel):
    """Base of our own models: unknown fields are errors, so a typo in a plan or a tool call is caught."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")
