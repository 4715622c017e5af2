"""How busy this host's CPUs were with other processes while a benchmark level ran: the host's busy CPU time
(/proc/stat) less what pivot's own process and the server's process group used (/proc/PID/stat), over the level's
wall time, in cores. A CPU engine (vLLM's CPU build) competes with every other process for the same cores, so a run
taken while a compile or another job ran is slower for reasons that have nothing to do with its flags: the method
reads this figure to say so (tools/method/reading.py). Linux only; None where /proc is not there.

    sampler = HostLoad(server_pgid)
    mark = sampler.mark()
    ...  # the level runs
    other_cores = sampler.other_cores(mark)   # e.g. 1.7: other processes kept 1.7 cores busy
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from agent.servers import _stat, group_members

PROC = Path("/proc")


@dataclass(frozen=True)
class Mark:
    wall: float
    busy_s: float  # the host's busy CPU time (all CPUs), in seconds
    group_s: float  # the server's process group's CPU time
    own_s: float  # this process's CPU time


def _host_busy_s(tick: float) -> float | None:
    try:
        first = (PROC / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return (sum(values) - idle) / tick


def _group_s(pgid: int | None, tick: float) -> float:
    """CPU time (user + system) of the live processes of process group `pgid` (0 when none or unknown)."""
    if pgid is None or pgid <= 0:
        return 0.0
    total = 0
    for pid in group_members(pgid):
        fields = _stat(pid)  # after the command: utime and stime are stat's 14th and 15th
        if fields and len(fields) > 12:
            total += int(fields[11]) + int(fields[12])
    return total / tick


class HostLoad:
    """Samples of the host's CPU use, to tell what other processes used over a span (see the module docstring)."""

    def __init__(self, server_pgid: int | None = None) -> None:
        self.pgid = server_pgid
        self.tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0

    def mark(self) -> Mark | None:
        busy = _host_busy_s(self.tick)
        if busy is None:
            return None
        t = os.times()
        return Mark(time.monotonic(), busy, _group_s(self.pgid, self.tick), t.user + t.system)

    def other_cores(self, start: Mark | None) -> float | None:
        """Cores other processes kept busy since `start`, on average (None without /proc or over no time)."""
        end = self.mark()
        if start is None or end is None or end.wall - start.wall <= 0.05:
            return None
        # a server process that exited since took its CPU time with it: its share is then counted as others'
        # (at most), so a crash never reads as a quiet host
        ours = max(end.group_s - start.group_s, 0.0) + max(end.own_s - start.own_s, 0.0)
        other = (end.busy_s - start.busy_s) - ours
        return round(max(other, 0.0) / (end.wall - start.wall), 2)
