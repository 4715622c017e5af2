"""The answers at pivots: what the user's words mean, and the scope of work they open (Decision).

A tier's end is an event of the ledger: the pivot asked when the tier's work was done records the tiers it closes
(`Pivot.closes_tiers`, written by ask_user from the method's moves at that moment). It is never recomputed from
verdicts recorded later, so a combined step or a retest that touches an earlier tier's item after `continue` opens
nothing again. `continue` releases the next tier when the last released tier is closed; otherwise it goes on with
the tiers open now. Pivots recorded before tier ends were kept (closes_tiers None) are read as they were: a tier
counts as closed at such a pivot when every one of its items was settled before it was asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from agent import models as m
from agent.errors import PivotError
from agent.text import quote

if TYPE_CHECKING:
    from tools.method.reading import Method

STOP_WORDS = {
    "the", "a", "an", "of", "and", "or", "to", "on", "in", "for", "with", "at", "by", "try", "run", "test", "please",
    "item", "do", "it", "go", "next", "then", "i", "want", "lets", "let's", "us",
}  # fmt: skip
CONTINUE_WORDS = ("continue", "go on", "proceed", "next tier", "yes", "carry on", "keep going")
STOP_ANSWERS = ("stop", "finish", "done", "enough", "end", "quit")


@dataclass
class Decision:
    """What the answers given so far decide: the tiers released and closed, the items asked for, a stop."""

    released: set[int]
    requested: list[tuple[str, datetime]] = field(default_factory=list)  # (item id, asked since)
    stopped_at: datetime | None = None
    unclear: m.Pivot | None = None  # the last answer, when it was not understood (or cannot be done)
    why_unclear: str = ""
    closed: set[int] = field(default_factory=set)  # tiers a pivot closed when it was asked

    @property
    def open(self) -> set[int]:
        """Released tiers no pivot has closed yet: the tiers whose end a pivot still owes."""
        return self.released - self.closed

    def asked(self) -> list[tuple[str, datetime]]:
        """The items asked for that still count: all of them, or after a stop only those asked for since."""
        return [(i, t) for i, t in self.requested if self.stopped_at is None or t > self.stopped_at]


def interpret(answer: str, options: list[str], plan: m.Plan) -> tuple[str, str | None]:
    """An answer's meaning: ("continue", None), ("stop", None), ("item", id) or ("unclear", None)."""
    text = answer.strip()
    low = text.lower()
    if re.fullmatch(r"\d+", text) and options and 1 <= int(text) <= len(options) and text not in plan.item_ids():
        return interpret(options[int(text) - 1], [], plan)
    if re.fullmatch(r"\d+", text) and text in plan.item_ids():
        return "item", text
    words = re.findall(r"[a-z0-9+.-]+", low)
    if words and words[0] in STOP_ANSWERS:
        return "stop", None
    if any(low.startswith(w) for w in CONTINUE_WORDS):
        return "continue", None
    ids = [w for w in re.findall(r"\b\d{2,3}\b", low) if w in plan.item_ids()]
    if ids:
        return "item", ids[0]
    significant = [w for w in words if w not in STOP_WORDS and len(w) > 1]
    if significant:
        scores = []
        for item in plan.items:
            title = set(re.findall(r"[a-z0-9+.-]+", item.title.lower()))
            hit = sum(w in title for w in significant)
            scores.append((hit, item.id))
        scores.sort(reverse=True)
        best, second = scores[0], scores[1] if len(scores) > 1 else (0, "")
        if best[0] > 0 and best[0] > second[0] and best[0] * 2 >= len(significant):
            return "item", best[1]
    return "unclear", None


def check_answer(answer: str, pivot: m.Pivot, plan: m.Plan, session_id: str) -> None:
    """Refuse an answer no reading understands (PivotError, nothing recorded): the open pivot keeps its question, and
    the caller (`pivot resume --answer`, MCP's answer_pivot) exits with an error instead of asking again."""
    if interpret(answer, pivot.options, plan)[0] != "unclear":
        return
    raise PivotError(
        f"I did not understand {quote(answer)} as an answer to the open pivot: nothing was recorded",
        hint=f"{understood(pivot.options, plan)} e.g. `pivot resume {session_id} --answer 1`",
    )


def understood(options: list[str], plan: m.Plan) -> str:
    ids = plan.item_ids()
    span = f"{ids[0]}-{ids[-1]}" if ids else "none"
    nums = f"an option's number (1-{len(options)}), " if options else ""
    return (
        f"I understand {nums}a plan item's id ({span}) or words of its title to test that item next, "
        "'continue' to go on, or 'stop' to write the final summary and end."
    )


def _legacy_closes(method: Method, d: Decision, p: m.Pivot) -> set[int]:
    """For a pivot recorded before tier ends were kept: the released tiers every item of which was settled before it
    was asked."""
    return {t for t in d.released if all(method.done(it, before=p.asked_at) for it in method.plan.tier_items(t))}


def decision(method: Method) -> Decision:
    """What the answers at the pivots decide, read in order (see the module docstring)."""
    plan = method.plan
    tiers = sorted({it.tier for it in plan.items})
    d = Decision(released={tiers[0]} if tiers else set(), requested=[])
    for p in method.pivots:
        closes = set(p.closes_tiers) if p.closes_tiers is not None else _legacy_closes(method, d, p)
        d.closed |= closes & d.released
        if p.answer is None:
            continue
        meaning, item_id = interpret(p.answer, p.options, plan)
        d.unclear = None
        at = p.answered_at or p.asked_at
        if meaning == "stop":
            d.stopped_at = at
            continue  # read on: an item asked for after a stop reopens the campaign for that item
        if meaning == "continue" and d.stopped_at is not None:
            d.stopped_at = None  # going on after a stop: the campaign is open again
        if meaning == "item" and item_id is not None and plan.item(item_id).kind == "code":
            d.unclear = p
            d.why_unclear = (
                f"Item {item_id} is a code change for you to make (its improvement document says what); "
                "pivot has nothing to run for it."
            )
        elif meaning == "item" and item_id is not None:
            d.requested.append((item_id, at))
        elif meaning == "continue":
            later = [t for t in tiers if t not in d.released]
            if later and max(d.released) in d.closed:
                d.released.add(later[0])
        else:
            d.unclear = p
            d.why_unclear = f"I did not understand {quote(p.answer or '')}."
    return d
