"""A tool call in the chat log, in one line; `running` until its result comes."""

from __future__ import annotations

from textual.widgets import Static


class ToolLine(Static):
    """A tool call in one line; `running` until its result comes."""

    DEFAULT_CSS = """
    ToolLine { color: $text-muted; }
    ToolLine.running { color: $text-warning; }
    """
