"""`pivot tools`: the tool plugins with their tools, and the engines."""

from __future__ import annotations

import click
from rich.markup import escape

from agent import plugins
from agent.cli.base import cli
from agent.console import out, print_json, warn


def _options(factory: object) -> list[dict[str, object]]:
    """The options an engine declares (its Options model): name, type, default and what it is."""
    from agent.contracts import declared_options

    model = declared_options(factory)
    if model is None:
        return []
    return [
        {"name": name, "type": str(f.annotation), "default": repr(f.get_default(call_default_factory=True)),
         "description": f.description or ""}
        for name, f in model.model_fields.items()
    ]  # fmt: skip


@cli.command("tools")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option(
    "--mcp",
    "mcp",
    metavar="FILE",
    help="Also start the servers of this `mcpServers` JSON file, one at a time, and list their tools as the agent "
    "would get them (prefixed by server name).",
)
def tools_cmd(as_json: bool, mcp: str | None) -> None:
    """List the tool plugins with their tools, and the engines (and with --mcp, the MCP servers' tools)."""
    failures: list[plugins.PluginFailure] = []
    toolsets = plugins.load_all(plugins.TOOLS_GROUP, on_failure=failures.append)
    engines = plugins.load_all(plugins.ENGINES_GROUP, on_failure=failures.append)
    for failure in failures:
        warn(str(failure))
    tool_rows = [
        {
            "plugin": name,
            "distribution": toolsets.infos[name].dist,
            "entry_point": toolsets.infos[name].value,
            "tools": [{"name": n, "description": d} for n, d in plugins.describe_tools(ts)],
        }
        for name, ts in toolsets.plugins.items()
    ]
    from agent import investigate

    tool_rows.append(  # added to every session's runs (agent/session_tools.py), not an entry point
        {
            "plugin": "investigate",
            "distribution": None,
            "entry_point": "agent.investigate:toolset (built in)",
            "tools": [{"name": n, "description": d} for n, d in plugins.describe_tools(investigate.toolset)],
        }
    )
    engine_rows = [
        {
            "engine": name,
            "distribution": engines.infos[name].dist,
            "entry_point": engines.infos[name].value,
            "description": plugins.describe(factory),
            "options": _options(factory),
        }
        for name, factory in engines.plugins.items()
    ]
    servers = _mcp_rows(mcp, list(toolsets.plugins.values())) if mcp else None
    if as_json:
        shown = {"tools": tool_rows, "engines": engine_rows, "failed": [str(f) for f in failures]}
        if servers is not None:
            shown["mcp"] = [s.model_dump() for s in servers]
        print_json(shown)
        return
    out.print("[bold]Tool plugins[/]", markup=True)
    if not tool_rows:
        out.print("  (none)")
    for row in tool_rows:
        out.print(f"  {row['plugin']}  [dim]({row['distribution'] or 'no distribution'})[/]", markup=True)
        for tool in row["tools"]:
            out.print(f"    {tool['name']:<24} {tool['description']}")
    out.print("\n[bold]Engines[/]", markup=True)
    if not engine_rows:
        out.print("  (none installed)")
    for row in engine_rows:
        out.print(f"  {row['engine']:<12} {row['description']}  [dim]({row['distribution']})[/]", markup=True)
        if row["options"]:
            out.print("    -o " + ", ".join(o["name"] for o in row["options"]), style="dim")
    if servers is not None:
        _print_mcp(servers)


def _mcp_rows(path: str, own: list) -> list:
    from agent.mcp.client import list_servers
    from agent.session_tools import own_tool_names

    rows = list_servers(path, own_tool_names(own))
    for row in rows:
        if row.error:
            warn(f"MCP server {row.server!r}: {row.error}")
        for name in row.left_out:
            warn(f"MCP server {row.server!r}: {name} is named like one of pivot's own tools and is left out")
    return rows


def _print_mcp(rows: list) -> None:
    out.print("\n[bold]MCP servers[/]", markup=True)
    if not rows:
        out.print("  (none enabled)")
    for row in rows:
        state = f"[red]{escape(row.error)}[/]" if row.error else f"{len(row.tools)} tools"
        out.print(f"  {escape(row.server)}  [dim]({escape(row.where)})[/]  {state}", markup=True, highlight=False)
        for tool in row.tools:
            out.print(f"    {tool.name:<24} {tool.description}", highlight=False)
