"""`pivot mcp`: serve pivot to MCP clients (Claude Code, Cursor, opencode, ...) over stdio, or HTTP on loopback."""

from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path

import click

from agent.console import err, warn


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("mcp")
@click.option("--http", is_flag=True, help="Serve streamable HTTP instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --http: the address to bind.")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True, help="With --http: the port.")
@click.option("--path", "url_path", default="/mcp", show_default=True, help="With --http: the endpoint's path.")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --http: every request must carry `Authorization: Bearer TOKEN`, TOKEN the file's first line (mode "
    "600). Binding beyond loopback without one generates a token and prints it.",
)
@click.option(
    "--root",
    "roots",
    multiple=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A folder whose plan and profile files clients may name (besides the shipped ones and the home; also "
    "$PIVOT_MCP_ROOTS).",
)
@click.pass_context
def mcp_cmd(ctx: click.Context, http: bool, host: str, port: int, url_path: str, token_file: Path | None,
            roots: tuple[Path, ...]) -> None:  # fmt: skip
    """Serve pivot as an MCP server: its plans, campaigns (to the next pivot, with progress; cancel stops the
    server and leaves the session resumable), sessions, status summaries (as resources), the twin and the audit.

    Over stdio by default (what an MCP client's `command` starts); `--http` serves streamable HTTP on 127.0.0.1,
    with the Host and Origin of every request checked (no DNS rebinding from a web page). Another address is bound
    only when given with --host, and then only with a bearer token (--token-file, or one generated and printed).
    Clients name plan and profile files only under the shipped folders, the home and --root folders.
    """
    from agent.mcp.guard import FileRoots, read_token
    from agent.mcp.server import serve
    from tools.engines.process import install_signal_handlers

    home = ctx.obj
    token = read_token(token_file) if token_file is not None else None
    if http and not _loopback(host) and token is None:
        token = secrets.token_urlsafe(32)
        warn(f"binding {host}:{port}, not loopback: requests need `Authorization: Bearer {token}` (this run's token; "
             "--token-file keeps one)")  # fmt: skip
    install_signal_handlers()  # servers a campaign launched are stopped on SIGTERM and Ctrl-C
    if http:
        auth = ", bearer token required" if token else ""
        err.print(f"pivot MCP server on http://{host}:{port}{url_path} (home {home.paths.home}{auth})", highlight=False)
    serve(home.paths, home.store, http=http, host=host, port=port, path=url_path, token=token,
          roots=FileRoots.default(home.paths.home, roots))  # fmt: skip
