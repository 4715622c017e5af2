"""`pivot tools`: the tool plugins with their tools, and the engines."""

from __future__ import annotations

import click

from agent import plugins
from agent.cli.base import cli
from agent.console import out, print_json, warn


@cli.command("tools")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def tools_cmd(as_json: bool) -> None:
    """List the tool plugins with their tools, and the engines."""
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
    engine_rows = [
        {
            "engine": name,
            "distribution": engines.infos[name].dist,
            "entry_point": engines.infos[name].value,
            "description": plugins.describe(factory),
        }
        for name, factory in engines.plugins.items()
    ]
    if as_json:
        print_json({"tools": tool_rows, "engines": engine_rows, "failed": [str(f) for f in failures]})
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
