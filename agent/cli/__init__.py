"""The `pivot` command: sessions, plans and plugins from the terminal.

Tables and text go to stdout; with --json, stdout carries JSON alone and everything else
(warnings, progress) goes to stderr, so output can be piped.

The group and the pivot home are in `base.py`; each command group has a module of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from agent.cli import plans, sessions, tools  # noqa: F401  (their commands register on the group)
from agent.cli.base import Home, PivotGroup, add_home_option, cli, pass_home
from agent.cli.bench import bench
from agent.cli.calibrate import calibrate_cmd
from agent.cli.chat import chat
from agent.cli.engine_tools import audit_flags_cmd, power, profile
from agent.cli.engines import launch_bench, serve, servers
from agent.cli.mcp import mcp_cmd
from agent.cli.microbench import microbench
from agent.cli.reports import analyze, docs, import_cmd, summary
from agent.cli.run import demo, resume, run_cmd
from agent.cli.sim import sim

__all__ = ["Home", "PivotGroup", "cli", "main", "pass_home"]

for command in (
    sim, bench, serve, launch_bench, servers, audit_flags_cmd, power, profile, summary, docs, analyze, import_cmd,
    microbench, demo, run_cmd, resume, chat, mcp_cmd, calibrate_cmd,
):  # fmt: skip
    cli.add_command(command)
for command in cli.commands.values():
    add_home_option(command)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    runner: Callable[..., Any] = cli
    runner(args=argv if argv is not None else sys.argv[1:], prog_name="pivot")
