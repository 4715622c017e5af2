"""A status summary in a Markdown viewer; Escape or q goes back."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Header, MarkdownViewer


class SummaryScreen(Screen[None]):
    """A status summary in a Markdown viewer; Escape or q goes back."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("q", "app.pop_screen", "Back", show=False),
    ]

    def __init__(self, title: str, markdown: str) -> None:
        super().__init__()
        self.summary_title, self.markdown = title, markdown

    def compose(self) -> ComposeResult:
        yield Header()
        yield MarkdownViewer(self.markdown, show_table_of_contents=False, open_links=False)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.summary_title
        self.query_one(MarkdownViewer).focus()
