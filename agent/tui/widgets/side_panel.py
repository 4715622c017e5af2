"""The side panel: the session's todo list and its experiments, as the ledger has them."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from agent.tui.view import Board


def _text(value: str) -> Text:
    return Text(value)  # a cell from the ledger is text, never markup


class SidePanel(Vertical):
    """The todo list (status, priority) and the experiments (change, best output tok/s, verdict)."""

    DEFAULT_CSS = """
    SidePanel { width: 45%; max-width: 72; min-width: 36; border-left: solid $primary; padding: 0 1; }
    SidePanel.hidden { display: none; }
    SidePanel .heading { text-style: bold; color: $text-accent; margin: 1 0 0 0; }
    SidePanel #todos { height: auto; max-height: 50%; }
    SidePanel #experiments { height: auto; max-height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static("Todos", classes="heading")
        yield DataTable(id="todos", cursor_type="none", show_cursor=False)
        yield Static("Experiments", classes="heading")
        yield DataTable(id="experiments", cursor_type="none", show_cursor=False)

    def on_mount(self) -> None:
        self.query_one("#todos", DataTable).add_columns("", "todo", "prio")
        self.query_one("#experiments", DataTable).add_columns("#", "item", "verdict", "best tok/s", "change")

    def show(self, board: Board) -> None:
        todos = self.query_one("#todos", DataTable)
        todos.clear()
        for t in board.todos:
            todos.add_row(_text(t.mark), _text(t.content), _text(t.priority))
        experiments = self.query_one("#experiments", DataTable)
        experiments.clear()
        for e in board.experiments:
            experiments.add_row(*(_text(v) for v in (e.id, e.item, e.verdict, e.best, e.change)))
