"""Tool plugins: what the agent can do. Each plugin module exports one toolset through `pivot.tools`."""
