"""SVG snapshots of a textual app without pytest-textual-snapshot (which drags pytest below 9).

`assert_snapshot(app, "name")` compares `app.export_screenshot()` with tests/snapshots/name.svg. To write or
rewrite the files: `PIVOT_UPDATE_SNAPSHOTS=1 pytest tests/test_tui.py`, then look at the SVGs (a browser shows
them) before committing. A missing file is written and the test fails, so a new snapshot is always looked at.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import Input

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE = "PIVOT_UPDATE_SNAPSHOTS"


def screenshot(app: App) -> str:
    """The active screen as SVG, made deterministic: no blinking cursor, a fixed title."""
    for widget in app.screen.query(Input):
        widget.cursor_blink = False
    return app.export_screenshot(title="pivot", simplify=True)


def assert_snapshot(app: App, name: str) -> None:
    svg = screenshot(app)
    path = SNAPSHOTS / f"{name}.svg"
    if os.environ.get(UPDATE) or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(svg, encoding="utf-8")
        if not os.environ.get(UPDATE):
            pytest.fail(f"snapshot {path} was missing and has been written: look at it, then run again")
        return
    if svg != path.read_text(encoding="utf-8"):
        actual = Path(tempfile.mkdtemp(prefix="pivot-snapshot-")) / f"{name}.svg"
        actual.write_text(svg, encoding="utf-8")
        pytest.fail(f"{name}: the screen differs from {path}; this run's is {actual} ({UPDATE}=1 rewrites it)")
