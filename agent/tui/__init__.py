"""The terminal UI (`pivot chat`): textual widgets that present, handlers that change state, the agent in workers."""
