"""Charts for status summaries as PNG bytes (matplotlib, Agg backend); tools/reports/html.py writes them beside the HTML.

Each series is one experiment's sweep: concurrency on a log2 axis (labelled as such), one point per level that
completed requests. A reader tells them apart at a glance: every series has its own marker and colour and is
labelled where its line ends (#id), the legend below the plot gives each label whole, the baseline's noise band
is shaded (a change inside it is no change), and a level where requests failed is a gap in its line with a cross
along the bottom of the plot and the words "crashed at": it has no value, so none is drawn (the last value that held
would read as what the crashed level gave).
"""

from __future__ import annotations

import functools
import io
import textwrap
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Series:
    """One experiment's points: concurrency -> value, and how to draw it."""

    label: str
    points: dict[int, float]
    role: str = "tried"  # baseline | best | tried
    extra: dict[str, float] = field(default_factory=dict)
    crashes: dict[int, str] = field(default_factory=dict)  # concurrency -> why requests failed there
    tag: str = ""  # the short label written where the line ends, e.g. "#3"


_STYLE = {
    "baseline": {"color": "#444444", "linestyle": "--", "linewidth": 2.0, "marker": "s", "zorder": 3},
    "best": {"color": "#d62728", "linestyle": "-", "linewidth": 2.6, "marker": "o", "zorder": 4},
    "tried": {"linestyle": "-", "linewidth": 1.3, "alpha": 0.85, "zorder": 2, "markersize": 7},
}

# tab10 without its red and grey, which the best and the baseline use; a marker of its own for each tried series
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
_MARKERS = ("^", "v", "D", "P", "<", ">", "*", "h", "p", "d")  # "X" marks a crash
_LABEL_WIDTH = 95


_DRAWN: OrderedDict[str, bytes] = OrderedDict()
_DRAWN_LOCK = threading.Lock()
CHARTS_KEPT = 64  # PNGs (tens of KB each) a process keeps: a summary rewritten on the same ledger draws nothing again


def _drawn_once(chart: Callable[..., bytes]) -> Callable[..., bytes]:
    """A chart's PNG depends on its arguments alone (their dataclasses' reprs say all of them): one drawn for the
    same arguments before is given again (drawing one takes a tenth of a second or more)."""

    @functools.wraps(chart)
    def drawn(*args: Any, **kwargs: Any) -> bytes:
        key = repr((chart.__name__, args, sorted(kwargs.items())))
        with _DRAWN_LOCK:
            if key in _DRAWN:
                _DRAWN.move_to_end(key)
                return _DRAWN[key]
        png = chart(*args, **kwargs)
        with _DRAWN_LOCK:
            _DRAWN[key] = png
            while len(_DRAWN) > CHARTS_KEPT:
                _DRAWN.popitem(last=False)
        return png

    return drawn


