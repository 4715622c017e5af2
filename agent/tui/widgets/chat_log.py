"""The conversation: the user's and the agent's messages, the tool calls and the notices, mounted in bursts."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Markdown, Static

from agent.tui.view import Entry
from agent.tui.widgets.tool_line import ToolLine


class ChatLog(VerticalScroll):
    """The conversation: the user's and the agent's messages (Markdown), tool calls, notices.

    Entries queued with `queue` are mounted together every FLUSH_S seconds (one layout for a burst of tool calls
    rather than one each); the log keeps the last MAX_ENTRIES."""

    DEFAULT_CSS = """
    ChatLog { width: 1fr; padding: 0 1; }
    ChatLog Markdown { margin: 1 0 0 0; padding: 0 1; }
    ChatLog Markdown.user { background: $boost; border-left: thick $accent; }
    ChatLog Markdown.agent { border-left: thick $success; }
    ChatLog .notice { color: $text-primary; margin: 1 0 0 0; }
    ChatLog .warning { color: $text-warning; }
    ChatLog .error { color: $text-error; margin: 1 0 0 0; }
    """
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
