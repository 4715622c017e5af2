"""A status summary as HTML (markdown-it-py, tables on) with its charts (matplotlib PNGs under charts/)."""

from __future__ import annotations

from typing import Any

from agent import models as m
from agent.errors import PivotError
from tools.reports.common import VERDICT_WORDS, SessionLike
from tools.reports.ledger import Ledger
from tools.reports.text import markdown
from tools.reports.writing import _atomic_write, _write


def write_status_html(
    session: SessionLike,
    number: int,
    *,
    ledger: Ledger | None = None,
    markdown_text: str | None = None,
    known: dict[str, m.Document] | None = None,
) -> m.Document:
    """Render status summary `number` as HTML with its charts (PNG files under charts/)."""
    from tools.reports import charts

    ledger = ledger or Ledger.read(session.store, session.id)
    folder = session.paths.docs_dir(session.id)
    if markdown_text is None:
        md_path = folder / f"status-{number:03d}.md"
        if not md_path.exists():
            raise PivotError(f"no status summary {md_path}")
        markdown_text = md_path.read_text(encoding="utf-8")
    known = known if known is not None else {d.path: d for d in ledger.documents}
    chart_dir = folder / "charts"
    chart_dir.mkdir(parents=True, exist_ok=True)
    figures = []
    for name, caption, data in _charts(ledger, charts):
        path = chart_dir / f"status-{number:03d}-{name}.png"
        if not (path.exists() and path.read_bytes() == data):
            _atomic_write(path, data)
        figures.append((f"charts/{path.name}", caption))
    body = markdown().render(markdown_text)
    fig_html = "".join(
        f'<figure><img src="{src}" alt="{caption}"><figcaption>{caption}</figcaption></figure>\n'
        for src, caption in figures
    )
    title = f"Status {number:03d}: {ledger.plan.title}"
    page = (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n{body}"
        + (f"<h2>Charts</h2>\n{fig_html}" if figures else "")
        + "</body>\n</html>\n"
    )
    doc = m.Document(
        session_id=session.id,
        kind="status",
        number=number,
        title=f"Status {number:03d} (HTML)",
        path="",
        status="HTML rendering",
        sha256="",
        experiment_ids=[],
    )
    return _write(session, folder / f"status-{number:03d}.html", page, doc, known)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;line-height:1.45}"
    "table{border-collapse:collapse;margin:0.5rem 0 1rem}th,td{border:1px solid #ccc;padding:0.25rem 0.5rem;"
    "vertical-align:top}th{background:#f3f3f3}code,pre{background:#f6f6f6}figure{margin:1rem 0}"
    "img{max-width:100%}figcaption{color:#555;font-size:0.9rem}"
)


def _charts(ledger: Ledger, charts: Any) -> list[tuple[str, str, bytes]]:
    """(file stem, caption, PNG) of the summary's charts."""
    key = ledger.workload_key()

    def crashes(e: m.Experiment) -> dict[int, str]:
        failed = [c for c, lv in ledger.levels.get(e.id or 0, {}).items() if lv.failed > 0]
        return {c: e.failure or "requests failed" for c in failed}

    exps = [
        e
        for e in ledger.experiments
        if (ledger.ok_levels(e) or crashes(e)) and e.workload.workload_key() == key and e.verdict != "not_measured"
    ]
    if not exps:
        return []
    baseline = ledger.baseline()
    best_map = ledger.best_by_level()
    best_id = best_map[max(best_map)][0].id if best_map else None

    def role(e: m.Experiment) -> str:
        if e.id == best_id:
            return "best"
        if baseline is not None and e.id == baseline.id:
            return "baseline"
        return "tried"

    def label(e: m.Experiment) -> str:
        is_base = baseline is not None and e.id == baseline.id
        words = {"best": "baseline, best" if is_base else "best", "baseline": "baseline"}.get(
            role(e), e.plan_item or e.kind
        )
        change = ledger.change_text(e).removeprefix("base flags: ")
        verdict = f" ({VERDICT_WORDS[e.verdict]})" if e.verdict not in (None, "baseline") else ""
        return f"#{e.number} {words}: {change}{verdict}"

    simulated = any(ledger.sources.get(e.id or 0) == "simulated" for e in exps)
    note = "simulated by pivot's digital twin" if simulated else ""
    out = []

    def series_of(metric: str) -> list[Any]:
        return [
            charts.Series(
                label(e),
                {c: getattr(lv, metric) for c, lv in ledger.ok_levels(e).items()},
                role(e),
                crashes=crashes(e),
                tag=f"#{e.number}",
            )
            for e in exps
        ]

    band_pct = ledger.band_pct()
    base_points = (
        {c: lv.output_throughput for c, lv in ledger.ok_levels(baseline).items()} if baseline is not None else {}
    )
    out.append(
        (
            "throughput",
            "Output tok/s against concurrency: baseline, best and every configuration tried, the baseline's noise "
            f"band shaded (+-{band_pct:.1f}%), crashes marked.",
            charts.line_chart(
                series_of("output_throughput"),
                title="Output tok/s (mean of each experiment's runs)",
                ylabel="output tok/s",
                note=note,
                band=(base_points, band_pct) if base_points else None,
            ),
        )
    )
    out.append(
        (
            "tpot",
            "Mean TPOT against concurrency, same configurations (lower is better).",
            charts.line_chart(
                series_of("mean_tpot_ms"), title="Mean TPOT (ms, lower is better)", ylabel="mean TPOT (ms)", note=note
            ),
        )
    )
    out += _power_chart(ledger, charts, exps, role, label, note)
    out += _energy_chart(ledger, charts, exps, role, label, note)
    out += _attainment_chart(ledger, charts, exps, role, label, note)
    return out


