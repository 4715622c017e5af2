"""The `pivot` group: the pivot home a command works in, and errors shown as one line and a hint.

Tables and text go to stdout; with --json, stdout carries JSON alone and everything else
(warnings, progress) goes to stderr, so output can be piped.
"""

from __future__ import annotations

import errno
import sqlite3
from functools import cached_property
from typing import Any

import click
from rich.text import Text

from agent import __version__
from agent.console import err
from agent.errors import PivotError, redact
from agent.session import Paths
from agent.store import Store


class Home:
    """The pivot home a command works in, and its ledger, opened on first use."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    @cached_property
    def store(self) -> Store:
        return Store(self.paths.db_path)


class PivotGroup(click.Group):
    """A click group that shows PivotError as a message and a hint, without a traceback, and exits 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PivotError as e:
            _fail(ctx, e)
        except OSError as e:  # a home that cannot be written (read-only, not ours, full): one line and a hint
            if e.errno not in UNWRITABLE_ERRNOS:
                raise
            where = f" {e.filename}" if e.filename else ""
            home = ctx.obj.paths.home if isinstance(ctx.obj, Home) else "its home"
            _fail(ctx, PivotError(
                f"cannot write{where}: {e.strerror or e}",
                hint=f"pivot writes its ledger, logs and documents under its home ({home}): make it writable, or "
                "point --home/PIVOT_HOME at a directory that is",
            ))  # fmt: skip
        except sqlite3.OperationalError as e:
            if "readonly" not in str(e) and "unable to open" not in str(e):
                raise
            home = ctx.obj.paths.home if isinstance(ctx.obj, Home) else "its home"
            _fail(ctx, PivotError(
                f"cannot write the ledger: {e}",
                hint=f"make {home} writable, or point --home/PIVOT_HOME at a directory that is",
            ))  # fmt: skip


UNWRITABLE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def _fail(ctx: click.Context, e: PivotError) -> None:
    err.print(Text.assemble(("error:", "bold red"), " ", redact(e.message)))
    if e.hint:
        err.print(Text.assemble(("hint:", "yellow"), " ", redact(e.hint)))
    ctx.exit(1)


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else ""


@click.group(cls=PivotGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="pivot", message="%(prog)s %(version)s")
@click.option(
    "--home",
    envvar="PIVOT_HOME",
    type=click.Path(file_okay=False),
    help="Where state/ (the ledger, logs) and docs_out/ live. Default: $PIVOT_HOME, else the current directory.",
)
@click.pass_context
def cli(ctx: click.Context, home: str | None) -> None:
    """pivot: an optimization assistant for LLM inference serving."""
    ctx.obj = Home(Paths.from_env(home))


pass_home = click.make_pass_decorator(Home)
