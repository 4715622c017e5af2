"""The method's unit of work, as every proposer hands it over: a Step (a launch, or an item settled without one)
and the items a search may rank. The method owns them; the twin-guided search (tools/search.py) and the peers
(tools/peers.py) produce them, and tools/method/compute.py turns them into the moves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agent import models as m

SEARCH_KINDS = ("flag", "config", "power")  # power: a GPU power limit (the twin models its power and clocks)


def searchable(item: m.PlanItem) -> bool:
    """Items the search ranks: flag, config and power-limit changes on the plan's workload."""
    changes = item.flags is not None or bool(item.remove_flags) or item.power_limit_w is not None
    return item.kind in SEARCH_KINDS and changes and not item.workload


@dataclass
class Step:
    """One step the search (or the plan's order) proposes: a launch, or an item settled without one."""

    action: Literal["launch", "predicted", "ruled_out", "not_measured"]
    items: tuple[str, ...]
    reason: str
    candidate: Any = None  # the twin-guided search's Candidate (tools/search.py) when it proposed the step
    reverts: tuple[str, ...] = ()
    flags: str | None = None  # a bounded retry's cap, when the user asked for it
    baseline: bool = False  # the item's own workload measured first (its baseline)
    experiment_id: int | None = None  # a rerun of this experiment (what was asked for ran already: a run more)

    def launch_args(self) -> dict[str, object]:
        """launch_server's arguments for this launch."""
        if self.experiment_id is not None:
            return {"experiment_id": self.experiment_id}
        args: dict[str, object] = {"baseline": True} if self.baseline else {}
        if len(self.items) > 1:
            args["plan_items"] = list(self.items)
        elif self.items:
            args["plan_item"] = self.items[0]
        if self.reverts:
            args["revert_items"] = list(self.reverts)
        if self.flags:
            args["flags"] = self.flags
        return args
