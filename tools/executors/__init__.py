"""Executors: where the servers of a campaign's experiments run (this host one at a time, or a Ray cluster).

See agent/contracts/executor.py for the interface; `open_executor` builds the one a session's settings name.
"""

from __future__ import annotations

from agent.contracts import EventCallback, Executor, ExperimentTask, OutcomeStatus, TaskEvent, TaskOutcome


def open_executor(address: str | None, parallel: int = 1, *, num_gpus: int | None = None) -> Executor | None:
    """The executor a session runs its experiments on: None (this process, the serial tools) without an address,
    else the Ray cluster at `address` (`local` starts one on this host, with `num_gpus` GPUs when given)."""
    if address is None:
        return None
    from tools.executors.ray_cluster import RayExecutor

    return RayExecutor(address, parallel, num_gpus=num_gpus)


__all__ = ["EventCallback", "Executor", "ExperimentTask", "OutcomeStatus", "TaskEvent", "TaskOutcome", "open_executor"]
