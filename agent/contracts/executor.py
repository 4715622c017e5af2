"""The executor contract: one experiment's run as a task, its events and its outcome, and the Executor protocol.

An experiment's run (launch, readiness, the benchmark sweep with its telemetry, an optional profile, stop) is one
`ExperimentTask`. It carries everything the host that runs it needs and nothing of the ledger: the driver (this
pivot process) alone writes the ledger, from the `TaskOutcome` each task gives back. An `Executor` runs a list of
tasks, up to `parallel` at once, hands their progress to a callback and yields each outcome as its task ends, all in
the caller's thread:

    for outcome in executor.run(tasks, on_event=show):   # show(TaskEvent): a progress line of a running task
        record(outcome)                                   # measured, failed, refused, interrupted or lost

The local executor (tools/executors/local.py) runs them one after another in this process: today's behaviour. The
Ray executor (tools/executors/ray_cluster.py, the `pivot[ray]` extra) runs each as a Ray task that asks for the
configuration's GPUs, on whichever node has them free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from agent import models as m

OutcomeStatus = Literal["measured", "failed", "refused", "interrupted", "lost"]
# measured: the sweep ran (some levels may have failed: the server crashed under load);
# failed: the server did not start (its classified reason in `failure`); refused: the engine's own audit refused the
# flags at launch; interrupted: cut short by the driver (Ctrl-C, a cancel), nothing measured to keep;
# lost: the executor lost the task (its node or worker died): nothing is known of the experiment, run it again.


@dataclass(frozen=True)
class ExperimentTask:
    """One run of one experiment, as a host that has none of the ledger can carry it out."""

    session_id: str
    experiment_id: int
    run: int  # the run this task adds to the experiment (1 for a first launch)
    engine: str  # the engine plugin's name (the host that runs the task builds it)
    engine_options: dict[str, Any]
    seed: int  # the engine's noise seed (simulated engines), as the serial path draws it
    config: m.ServerConfig
    workload: m.BenchSpec
    gpus: int  # the GPUs the configuration occupies (the engine's reading of its flags)
    log_path: str  # where the driver keeps the server's log (absolute, on the driver's host)
    raw_path: str  # where the driver keeps the sweep's raw JSONL (absolute, on the driver's host)
    mark: str  # the server's PIVOT_SERVER_OF mark (agent/servers.py): which session of which ledger owns it
    ready_timeout_s: float
    profile: bool = False  # after the sweep, profile the server under load (a profile item)
    profile_dir: str | None = None  # where the driver keeps profile traces
    objective: m.Objective | None = None  # a capacity objective: after the sweep, bracket the load that meets it
    capacity_start: float | None = None  # where the driver's predictor places the crossing (None: no prediction)
    audit: tuple[m.FlagIssue, ...] | None = None  # the driver's audit of `config` (the host does not audit again)
    number: int | None = None  # the experiment's number in its session, as users read it (experiment_id: the ledger's)

    @property
    def label(self) -> str:
        shown = self.number if self.number is not None else self.experiment_id
        return f"experiment {shown}" + (f" run {self.run}" if self.run > 1 else "")


@dataclass(frozen=True)
class TaskEvent:
    """A line of progress from a running task (launching, ready, a level done), for whoever watches."""

    experiment_id: int
    message: str
    kind: Literal["progress", "info", "warning"] = "progress"


@dataclass
class TaskOutcome:
    """How a task ended and everything it measured, for the driver to record."""

    task: ExperimentTask
    status: OutcomeStatus
    started_at: datetime
    finished_at: datetime
    placement: m.Placement
    bench: m.BenchResult | None = None  # the sweep (measured)
    telemetry: list[m.Telemetry] = field(default_factory=list)  # per level of the sweep, in order
    raw_jsonl: str | None = None  # the sweep's levels with bench_serving's keys, when written on another host
    log_text: str | None = None  # the server's log (its last MAX_LOG_BYTES), when written on another host
    log_tail: list[str] = field(default_factory=list)
    failure: str | None = None  # the classified reason (failed, refused, or requests that failed under load)
    failure_detail: str | None = None  # the words that say why
    errors: list[str] = field(default_factory=list)  # a few distinct request errors of failed levels
    server_alive: bool = False  # whether the server was still up at the end of the sweep
    profile: m.ProfileSummary | None = None
    message: str = ""  # interrupted or lost: what happened, in words


EventCallback = Callable[[TaskEvent], None]


@runtime_checkable
class Executor(Protocol):
    """Runs experiment tasks, `parallel` at most at once; events and outcomes reach the caller in its own thread."""

    name: str  # local or ray
    parallel: int

    def run(self, tasks: Sequence[ExperimentTask], on_event: EventCallback) -> Iterator[TaskOutcome]:
        """Run `tasks`: `on_event` gets each progress line as it comes, and each outcome is yielded as its task ends
        (in the order they end; every task gets exactly one outcome). A KeyboardInterrupt in the caller, or closing
        the generator early, cancels what still runs: each task stops its server before the interrupt propagates."""
        ...

    def describe(self) -> str:
        """Where the tasks run, in a line (for the CLI and the summaries)."""
        ...

    def close(self) -> None:
        """Release what the executor holds (a local Ray instance it started is shut down); safe to call twice."""
        ...
