"""What the method optimizes: an Objective turns a benchmark level into the value every comparison judges.

Every reading of "the number a change is judged by" goes through one Objective: the method's judgement, the noise
band and the best configuration (tools/method/reading.py), and the search's predictions and their correction to the
campaign (tools/search.py). Only `throughput` exists today (output tok/s at the judged level, bench_serving's
`output_throughput`); another objective (goodput under SLOs, capacity, energy) is one more class here, and nothing
that reads the method changes.

The noise statistic lives here too, because it is a statement about the judged values: twice the standard error of
the reference's mean over its runs (2 x sample standard deviation / sqrt(runs), in % of the mean). For two runs it
equals their spread (max - min) / mean; every further run narrows it by about sqrt(n / (n + 1)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agent import models as m


class Objective(Protocol):
    """The value a level is judged by, its metric's name and unit."""

    name: str  # e.g. "throughput"
    metric: str  # the level's key (bench_serving's spelling), e.g. "output_throughput"
    unit: str  # e.g. "output tok/s"

    def value(self, level: m.BenchLevel) -> float | None:
        """The judged value of one level; None when the level does not count (it failed or completed nothing)."""
        ...


@dataclass(frozen=True)
class Throughput:
    """Output tok/s of a level that completed with no failed request (pivot's objective so far)."""

    name: str = "throughput"
    metric: str = "output_throughput"
    unit: str = "output tok/s"

    def value(self, level: m.BenchLevel) -> float | None:
        if level.max_concurrency is None or not level.holds:  # failed, empty, or not a measurement (refused)
            return None
        return level.output_throughput


THROUGHPUT = Throughput()


def objective_for(settings: m.SessionSettings) -> Objective:
    """The session's objective (throughput: the only one so far)."""
    return THROUGHPUT


def noise_pct(values: list[float]) -> float | None:
    """Twice the standard error of the mean of `values`, in % of the mean (None for fewer than two values): about a
    95% bound on how far the mean of these runs is from the configuration's true value (m.BenchLevel.noise_pct: the
    reports read the same statistic)."""
    return m.BenchLevel.noise_pct(values)
