"""Terminal output shared by the `pivot` commands: tables and text on stdout, warnings on stderr, JSON alone."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.cells import cell_len
from rich.console import Console
from rich.table import Column, Table

out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def print_json(data: Any) -> None:
    """Print JSON alone on stdout, so it can be piped."""
    click.echo(json.dumps(data, indent=2, default=str))


def dump(model: Any) -> Any:
    """A pydantic model as plain JSON data (infinities kept as JSON's Infinity, like bench_serving writes)."""
    return json.loads(model.model_dump_json())


SHORT_WORD = 12  # a number, an id, a flag value: folded, it would read as two values


class _Table(Table):
    """Cells wrap at spaces, and a longer word folds, but a short word (a number, an id) is kept whole: on a
    narrow terminal "1,329.7" would otherwise come out as "1,329." over "7"."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        for column, cell in zip(self.columns, renderables, strict=False):
            if isinstance(cell, str):
                _keep_short_words(column, cell)
        super().add_row(*renderables, **kwargs)


def _keep_short_words(column: Column, text: str) -> None:
    short = [cell_len(word) for word in text.split() if cell_len(word) <= SHORT_WORD]
    column.min_width = max(column.min_width or 0, *short, 0)


def make_table(*columns: str) -> Table:
    """A borderless table whose cells wrap instead of being cut with an ellipsis."""
    t = _Table(box=None)
    for header in columns:
        t.add_column(header, overflow="fold")
        _keep_short_words(t.columns[-1], header)
    return t


def line_table(*columns: str, wide: str) -> Table:
    """A borderless table of one line per row at any width: every cell cut with an ellipsis, the `wide` column
    taking what the others leave (`pivot show`; --verbose gives the wrapping table)."""
    t = _Table(box=None, expand=True)
    for header in columns:
        if header == wide:
            t.add_column(header, no_wrap=True, overflow="ellipsis", ratio=1, min_width=12)
        else:
            t.add_column(header, no_wrap=True, overflow="ellipsis")
    return t


def warn(message: str) -> None:
    from rich.text import Text

    from agent.errors import redact

    err.print(Text.assemble(("warning:", "yellow"), " ", redact(message)))
