"""bench_serving-compatible output: one JSON line per level with its keys (and ours after them), and reading it back."""

from __future__ import annotations

import json
from pathlib import Path

from agent.errors import PivotError
from agent.models import BenchLevel
from agent.servers import fault_point
from tools.loadgen.stream import _short


def append_jsonl(path: Path, level: BenchLevel) -> None:
    """Append one level as a JSON line with bench_serving's keys (and ours after them), as bench_serving appends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(level.model_dump()) + "\n")
    fault_point("raw-level-written")


def read_jsonl(path: Path) -> list[BenchLevel]:
    """Levels from a JSONL file written by pivot or by bench_serving."""
    levels = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            levels.append(BenchLevel.model_validate(json.loads(line)))
        except ValueError as e:
            raise PivotError(f"{path}:{n}: not a benchmark result line: {_short(str(e), 200)}") from e
    return levels
