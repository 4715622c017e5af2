"""Executors: where the servers of a campaign's experiments run (this host one at a time, or a Ray cluster).

See tools/executors/base.py for the interface; `open_executor` builds the one a session's settings name.
"""

from __future__ import annotations

from tools.executors.base import EventCallback, Executor, ExperimentTask, OutcomeStatus, TaskEvent, TaskOutcome

__all__ = ["EventCallback", "Executor", "ExperimentTask", "OutcomeStatus", "TaskEvent", "TaskOutcome"]