def _figure() -> tuple[Any, Any]:
    """A figure and its axes, drawn by Agg. matplotlib is imported here, when a chart is drawn (not by every command
    that imports the reports), and without pyplot: no global figure registry, so threads cannot share one."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 5.0))
    return fig, fig.subplots()


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _levels_axis(ax, levels: Sequence[int]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(levels)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(c) for c in sorted(levels)])
    ax.set_xlabel("concurrency (max_concurrency; log scale, base 2)")
    ax.grid(True, which="major", alpha=0.3)


def _wrap(label: str) -> str:
    return "\n".join(textwrap.wrap(label, _LABEL_WIDTH, subsequent_indent="    ")) or label


def _legend(fig, ax, note: str) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(
            handles,
            [_wrap(x) for x in labels],
            fontsize=8,
            loc="upper left",
            bbox_to_anchor=(0.0, -0.16),
            frameon=False,
            ncol=1,
        )
    if note:
        ax.set_title(note, loc="right", fontsize=8, color="#666666")


@_drawn_once
def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    ylabel: str,
    note: str = "",
    band: tuple[dict[int, float], float] | None = None,
) -> bytes:
    """Value against concurrency, one line per experiment; the baseline dashed, the best thick and red.

    `band`: (the baseline's points, the noise band in %): shaded as baseline x (1 +- band), the range a change must
    leave to count. Levels in a series' `crashes` are gaps: a cross on the concurrency axis, never a value."""
    return _png(line_figure(series, title=title, ylabel=ylabel, note=note, band=band))


def line_figure(
    series: Sequence[Series],
    *,
    title: str,
    ylabel: str,
    note: str = "",
    band: tuple[dict[int, float], float] | None = None,
):
    """The figure `line_chart` renders (tests read it)."""
    fig, ax = _figure()
    levels: set[int] = set()
    top = 0.0
    if band is not None and band[0]:
        base, pct = band
        xs = sorted(base)
        lo = [base[x] * (1 - pct / 100) for x in xs]
        hi = [base[x] * (1 + pct / 100) for x in xs]
        ax.fill_between(xs, lo, hi, color="#888888", alpha=0.3, linewidth=0, zorder=1,
                        label=f"noise band around the baseline: +-{pct:.1f}% (a change inside it is no change)")  # fmt: skip
        levels.update(xs)
        top = max(top, *hi)
    tried = 0
    crashed_rows = 0  # one row of crosses per crashed series, along the bottom of the plot
    tags: list[tuple[float, float, str, str]] = []
    for s in sorted(series, key=lambda s: {"best": 0, "baseline": 1, "tried": 2}[s.role]):
        if not s.points and not s.crashes:
            continue
        xs = sorted(s.points)
        levels.update(xs)
        levels.update(s.crashes)
        style = dict(_STYLE[s.role])
        if s.role == "tried":
            style["color"] = _PALETTE[tried % len(_PALETTE)]
            style["marker"] = _MARKERS[tried % len(_MARKERS)]
            tried += 1
        ys = [s.points[x] for x in xs]
        if xs:
            ax.plot(xs, ys, label=s.label, **style)
            top = max(top, *ys)
            if s.tag and not s.crashes:
                tags.append((xs[-1], ys[-1], s.tag, style["color"]))
        if s.crashes:  # a gap in the line and a cross on the axis: a crashed level has no value to draw
            failed = sorted(s.crashes)
            row = 0.035 + 0.06 * crashed_rows
            crashed_rows += 1
            on_axis = ax.get_xaxis_transform()  # x in data, y in axes fractions: the cross sits on no value
            ax.plot(failed, [row] * len(failed), transform=on_axis, marker="X", markersize=12, color=style["color"],
                    markeredgecolor="black", zorder=6, linestyle="none", clip_on=False)  # fmt: skip
            why = sorted(set(s.crashes.values()))
            words = f"{s.tag + ' ' if s.tag else ''}crashed at {', '.join(map(str, failed))}"
            ax.annotate(words + (f" ({', '.join(why)})" if why else ""), (failed[0], row), xycoords=on_axis,
                        xytext=(-10, 0), textcoords="offset points", fontsize=8, color="#b00000", ha="right",
                        va="center", zorder=7,
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85})  # fmt: skip
    if levels:
        _levels_axis(ax, sorted(levels))
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_ylim(bottom=0, top=max(top * 1.1, 1.0))
    _place_tags(fig, ax, tags)
    _legend(fig, ax, note)
    return fig


