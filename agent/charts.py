"""Charts for status summaries as PNG bytes (matplotlib, Agg backend); agent/reports.py writes them beside the HTML.

Each series is one experiment's sweep: concurrency on a log2 axis, one point per level that completed requests.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.ticker import FixedLocator, NullLocator


@dataclass
class Series:
    """One experiment's points: concurrency -> value, and how to draw it."""

    label: str
    points: dict[int, float]
    role: str = "tried"  # baseline | best | tried
    extra: dict[str, float] = field(default_factory=dict)


_STYLE = {
    "baseline": {"color": "#444444", "linestyle": "--", "linewidth": 2.0, "marker": "s", "zorder": 3},
    "best": {"color": "#d62728", "linestyle": "-", "linewidth": 2.6, "marker": "o", "zorder": 4},
    "tried": {"linestyle": "-", "linewidth": 1.1, "marker": ".", "alpha": 0.75, "zorder": 2},
}


# tab10 without its red and grey, which the best and the baseline use
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _levels_axis(ax, levels: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(levels)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(c) for c in sorted(levels)])
    ax.set_xlabel("concurrency (max_concurrency)")
    ax.grid(True, which="major", alpha=0.3)


def line_chart(series: Sequence[Series], *, title: str, ylabel: str, note: str = "") -> bytes:
    """Value against concurrency, one line per experiment; the baseline dashed, the best thick and red."""
    fig, ax = plt.subplots(figsize=(8.2, 4.6))
    levels: set[int] = set()
    tried = 0
    for s in sorted(series, key=lambda s: {"best": 0, "baseline": 1, "tried": 2}[s.role]):
        if not s.points:
            continue
        xs = sorted(s.points)
        levels.update(xs)
        style = dict(_STYLE[s.role])
        if s.role == "tried":
            style["color"] = _PALETTE[tried % len(_PALETTE)]
            tried += 1
        ax.plot(xs, [s.points[x] for x in xs], label=s.label, **style)
    if levels:
        _levels_axis(ax, sorted(levels))
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.set_ylim(bottom=0)
    if note:
        fig.text(0.01, -0.02, note, fontsize=8, color="#666666")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return _png(fig)


def power_chart(series: Sequence[Series], *, title: str, limit_w: float | None, note: str = "") -> bytes:
    """Mean power per GPU at each level, grouped bars per experiment, with the power limit as a line."""
    fig, ax = plt.subplots(figsize=(8.2, 4.6))
    shown = [s for s in series if s.points]
    levels = sorted({c for s in shown for c in s.points})
    width = 0.8 / max(len(shown), 1)
    for i, s in enumerate(shown):
        color = {"baseline": "#444444", "best": "#d62728"}.get(s.role, _PALETTE[i % len(_PALETTE)])
        xs = [levels.index(c) + (i - (len(shown) - 1) / 2) * width for c in levels if c in s.points]
        ax.bar(xs, [s.points[c] for c in levels if c in s.points], width=width * 0.95, label=s.label, color=color)
    if limit_w:
        ax.axhline(limit_w, color="#1f77b4", linestyle=":", linewidth=1.5, label=f"power limit {limit_w:,.0f} W")
    ax.set_xticks(range(len(levels)))
    ax.set_xticklabels([str(c) for c in levels])
    ax.set_xlabel("concurrency (max_concurrency)")
    ax.set_ylabel("mean power per GPU (W)")
    ax.set_title(title, fontsize=11)
    ax.set_ylim(0, max(limit_w or 0, *(v for s in shown for v in s.points.values()), 1) * 1.1)
    ax.grid(True, axis="y", alpha=0.3)
    if note:
        fig.text(0.01, -0.02, note, fontsize=8, color="#666666")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return _png(fig)
