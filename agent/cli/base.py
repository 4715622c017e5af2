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
from pydantic import ValidationError
from rich.text import Text

from agent import __version__
from agent.console import err
from agent.errors import Interrupted, PivotError, redact
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
    """A click group that shows PivotError as a message and a hint, without a traceback, and exits 1; a bad option
    value or a usage mistake as one line too (exit 2), and Ctrl-C as `interrupted` (exit 130)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PivotError as e:
            _fail(ctx, e, code=EXIT_INTERRUPTED if isinstance(e, Interrupted) else 1)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "pivot"
            _fail(ctx, PivotError(e.format_message(), hint=f"`{where} --help` lists the options"), code=e.exit_code)
        except ValidationError as e:  # a value that reached a model unchecked: still one line, naming it
            _fail(ctx, PivotError(f"invalid value: {validation_text(e)}", hint=f"`{ctx.command_path} --help`"))
        except (KeyboardInterrupt, click.Abort):  # a command that knows a session to resume raises Interrupted
            _fail(ctx, Interrupted("interrupted"), code=EXIT_INTERRUPTED)
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
EXIT_INTERRUPTED = 130  # what a shell reports for a process stopped by SIGINT


def validation_text(e: ValidationError) -> str:
    """A pydantic error in one line: each problem's field and message."""
    return "; ".join(
        (f"{'.'.join(map(str, x['loc']))}: " if x["loc"] else "") + x["msg"].removeprefix("Value error, ")
        for x in e.errors(include_url=False)
    )


def _fail(ctx: click.Context, e: PivotError, code: int = 1) -> None:
    err.print(Text.assemble(("error:", "bold red"), " ", redact(e.message)))
    if e.hint:
        err.print(Text.assemble(("hint:", "yellow"), " ", redact(e.hint)))
    ctx.exit(code)


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else ""


HOME_HELP = "Where state/ (the ledger, logs) and docs_out/ live. Default: $PIVOT_HOME, else the current directory."


@click.group(cls=PivotGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="pivot", message="%(prog)s %(version)s")
@click.option("--home", envvar="PIVOT_HOME", type=click.Path(file_okay=False), help=HOME_HELP)
@click.pass_context
def cli(ctx: click.Context, home: str | None) -> None:
    """pivot: an optimization assistant for LLM inference serving.

    \b
    Start here:
      pivot demo                      the seeds' campaign on the digital twin, no GPU
      pivot resume SESSION --answer 1 answer its pivot and go on
      pivot show SESSION              where a session stands, one line per experiment
      pivot chat                      the terminal UI

    \b
    Exit codes: 0 the command did what was asked (a campaign stopped at a pivot
    included: --detailed-exitcode makes that 3), 1 an error (a refused answer
    included), 2 a usage error, 130 interrupted (Ctrl-C).
    Shell completion: eval "$(_PIVOT_COMPLETE=bash_source pivot)" (zsh_source, fish_source).
    """
    ctx.obj = Home(Paths.from_env(home))


def _set_home(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """`--home DIR` given after the subcommand: the same home as before it (the later one wins)."""
    if value is None:
        return
    home = Home(Paths.from_env(value))
    node: click.Context | None = ctx
    while node is not None:  # every context up to the root, so ctx.obj and find_root().obj agree
        node.obj = home
        node = node.parent


def add_home_option(command: click.Command) -> None:
    """Give `command` (and every subcommand of a group) the `--home` option, so it works after the subcommand as
    well as before it (`pivot sessions --home DIR` as `pivot --home DIR sessions`)."""
    if not any("--home" in p.opts for p in command.params):
        command.params.append(
            click.Option(
                ["--home"],
                type=click.Path(file_okay=False),
                expose_value=False,
                is_eager=True,
                callback=_set_home,
                help=HOME_HELP,
            )
        )
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_home_option(sub)


pass_home = click.make_pass_decorator(Home)
