"""The client's self-check: did it hold the concurrency, dispatch on time, keep its event loop and a core free."""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.models import BenchLevel
from tools.metrics import RequestRecord

# Thresholds of the client's self-check (see `client_check` and `client_warnings`).
PENDING_GRACE_S = 0.002  # a due request still unsent after this (asyncio timers wake up to 1 ms late) is a backlog
SUSTAIN_SHARE = 0.9  # concurrency x time actually used while requests waited, as a share of what was asked for
DISPATCH_DELAY_MS = 10.0  # mean dispatch delay above max(this, DISPATCH_DELAY_SHARE x mean TTFT) is large
DISPATCH_DELAY_SHARE = 0.05
LOOP_LAG_MS = 5.0  # p99 lateness of the event loop above max(this, 5% of mean ITL) is reported
CPU_SHARE = 0.9  # client CPU seconds per wall second: one event loop cannot use more than one core


# ---------------------------------------------------------------------------------------------- self-check


@dataclass(slots=True)
class ClientCheck:
    """What the client did during one level, from its own records."""

    mean_in_flight: float
    max_in_flight: int
    backlog_in_flight: float | None  # mean in flight while some request had arrived but was not yet sent
    mean_dispatch_delay_ms: float
    max_dispatch_delay_ms: float
    backlog_s: float = 0.0  # how long some request was waiting inside the client
    span_s: float = 0.0  # the level, first send to last answer

    def unused_share(self, target: int) -> float:
        """Share of the concurrency x time asked for that went unused while requests were waiting to be sent."""
        if self.backlog_in_flight is None or target <= 0 or self.span_s <= 0:
            return 0.0
        return (target - self.backlog_in_flight) * self.backlog_s / (target * self.span_s)


def client_check(records: Sequence[RequestRecord], arrivals_s: Sequence[float]) -> ClientCheck:
    """In-flight requests over time (mean over the level, peak, and mean while requests waited), and dispatch delay."""
    events: list[tuple[float, int, int]] = []  # (time, change in flight, change waiting)
    for rec, arrived in zip(records, arrivals_s, strict=True):
        # A request counts as waiting once it is PENDING_GRACE_S past due: sending takes a moment, and
        # counting that moment would make every lone Poisson arrival look like a backlog.
        pending_from = arrived + PENDING_GRACE_S
        if rec.start_s > pending_from:
            events.append((pending_from, 0, 1))
            events.append((rec.start_s, 1, -1))
        else:
            events.append((rec.start_s, 1, 0))
        events.append((rec.finished_s(), -1, 0))
    if not records:
        return ClientCheck(0.0, 0, None, 0.0, 0.0)
    events.sort(key=lambda e: (e[0], e[1]))  # at equal times an end frees its slot before a start takes it
    t_first = min(r.start_s for r in records)
    t_last = max(r.finished_s() for r in records)
    in_flight = waiting = peak = 0
    area = backlog_area = backlog_time = 0.0
    prev = events[0][0]
    for t, d_flight, d_wait in events:
        dt = t - prev
        if dt > 0:
            if prev >= t_first:
                area += in_flight * dt
            if waiting > 0:
                backlog_area += in_flight * dt
                backlog_time += dt
        prev = t
        in_flight += d_flight
        waiting += d_wait
        peak = max(peak, in_flight)
    span = max(t_last - t_first, 1e-9)
    delays = np.fromiter((r.queued_s for r in records), dtype=np.float64, count=len(records))
    return ClientCheck(
        mean_in_flight=area / span,
        max_in_flight=peak,
        backlog_in_flight=backlog_area / backlog_time if backlog_time > 0 else None,
        mean_dispatch_delay_ms=float(delays.mean()) * 1000,
        max_dispatch_delay_ms=float(delays.max()) * 1000,
        backlog_s=backlog_time,
        span_s=span,
    )


def client_warnings(
    level: BenchLevel,
    check: ClientCheck,
    *,
    target: int,
    cpu_s: float,
    wall_s: float,
    loop_lag_p99_ms: float | None,
    no_usage: int,
) -> list[str]:
    """Plain sentences for each way the client fell short of the load it was asked to put on the server."""
    warnings = []
    unused = check.unused_share(target)
    if check.backlog_in_flight is not None and unused > 1 - SUSTAIN_SHARE:
        warnings.append(
            f"while requests were waiting to be sent ({check.backlog_s:,.2f} s of {check.span_s:,.2f} s), the client "
            f"held {check.backlog_in_flight:,.1f} of the {target} requests in flight asked for, leaving {unused:.0%} "
            "of the level's concurrency unused: the server saw less load than this level's label says"
        )
    elif check.backlog_in_flight is not None and check.max_in_flight < target:
        warnings.append(f"the client never had more than {check.max_in_flight} of {target} requests in flight")
    delay_limit_ms = max(DISPATCH_DELAY_MS, DISPATCH_DELAY_SHARE * level.mean_ttft_ms)
    if check.mean_dispatch_delay_ms > delay_limit_ms:
        warnings.append(
            f"requests waited {check.mean_dispatch_delay_ms:,.1f} ms on average (at most "
            f"{check.max_dispatch_delay_ms:,.1f} ms) inside the client before being sent, outside their TTFT"
        )
    lag_limit_ms = max(LOOP_LAG_MS, 0.05 * level.mean_itl_ms)
    if loop_lag_p99_ms is not None and loop_lag_p99_ms > lag_limit_ms:
        warnings.append(
            f"the client's event loop ran {loop_lag_p99_ms:,.1f} ms late at p99: chunk timestamps carry up to that "
            "much error"
        )
    if wall_s > 0 and cpu_s / wall_s > CPU_SHARE:
        warnings.append(
            f"the client used {cpu_s / wall_s:.0%} of a CPU core: it may have been the bottleneck, not the server"
        )
    if no_usage:
        warnings.append(
            f"the server reported no usage for {no_usage} requests: their output tokens were counted as chunks"
        )
    return warnings


class _LoopLag:
    """Samples how late the event loop wakes a sleeper: the error on every timestamp the client takes."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.samples = array("d")
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        perf_counter = time.perf_counter
        while True:
            t = perf_counter()
            await asyncio.sleep(self.interval_s)
            self.samples.append(perf_counter() - t - self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> float | None:
        """Stop sampling; the p99 lateness in ms, or None with too few samples."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if len(self.samples) < 10:
            return None
        return float(np.percentile(self.samples, 99)) * 1000
