"""Process helpers the engine tests share."""

from __future__ import annotations

import time

from agent.servers import pid_alive


def gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether `pid` has exited (a zombie counts as exited) within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not pid_alive(pid, None):
            return True
        time.sleep(0.05)
    return False
