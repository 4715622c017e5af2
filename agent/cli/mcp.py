"""`pivot mcp`: serve pivot to MCP clients (Claude Code, Cursor, opencode, ...) over stdio, or HTTP on loopback."""

from __future__ import annotations

import ipaddress

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
@click.pass_context
def mcp_cmd(ctx: click.Context, http: bool, host: str, port: int, url_path: str) -> None:
    """Serve pivot as an MCP server: its plans, campaigns (to the next pivot, with progress; cancel stops the
    server and leaves the session resumable), sessions, status summaries (as resources), the twin and the audit.

    Over stdio by default (what an MCP client's `command` starts); `--http` serves streamable HTTP on 127.0.0.1.
    Another address is bound only when given with --host: there is no authentication, so anyone who reaches it can
    launch servers on this host.
    """
    from agent.mcp.server import serve
    from tools.engines.process import install_signal_handlers

    home = ctx.obj
    if http and not _loopback(host):
        warn(f"binding {host}:{port}, not loopback: there is no authentication; anyone who reaches it drives pivot")
    install_signal_handlers()  # servers a campaign launched are stopped on SIGTERM and Ctrl-C
    if http:
        err.print(f"pivot MCP server on http://{host}:{port}{url_path} (home {home.paths.home})", highlight=False)
    serve(home.paths, home.store, http=http, host=host, port=port, path=url_path)
