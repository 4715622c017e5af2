"""The TUI's screens besides the main one, one per module with its CSS: the picker and the summary viewer."""

from agent.tui.screens.picker import DEMO_KEY, Choice, PickerScreen
from agent.tui.screens.summary import SummaryScreen

__all__ = ["DEMO_KEY", "Choice", "PickerScreen", "SummaryScreen"]
