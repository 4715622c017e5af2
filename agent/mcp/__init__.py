"""MCP both ways: `pivot mcp` serves pivot to other agents (server.py), and `--mcp FILE` gives pivot's agent the
tools of the MCP servers a user already runs (config.py reads the common `mcpServers` JSON, client.py connects them
behind the method's guard). Both sides are fastmcp, the library pydantic-ai's MCP client is built on."""
