"""The TUI's widgets. They present what they are given and post messages; they hold no session and run nothing."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Button, DataTable, Input, Markdown, Static

from agent import models as m
from agent.tui.view import Board, Entry


class ToolLine(Static):
    """A tool call in one line; `running` until its result comes."""


class ChatLog(VerticalScroll):
    """The conversation: the user's and the agent's messages (Markdown), tool calls, notices.

    Entries queued with `queue` are mounted together every FLUSH_S seconds (one layout for a burst of tool calls
    rather than one each); the log keeps the last MAX_ENTRIES."""

    FLUSH_S = 0.1
    MAX_ENTRIES = 600

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._tools: dict[str, ToolLine] = {}
        self._pending: list[Entry] = []

    def on_mount(self) -> None:
        self.anchor()
        self.set_interval(self.FLUSH_S, self.flush)

    def _widget(self, entry: Entry) -> Widget:
        if entry.kind in ("user", "agent"):
            return Markdown(entry.text, classes=entry.kind)
        if entry.kind == "tool":
            line = ToolLine("▸ " + entry.text, markup=False, classes="tool")
            if entry.key is not None and entry.text.endswith(" ..."):
                self._tools[entry.key] = line
                line.add_class("running")
            return line
        return Static(entry.text, markup=False, classes=entry.kind)

    def queue(self, *entries: Entry) -> None:
        """Show `entries` with the next flush."""
        self._pending.extend(entries)

    async def add(self, *entries: Entry) -> None:
        """Show `entries` now (after anything queued)."""
        self._pending.extend(entries)
        await self.flush()

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        await self.mount_all([self._widget(e) for e in pending])
        extra = len(self.children) - self.MAX_ENTRIES
        if extra > 0:
            await self.remove_children(list(self.children[:extra]))

    def complete(self, key: str, text: str) -> bool:
        """Put the result on the line of tool call `key`; False when that call is not in the log."""
        for entry in self._pending:
            if entry.key == key:
                entry.text = text
                return True
        line = self._tools.pop(key, None)
        if line is None:
            return False
        line.update("▸ " + text)
        line.remove_class("running")
        return True

    def running(self) -> list[str]:
        """The keys of tool calls still waiting for their result."""
        return [e.key for e in self._pending if e.key and e.text.endswith(" ...")] + list(self._tools)

    @property
    def pending(self) -> int:
        return len(self._pending)


def _text(value: str) -> Text:
    return Text(value)  # a cell from the ledger is text, never markup


class SidePanel(Vertical):
    """The todo list (status, priority) and the experiments (change, best output tok/s, verdict)."""

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


class PivotPanel(Vertical):
    """The open pivot: its question, one button per option, and an input for a free answer."""

    class Answered(Message):
        """The user answered: an option's number, or free text."""

        def __init__(self, answer: str) -> None:
            super().__init__()
            self.answer = answer

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._options: list[str] = []

    async def show(self, pivot: m.Pivot | None, summary_path: str | None) -> None:
        await self.remove_children()
        self._options = list(pivot.options) if pivot else []
        self.set_class(pivot is not None, "open")
        if pivot is None:
            return
        widgets: list[Widget] = [Static(Content(pivot.question), classes="question")]
        widgets += [
            Button(Content(f"{i}. {option}"), id=f"option-{i}", classes="option", compact=True)
            for i, option in enumerate(self._options, start=1)
        ]
        widgets.append(
            Input(placeholder="or answer in your words (an item id, 'continue', 'stop', ...)", id="free-answer")
        )
        if summary_path:
            widgets.append(Static(Content(f"status summary: {summary_path} (ctrl+r opens it)"), classes="hint"))
        await self.mount_all(widgets)

    @on(Button.Pressed, ".option")
    def _option(self, event: Button.Pressed) -> None:
        event.stop()
        number = int((event.button.id or "option-0").split("-")[1])
        self.post_message(self.Answered(str(number)))

    @on(Input.Submitted, "#free-answer")
    def _free(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if text:
            event.input.clear()
            self.post_message(self.Answered(text))


class StatusLine(Horizontal):
    """One line: the session and server state with the step's elapsed time, per-GPU power sparklines while a
    server runs, and the latest activity (cut to what fits)."""

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
