"""SVG snapshots of a textual app, compared with tests/snapshots/NAME.svg.

pytest-textual-snapshot (1.1.0, the newest) pins syrupy 4.8.0, which needs pytest < 9: installing it downgrades
pytest 9 to 8.4 and [tool.pytest] would be ignored (tests/conftest.py stops such a run). So pivot keeps this helper,
which does what that plugin's `snap_compare` does: drive the app with Pilot, wait until the screen stops changing,
compare its SVG with the stored one.

To write or rewrite the files: `pytest tests/test_tui_snapshots.py --snapshot-update` (or PIVOT_UPDATE_SNAPSHOTS=1),
then look at the SVGs (a browser shows them) before committing. A missing file is written and the test fails, so a
new snapshot is always looked at. Under CI (CI=true) nothing is ever written: a missing or different snapshot fails.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import Input

from agent.settings import settings

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE_OPTION = "--snapshot-update"
SETTLE_TRIES = 100  # screenshots 0.05 s apart at most
STABLE_FRAMES = 4  # ... until this many in a row are the same as the one before


def screenshot(app: App) -> str:
    """The active screen as SVG, made deterministic: no blinking cursor, a fixed title."""
    for widget in app.screen.query(Input):
        widget.cursor_blink = False
    return app.export_screenshot(title="pivot", simplify=True)


async def settled(pilot: Pilot) -> str:
    """The screen once it has stopped changing (layouts, tables' column widths and flushed logs all done): the app's
    queue drained and the same screenshot STABLE_FRAMES times in a row, so a loaded host that runs a deferred
    refresh late (a table's column widths) still gets the finished screen."""
    await pilot.wait_for_scheduled_animations()
    last, same = screenshot(pilot.app), 0
    for _ in range(SETTLE_TRIES):
        await pilot.pause(0.05)
        await pilot.pause()  # every message the app has queued is handled
        now = screenshot(pilot.app)
        same = same + 1 if now == last and not _tables_pending(pilot.app) else 0
        if same >= STABLE_FRAMES:
            return now
        last = now
    raise AssertionError("the screen kept changing: a snapshot of it would not be stable")


def _tables_pending(app: App) -> bool:
    """Whether a DataTable still owes its column widths (textual recomputes them on its next Idle event: on a loaded
    host that comes late, and a screenshot before it shows the widths of the rows before the last ones)."""
    from textual.widgets import DataTable

    return any(t._require_update_dimensions or t._updated_cells for t in app.screen.query(DataTable))


def updating(config: Any) -> bool:
    """Whether this run rewrites snapshots: asked for (--snapshot-update, PIVOT_UPDATE_SNAPSHOTS) and not in CI."""
    s = settings()
    asked = bool(config.getoption(UPDATE_OPTION)) or s.update_snapshots
    if asked and s.ci:
        raise pytest.UsageError("snapshots are never rewritten in CI (CI is set): rewrite them locally and commit")
    return asked


async def assert_snapshot(pilot: Pilot, name: str, config: Any) -> None:
    svg = await settled(pilot)
    path = SNAPSHOTS / f"{name}.svg"
    update = updating(config)
    if update or not path.exists():
        if settings().ci:
            pytest.fail(f"snapshot {path} is missing, and CI never writes one: write it locally and commit it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(svg, encoding="utf-8")
        if not update:
            pytest.fail(f"snapshot {path} was missing and has been written: look at it, then run again")
        return
    if svg != path.read_text(encoding="utf-8"):
        actual = Path(tempfile.mkdtemp(prefix="pivot-snapshot-")) / f"{name}.svg"
        actual.write_text(svg, encoding="utf-8")
        pytest.fail(f"{name}: the screen differs from {path}; this run's is {actual} ({UPDATE_OPTION} rewrites it)")
