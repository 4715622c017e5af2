"""Markdown for the documents: the parser they are checked and rendered with, the checks, and cell formatting."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from markdown_it import MarkdownIt


def markdown() -> MarkdownIt:
    """The parser every document is checked and rendered with: CommonMark, tables on, raw HTML off."""
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def headings(text: str) -> list[tuple[int, str]]:
    """(level, text) of every heading, in order."""
    tokens = markdown().parse(text)
    return [(int(t.tag[1]), tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"]


def tables(text: str) -> list[list[list[str]]]:
    """Every table as rows of cell text, the header row first."""
    out: list[list[list[str]]] = []
    cur: list[list[str]] | None = None
    row: list[str] | None = None
    for t in markdown().parse(text):
        if t.type == "table_open":
            cur = []
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and row is not None:
            row.append(t.content)
        elif t.type == "tr_close" and cur is not None and row is not None:
            cur.append(row)
            row = None
        elif t.type == "table_close" and cur is not None:
            out.append(cur)
            cur = None
    return out


def check_document(text: str, required: Sequence[str]) -> list[str]:
    """Problems with a generated document: one H1 title, the required H2 headings in order, well-formed tables."""
    problems = []
    heads = headings(text)
    if [h for h in heads if h[0] == 1][:1] != heads[:1] or not heads:
        problems.append("the document does not start with one H1 title")
    found = [h for level, h in heads if level == 2]
    at = 0
    for name in required:
        try:
            at = found.index(name, at) + 1
        except ValueError:
            problems.append(f"heading {name!r} is missing or out of order (found: {', '.join(found)})")
    all_tables = tables(text)
    if not all_tables:
        problems.append("no table")
    for i, table in enumerate(all_tables, start=1):
        header = table[0]
        if len(table) < 2:
            problems.append(f"table {i} has no rows")
        if not all(cell.strip() for cell in header):
            problems.append(f"table {i} has an empty header cell")
        for j, row in enumerate(table[1:], start=1):
            if len(row) != len(header):
                problems.append(f"table {i} row {j} has {len(row)} cells, the header {len(header)}")
    return problems


def _tok(v: float | None) -> str:
    return "" if v is None else f"{v:,.0f}"


def _joules(v: float | None) -> str:
    """Joules per output token (every GPU of the server counted)."""
    return "" if v is None else f"{v:,.3f}" if v < 10 else f"{v:,.1f}"


def _ms(v: float | None) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.1f}"


def _change(before: float, after: float) -> float | None:
    return (after - before) / before * 100 if before else None


def _signed(pct: float | None) -> str:
    return "n/a" if pct is None else f"{pct:+.1f}%"


def _cell(text: Any) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip() or "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: Sequence[str] | None = None) -> str:
    """A Markdown table; pipes in cells are escaped, so every row keeps the header's cell count."""
    align = align or ["l"] * len(header)
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "| " + " | ".join(marks[a] for a in align) + " |"]
    for row in rows:
        assert len(row) == len(header), (row, header)
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines)


def _inline_code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


def slug(title: str, limit: int = 48) -> str:
    """A file-name slug of a title: lowercase words joined by dashes, cut at a word boundary."""
    words = re.findall(r"[a-z0-9]+", title.lower().replace("+", "p"))
    out = ""
    for w in words:
        if out and len(out) + 1 + len(w) > limit:
            break
        out = f"{out}-{w}" if out else w
    return out or "item"