def _place_tags(fig, ax, tags: list[tuple[float, float, str, str]]) -> None:
    """Write each series' tag right of its last point, moved apart vertically so that none covers another."""
    if not tags:
        return
    to_px = ax.transData.transform  # valid before drawing: the axes' place and limits are set
    placed: list[tuple[float, float, str, str, float]] = []
    gap = 11.0  # pixels between two tags at the same level
    for x, y, text, color in sorted(tags, key=lambda t: (t[0], t[1])):
        px, py = to_px((x, y))
        shift = 0.0
        for qx, qy, *_ in placed:
            if abs(qx - px) < 30 and abs((py + shift) - qy) < gap:
                shift = qy + gap - py
        placed.append((px, py + shift, text, color, shift))
        points = shift * 72.0 / fig.dpi
        ax.annotate(text, (x, y), xytext=(6, points), textcoords="offset points", fontsize=8, color=color,
                    va="center", fontweight="bold")  # fmt: skip


@_drawn_once
def power_chart(series: Sequence[Series], *, title: str, limit_w: float | None, note: str = "") -> bytes:
    """Mean power per GPU at each level, grouped bars per experiment, with the power limit as a line."""
    fig, ax = _figure()
    shown = [s for s in series if s.points]
    levels = sorted({c for s in shown for c in s.points})
    width = 0.8 / max(len(shown), 1)
    for i, s in enumerate(shown):
        color = {"baseline": "#444444", "best": "#d62728"}.get(s.role, _PALETTE[i % len(_PALETTE)])
        hatch = {"baseline": "//"}.get(s.role)
        xs = [levels.index(c) + (i - (len(shown) - 1) / 2) * width for c in levels if c in s.points]
        bars = ax.bar(xs, [s.points[c] for c in levels if c in s.points], width=width * 0.95, label=s.label,
                      color=color, hatch=hatch, edgecolor="white")  # fmt: skip
        ax.bar_label(bars, labels=[f"{s.points[c]:,.0f} W" for c in levels if c in s.points], fontsize=7, padding=2)
    if limit_w:
        ax.axhline(limit_w, color="#1f77b4", linestyle=":", linewidth=1.5, label=f"power limit {limit_w:,.0f} W")
    ax.set_xticks(range(len(levels)))
    ax.set_xticklabels([str(c) for c in levels])
    ax.set_xlabel("concurrency (max_concurrency; one group of bars per level)")
    ax.set_ylabel("mean power per GPU (W)")
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_ylim(0, max(limit_w or 0, *(v for s in shown for v in s.points.values()), 1) * 1.12)
    ax.grid(True, axis="y", alpha=0.3)
    _legend(fig, ax, note)
    return _png(fig)


@dataclass
class EnergyPoint:
    """One experiment on the energy chart: its output tok/s and joules per output token at one level."""

    label: str
    tok_s: float
    j_per_tok: float
    role: str = "tried"  # baseline | best | tried
    tag: str = ""


def pareto_front(points: Sequence[EnergyPoint]) -> list[EnergyPoint]:
    """The points no other beats on both counts (more tok/s and fewer J per token), by falling J per token."""
    front = [
        p
        for p in points
        if not any(
            q is not p
            and q.tok_s >= p.tok_s
            and q.j_per_tok <= p.j_per_tok
            and (q.tok_s, q.j_per_tok) != (p.tok_s, p.j_per_tok)
            for q in points
        )
    ]
    return sorted(front, key=lambda p: (p.j_per_tok, -p.tok_s))


@_drawn_once
def energy_chart(points: Sequence[EnergyPoint], *, title: str, level_note: str, note: str = "") -> bytes:
    """Experiments on output tok/s against joules per output token, the Pareto front drawn through the ones no other
    beats on both (up and to the left is better)."""
    return _png(energy_figure(points, title=title, level_note=level_note, note=note))


