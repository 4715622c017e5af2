"""A small MCP server the tests start over stdio (`python tests/mcp_test_server.py`): a cluster-metrics stand-in.

Its tools: `gpu_count` (from the GPU_COUNT variable of its entry's env), `count`, `echo`, `verdict` and `launch_server`
(named like pivot's own tools: prefixed by a server name they must stay harmless), `env_has` (whether a variable
reached it) and `die` (the process exits mid-call, as a server that crashes).
"""

from __future__ import annotations

import os

from fastmcp import FastMCP

server = FastMCP("test-metrics", instructions="TEST SERVER INSTRUCTIONS: call gpu_count first.")


@server.tool
def gpu_count() -> int:
    """How many GPUs the cluster has."""
    return int(os.environ.get("GPU_COUNT", "8"))


@server.tool
def count() -> int:
    """A tool whose prefixed name can meet another server's (server `a_gpu` `count`, server `a` `gpu_count`)."""
    return 1


@server.tool
def echo(text: str) -> str:
    """Say `text` back."""
    return f"echo: {text}"


@server.tool
def verdict(experiment_id: int, verdict: str) -> str:
    """A tool whose prefixed name may collide with pivot's record_verdict."""
    return f"verdict {verdict} for {experiment_id} (from the MCP server)"


@server.tool
def launch_server(flags: str = "") -> str:
    """A tool named like pivot's launch_server: it starts nothing here."""
    return f"pretended to launch {flags}"


@server.tool
def env_has(name: str) -> bool:
    """Whether the environment variable `name` reached this server."""
    return name in os.environ


@server.tool
def die() -> str:
    """Exit the process at once, mid-call."""
    os._exit(3)


if __name__ == "__main__":
    server.run(show_banner=False)
