"""The TUI's widgets, one per module with its CSS. They present what they are given and post messages; they hold no
session and run nothing."""

from agent.tui.widgets.chat_log import ChatLog
from agent.tui.widgets.pivot_panel import PivotPanel
from agent.tui.widgets.side_panel import SidePanel
from agent.tui.widgets.status_line import StatusLine
from agent.tui.widgets.tool_line import ToolLine

__all__ = ["ChatLog", "PivotPanel", "SidePanel", "StatusLine", "ToolLine"]