def energy_figure(points: Sequence[EnergyPoint], *, title: str, level_note: str, note: str = ""):
    """The figure `energy_chart` renders (tests read it)."""
    fig, ax = _figure()
    front = pareto_front(points)
    if len(front) >= 2:
        ax.plot([p.j_per_tok for p in front], [p.tok_s for p in front], color="#2ca02c", linestyle="--",
                linewidth=1.4, zorder=1, label="Pareto front: no other configuration has more tok/s for fewer J")  # fmt: skip
    tried = 0
    for p in points:
        style = {"baseline": ("#444444", "s"), "best": ("#d62728", "o")}.get(p.role)
        if style is None:
            style = (_PALETTE[tried % len(_PALETTE)], _MARKERS[tried % len(_MARKERS)])
            tried += 1
        on_front = any(p is q for q in front)
        ax.scatter([p.j_per_tok], [p.tok_s], color=style[0], marker=style[1], s=70 if on_front else 45,
                   edgecolors="black" if on_front else "none", zorder=3, label=p.label)  # fmt: skip
        if p.tag:
            ax.annotate(p.tag, (p.j_per_tok, p.tok_s), xytext=(6, 4), textcoords="offset points", fontsize=8,
                        color=style[0], fontweight="bold")  # fmt: skip
    ax.set_xlabel(f"joules per output token, all GPUs ({level_note}; lower is better)")
    ax.set_ylabel(f"output tok/s ({level_note})")
    ax.set_title(title + " (up and to the left is better)", fontsize=11, loc="left")
    if points:  # the axes span the points (not from 0), so that close configurations stay apart
        xs, ys = [p.j_per_tok for p in points], [p.tok_s for p in points]
        pad_x, pad_y = (max(xs) - min(xs)) * 0.15 or max(xs) * 0.05, (max(ys) - min(ys)) * 0.15 or max(ys) * 0.05
        ax.set_xlim(max(min(xs) - pad_x, 0), max(xs) + pad_x)
        ax.set_ylim(max(min(ys) - pad_y, 0), max(ys) + pad_y)
    ax.grid(True, alpha=0.3)
    _legend(fig, ax, note)
    return fig


@_drawn_once
def attainment_chart(
    series: Sequence[Series], *, title: str, target: float, xlabel: str, note: str = "", log_x: bool = True
) -> bytes:
    """SLO attainment (0-100%) against load, one line per experiment, the target as a horizontal line; `extra` of a
    series may hold "capacity" (the load it reached), drawn as a dotted drop line."""
    return _png(attainment_figure(series, title=title, target=target, xlabel=xlabel, note=note, log_x=log_x))


def attainment_figure(
    series: Sequence[Series], *, title: str, target: float, xlabel: str, note: str = "", log_x: bool = True
):
    """The figure `attainment_chart` renders (tests read it)."""
    fig, ax = _figure()
    ax.axhline(target * 100, color="#1f77b4", linestyle=":", linewidth=1.6, zorder=1,
               label=f"target: {target * 100:g}% of requests meet every SLO")  # fmt: skip
    tried = 0
    for s in sorted(series, key=lambda s: {"best": 0, "baseline": 1, "tried": 2}[s.role]):
        if not s.points:
            continue
        style = dict(_STYLE[s.role])
        if s.role == "tried":
            style["color"] = _PALETTE[tried % len(_PALETTE)]
            style["marker"] = _MARKERS[tried % len(_MARKERS)]
            tried += 1
        xs = sorted(s.points)
        ax.plot(xs, [s.points[x] * 100 for x in xs], label=s.label, **style)
        capacity = s.extra.get("capacity")
        if capacity is not None:
            ax.axvline(capacity, color=style["color"], linestyle=":", linewidth=1.0, alpha=0.8, zorder=1)
        if s.tag:
            ax.annotate(s.tag, (xs[-1], s.points[xs[-1]] * 100), xytext=(6, 0), textcoords="offset points",
                        fontsize=8, color=style["color"], va="center", fontweight="bold")  # fmt: skip
    if log_x:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_xlabel(xlabel + (" (log scale, base 2)" if log_x else ""))
    ax.set_ylabel("SLO attainment (% of requests sent)")
    ax.set_ylim(0, 105)
    ax.set_title(title, fontsize=11, loc="left")
    ax.grid(True, alpha=0.3)
    _legend(fig, ax, note)
    return fig
