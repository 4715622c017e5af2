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
    """The todo list (status, priority) and the experiments (change, output tok/s at the judged level, verdict)."""

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

    def show(self, board: Board) -> None:
        """The board's todos and experiments; the columns are as wide as their widest cell, set here rather than on
        the table's next idle (which a loaded host runs late, leaving headers of the old widths)."""
        todos = [(t.mark, t.content, t.priority) for t in board.todos]
        _fill(self.query_one("#todos", DataTable), ("", "todo", "prio"), todos)
        experiments = [(e.id, e.item, e.verdict, e.best, e.change) for e in board.experiments]
        _fill(
            self.query_one("#experiments", DataTable), ("#", "item", "verdict", "tok/s @level", "change"), experiments
        )


def _fill(table: DataTable, headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Replace `table`'s columns and rows; each column as wide as its header or its widest cell."""
    table.clear(columns=True)
    for i, header in enumerate(headers):
        width = max([Text(header).cell_len, *(Text(row[i]).cell_len for row in rows)])
        table.add_column(header, width=width)
    for row in rows:
        table.add_row(*(_text(v) for v in row))
