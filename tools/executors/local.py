"""The local executor: each experiment's server runs in this process's host, one after another (today's behaviour).

Servers are recorded in the ledger as the serial path records them (the driver passes its LedgerLink), so a pivot
killed mid-run has them reaped on the next open like any other.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence

from agent import models as m
from agent.contracts import Engine, EventCallback, ExperimentTask, LedgerLink, TaskOutcome
from tools.executors.task import gpu_ids, run_task


class LocalExecutor:
    """Runs tasks here, one at a time, in the caller's thread."""

    name = "local"
    parallel = 1

    def __init__(
        self,
        ledger_for: Callable[[ExperimentTask], LedgerLink | None] | None = None,
        engine_for: Callable[[int], Engine] | None = None,
    ) -> None:
        self.ledger_for = ledger_for  # the driver's ledger link per task (its servers recorded as today)
        self.engine_for = engine_for  # the driver's engine, seeded (Session.engine_for): the same object as today

    def describe(self) -> str:
        return f"this host ({socket.gethostname()}), one experiment at a time"

    def run(self, tasks: Sequence[ExperimentTask], on_event: EventCallback) -> Iterator[TaskOutcome]:
        for task in tasks:
            ledger = self.ledger_for(task) if self.ledger_for is not None else None
            placement = m.Placement(executor="local", host=socket.gethostname(), gpu_ids=gpu_ids())
            engine = self.engine_for(task.seed) if self.engine_for is not None else None
            yield run_task(task, on_event, ledger=ledger, placement=placement, engine=engine)

    def close(self) -> None:
        pass
