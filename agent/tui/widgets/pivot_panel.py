"""The open pivot: the agent's question, a button per option, and a free answer; it posts the answer, nothing more."""

from __future__ import annotations

from textual import on
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Button, Input, Static

from agent import models as m


class PivotPanel(Vertical):
    """The open pivot: its question, one button per option, and an input for a free answer."""

    DEFAULT_CSS = """
    PivotPanel { display: none; height: auto; max-height: 60%; border: round $warning; padding: 0 1; }
    PivotPanel.open { display: block; }
    PivotPanel .question { text-style: bold; margin: 0 0 1 0; }
    PivotPanel Button.option { width: 1fr; height: auto; text-align: left; content-align: left middle; }
    PivotPanel .hint { color: $text-muted; }
    """

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
