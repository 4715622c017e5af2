"""The status line: the session and server state with the step's elapsed time, GPU power, the latest activity."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static


class StatusLine(Horizontal):
    """One line: the session and server state with the step's elapsed time, per-GPU power sparklines while a
    server runs, and the latest activity (cut to what fits)."""

    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; padding: 0 1; }
    StatusLine #state { width: auto; }
    StatusLine #activity { width: 1fr; color: $text-muted; padding: 0 0 0 1; }
    StatusLine #power { width: auto; color: $text-success; padding: 0 0 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="state", markup=False)
        yield Static(id="power", markup=False)
        yield Static(id="activity", markup=False)

    def show(self, state: str, power: str, activity: str) -> None:
        self.query_one("#state", Static).update(state)
        for name, text in (("#power", power), ("#activity", activity)):
            widget = self.query_one(name, Static)
            widget.update(text)
            widget.display = bool(text)
