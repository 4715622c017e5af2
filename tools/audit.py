"""The engine's audit of a plan item before any launch, every proposer's: flags the engine refuses, and flags it
accepts but reads nowhere (no-ops in this engine version), on top of the best configuration."""

from __future__ import annotations

from agent import models as m
from tools.method.reading import Method
from tools.method.step import Step


def item_issues(method: Method, validate, item: m.PlanItem) -> list[m.FlagIssue]:
    """The audit of the item's own flags on top of the best configuration."""
    config = item.apply(method.best_config())
    names = set(item.flags.names()) if item.flags is not None else set()
    return [i for i in validate(config) if i.flag in names or i.blocking]


def noop_reason(issues: list[m.FlagIssue], item: m.PlanItem) -> str | None:
    """Why the item is not worth a launch when every flag it sets is a no-op in this engine version, else None."""
    names = item.flags.names() if item.flags is not None else []
    noops = [i for i in issues if i.status == "noop"]
    if not names or item.remove_flags or {i.flag for i in noops} != set(names):
        return None
    what = "; ".join(f"{i.flag}: {i.message}" if i.message else i.flag for i in noops)
    return f"no launch: the engine accepts {', '.join(names)} but reads {'it' if len(names) == 1 else 'them'} nowhere (no-op; {what})"


def audit_steps(method: Method, fresh: list[m.PlanItem], validate) -> list[Step]:
    """Items the engine refuses, or accepts and reads nowhere, ruled out before any launch (every proposer's)."""
    out: list[Step] = []
    for item in fresh:
        issues = item_issues(method, validate, item)
        blocking = [i for i in issues if i.blocking]
        if blocking:
            why = "; ".join(f"{i.flag}: {i.message or i.status}" for i in blocking)
            out.append(Step("ruled_out", (item.id,), f"refused before launch: {why}"))
        elif (why := noop_reason(issues, item)) is not None:
            out.append(Step("ruled_out", (item.id,), why))
    return out
