"""A campaign's progress on stderr (`pivot run`, `pivot demo`, `pivot resume`): never a long silence.

Every event is one line with the seconds since the start (the tool calls, their results, a launch's startup lines, a
benchmark's levels). Between events a step can run for minutes (a server starting, a level under load, a status
summary with its investigations, the twin's predictions), so while the loop runs:

- on a terminal, a spinner under the lines says what runs and for how long ("launch_server ... 42 s");
- piped or redirected, a plain line every HEARTBEAT_S seconds without news says the same ("... still running:
  write_status_summary (30 s)"), so a log shows where the time went.

Nothing of it goes to stdout (`--json` prints JSON alone there); `--quiet` keeps only warnings and errors.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from agent import models as m
from agent.console import err
from agent.text import printable

HEARTBEAT_S = 10.0  # piped: a line after this many seconds without one
TICK_S = 1.0  # how often the spinner's text and the heartbeat are looked at
MARKS = {"tool_call": "->", "tool_result": "<-", "warning": "!!", "error": "!!", "message": "??"}
ACTIVITY_MAX = 80  # characters of the running step's words


class Progress:
    """Events as one line each on stderr, with the seconds since the start; `running()` adds the spinner (a
    terminal) or the heartbeat (piped) while the loop runs."""

    def __init__(self, quiet: bool = False, console: Any = None) -> None:
        self.console = console or err
        self.start = self.printed = self.since = time.monotonic()
        self.quiet = quiet
        self.activity = "starting"
        self._lock = threading.Lock()
        self._status: Any = None

    def __call__(self, event: m.Event) -> None:
        if self.quiet and event.kind not in ("warning", "error"):
            return
        with self._lock:
            now = time.monotonic()
            if event.kind == "tool_call":
                self.activity, self.since = _short(event.message), now
            elif event.kind == "tool_result":
                self.activity, self.since = "choosing the next step", now
            self.console.print(f"[{now - self.start:6.1f}s] {MARKS.get(event.kind, '  ')} {printable(event.message)}",
                               markup=False, highlight=False, soft_wrap=True)  # fmt: skip
            self.printed = now

    def still(self) -> str:
        """What runs now and for how long, in words."""
        return f"{self.activity} ({time.monotonic() - self.since:.0f} s)"

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """While the block runs: the spinner on a terminal, else the heartbeat lines (none with --quiet)."""
        if self.quiet:
            yield
            return
        stop = threading.Event()
        if self.console.is_terminal:
            self._status = self.console.status(self.still(), spinner="dots")
            self._status.start()
        beat = threading.Thread(target=self._beat, args=(stop,), name="pivot-progress", daemon=True)
        beat.start()
        try:
            yield
        finally:
            stop.set()
            beat.join()
            if self._status is not None:
                self._status.stop()
                self._status = None

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(TICK_S):
            with self._lock:
                if self._status is not None:
                    self._status.update(self.still())
                    continue
                now = time.monotonic()
                if now - self.printed >= HEARTBEAT_S:
                    self.console.print(f"[{now - self.start:6.1f}s] .. still running: {self.still()}", markup=False,
                                       highlight=False, soft_wrap=True)  # fmt: skip
                    self.printed = now


def _short(message: str) -> str:
    text = " ".join(printable(message).split())
    return text if len(text) <= ACTIVITY_MAX else text[: ACTIVITY_MAX - 3] + "..."
