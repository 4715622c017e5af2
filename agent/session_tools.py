"""The toolsets one session's runs add to the plugins': the `investigate` tool and the session's MCP servers
(`--mcp FILE`); agent/loop.py puts each behind the method's guard, like every toolset of the agent."""

from __future__ import annotations

from typing import Any

from agent import plugins
from agent.session import Session
from tools.method.guard import GUARDED_TOOLS


def own_tool_names(toolsets: list[Any]) -> set[str]:
    """The names of pivot's own tools (the plugins' and `investigate`), which no MCP server's tool may take."""
    from agent import investigate

    names = set(GUARDED_TOOLS) | set(investigate.toolset.tools)
    for toolset in toolsets:
        names.update(name for name, _ in plugins.describe_tools(toolset))
    return names


def session_toolsets(session: Session, own: list[Any]) -> list[Any]:
    """The investigation tool, then one toolset per MCP server of the session (none without --mcp)."""
    from agent import investigate
    from agent.mcp.client import mcp_toolsets

    return [investigate.toolset, *mcp_toolsets(session, own_tool_names(own))]
