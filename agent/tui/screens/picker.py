"""The picker: resume a session of the ledger, or start one on a shipped plan (or the demo)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from agent.tui.controller import PickerRows

Choice = tuple[str, str]  # ("session", id) | ("plan", name) | ("demo", "")
DEMO_KEY = "demo:"


class PickerScreen(Screen[Choice | None]):
    """Sessions in the ledger (Enter resumes one) and the shipped plans (Enter starts a session on the sim engine)."""

    DEFAULT_CSS = """
    PickerScreen #picker { padding: 0 1; }
    PickerScreen .heading { text-style: bold; color: $text-accent; margin: 1 0 0 0; }
    PickerScreen #picker DataTable { height: auto; max-height: 45%; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_none", "Quit"),
        Binding("tab", "app.focus_next", "Next list", show=True),
    ]

    def __init__(self, rows: PickerRows) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="picker"):
            yield Static("Resume a session", classes="heading")
            yield DataTable(id="sessions", cursor_type="row")
            yield Static("Start a session on a plan (sim engine, `pivot run PLAN` defaults)", classes="heading")
            yield DataTable(id="plans", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        sessions = self.query_one("#sessions", DataTable)
        sessions.add_columns("id", "name", "target", "engine", "status", "exps", "open pivot")
        for s in self.rows.sessions:
            cells = (s.id, s.name, s.target, s.engine, s.status, str(s.experiments), s.open_pivot or "")
            sessions.add_row(*(Text(c[:60]) for c in cells), key=s.id)
        plans = self.query_one("#plans", DataTable)
        plans.add_columns("plan", "items", "title")
        plans.add_row(
            Text("demo"), Text(""), Text("pivot demo: the seeds' campaign on the twin, noise on"), key=DEMO_KEY
        )
        for name, title, items in self.rows.plans:
            plans.add_row(Text(name), Text(str(items)), Text(title), key=name)
        (sessions if self.rows.sessions else plans).focus()

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        key = str(event.row_key.value)
        if event.data_table.id == "sessions":
            self.dismiss(("session", key))
        elif key == DEMO_KEY:
            self.dismiss(("demo", ""))
        else:
            self.dismiss(("plan", key))

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
