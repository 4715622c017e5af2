"""What every report module shares: the documents' headings, the verdicts in words, and the session they read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agent.session import Paths
from agent.store import Store

IMPROVEMENT_HEADINGS = ("Rationale", "Expected impact", "Implementation", "Risks", "Status")
STATUS_HEADINGS = ("Best results", "What was tried", "Ruled out", "Root cause", "Next steps", "Question")
KEPT_VERDICTS = (None, "baseline", "adopted")  # configurations that stand
SET_ASIDE = ("ruled_out", "crashed", "regressed", "no_gain")
VERDICT_WORDS = {
    "baseline": "baseline",
    "adopted": "adopted",
    "no_gain": "no gain",
    "regressed": "regressed",
    "crashed": "crashed",
    "ruled_out": "ruled out",
    "inconclusive": "inconclusive",
    "measured": "measured (not a change)",
    "not_measured": "not measured (the twin does not model it)",
    "predicted": "not launched (the twin predicts no gain)",
    "superseded": "gained, but another change run beside it became the best",
    None: "not judged",
}
CHANGE_FORMULA = "change = (after - before) / before x 100, per level"
# The question a finished campaign's summary ends on (no options: any answer is a new direction).
FINISHED_QUESTION = (
    "The campaign is finished. To go on, resume this session with an item to test again or a new direction."
)


class SessionLike(Protocol):
    """What the reports need: the ledger, the home's paths and the session id (agent.session.Session has them)."""

    store: Store
    paths: Paths
    notices: list[str]

    @property
    def id(self) -> str: ...


@dataclass
class SessionRef:
    """A session by id, for reading and rendering without taking its lock (a live run may hold it)."""

    store: Store
    paths: Paths
    id: str
    notices: list[str] = field(default_factory=list)