def _power_chart(ledger: Ledger, charts: Any, exps: list[m.Experiment], role: Any, label: Any,
                 note: str) -> list[tuple[str, str, bytes]]:  # fmt: skip
    """Mean power per GPU at each level of the baseline and the best, against the power limit."""
    limit = None
    power_series = []
    for e in [e for e in exps if role(e) in ("baseline", "best")]:
        points = {}
        for c in ledger.ok_levels(e):
            w, lim = ledger.power_w(e, c)
            if w is not None:
                points[c] = w
                limit = limit or lim
        if points:
            power_series.append(charts.Series(label(e), points, role(e), tag=f"#{e.number}"))
    if not power_series:
        return []
    return [
        (
            "power",
            "Mean power per GPU at each level (baseline and best) against the power limit.",
            charts.power_chart(power_series, title="Power per GPU", limit_w=limit, note=note),
        )
    ]


def _energy_chart(ledger: Ledger, charts: Any, exps: list[m.Experiment], role: Any, label: Any,
                  note: str) -> list[tuple[str, str, bytes]]:  # fmt: skip
    """Experiments on output tok/s against J per output token at the highest level they all completed, with the
    Pareto front (empty with fewer than two experiments that have both)."""
    common = set.intersection(*(set(ledger.ok_levels(e)) for e in exps)) if exps else set()
    if not common:
        return []
    c = max(common)
    points = []
    for e in exps:
        joules = ledger.energy(e, c)[1]
        if joules:
            tok_s = ledger.ok_levels(e)[c].output_throughput
            points.append(charts.EnergyPoint(label(e), tok_s, joules, role(e), tag=f"#{e.number}"))
    if len(points) < 2:
        return []
    front = ", ".join(p.tag for p in charts.pareto_front(points))
    return [
        (
            "energy",
            f"Output tok/s against joules per output token at concurrency {c} (the highest level every configuration "
            f"completed), every configuration tried; the Pareto front ({front}) are those no other beats on both.",
            charts.energy_chart(
                points, title="Throughput against energy per token", level_note=f"concurrency {c}", note=note
            ),
        )
    ]


def _attainment_chart(ledger: Ledger, charts: Any, exps: list[m.Experiment], role: Any, label: Any,
                      note: str) -> list[tuple[str, str, bytes]]:  # fmt: skip
    """SLO attainment against load per experiment with the target line: a capacity search's points where one ran,
    else the workload's levels judged by SLOs (empty when no level was)."""
    series, target, axis, slos = [], ledger.plan.objective.attainment_target, "concurrency", ""
    for e in exps:
        cap = ledger.capacity_of(e)
        if cap is not None:
            points = {p.load: p.attainment for p in cap.points}
            target, axis, slos = cap.target, cap.axis, m.slo_text(cap.slos_ms)
            extra = {"capacity": cap.capacity} if cap.capacity is not None else {}
        else:
            levels = ledger.levels.get(e.id or 0, {})
            points = {float(c): lv.slo_attainment for c, lv in levels.items() if lv.slo_attainment is not None}
            slos = slos or next((m.slo_text(lv.goodput_slos_ms) for lv in levels.values() if lv.goodput_slos_ms), "")
            extra = {}
        if points:
            series.append(charts.Series(label(e), points, role(e), extra=extra, tag=f"#{e.number}"))
    if not series:
        return []
    xlabel = "concurrency (max_concurrency)" if axis == "concurrency" else "request rate (req/s, Poisson arrivals)"
    return [
        (
            "attainment",
            f"SLO attainment ({slos}) against load per configuration, the target ({target * 100:g}%) as a line; a "
            "dotted drop line marks each configuration's capacity where a capacity search found it.",
            charts.attainment_chart(series, title=f"SLO attainment at {slos}", target=target, xlabel=xlabel, note=note),
        )
    ]
