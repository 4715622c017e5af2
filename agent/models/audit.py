"""Flag audit: what the catalog says about each flag of a configuration."""

from __future__ import annotations

from typing import Literal

from agent.models.base import _Model

# --------------------------------------------------------------------------------------------------
# Flags audit.

FlagStatus = Literal["ok", "unknown", "ambiguous", "deprecated", "invalid", "noop"]
BLOCKING_FLAG_STATUSES: frozenset[str] = frozenset({"unknown", "ambiguous", "invalid"})


class FlagIssue(_Model):
    """The audit's verdict on one flag as typed, with what to do instead."""

    flag: str
    status: FlagStatus
    message: str = ""

    @property
    def blocking(self) -> bool:
        """True when the engine would refuse to start with this flag."""
        return self.status in BLOCKING_FLAG_STATUSES
