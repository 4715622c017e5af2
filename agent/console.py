"""Terminal output shared by the `pivot` commands: tables and text on stdout, warnings on stderr, JSON alone."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def print_json(data: Any) -> None:
    """Print JSON alone on stdout, so it can be piped."""
    click.echo(json.dumps(data, indent=2, default=str))


def dump(model: Any) -> Any:
    """A pydantic model as plain JSON data (infinities kept as JSON's Infinity, like bench_serving writes)."""
    return json.loads(model.model_dump_json())


def make_table(*columns: str) -> Table:
    """A borderless table whose cells wrap instead of being cut with an ellipsis."""
    t = Table(box=None)
    for column in columns:
        t.add_column(column, overflow="fold")
    return t


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {message}", markup=True)
