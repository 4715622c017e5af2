"""Improvement documents and status summaries, rebuilt from the ledger alone, under docs_out/<session>/.

- `NN-slug.md`, one per plan item: title, tier, rationale, expected impact, implementation (the exact flags or
  the code change), risks, status and, once tested, the result (before and after with experiment ids, the
  change in %, the verdict and its reason, and how that compares with the expected impact). Tier 3 items are
  changes for the user to make: they are documented, never given a measured or simulated gain.
- `status-NNN.md`: Best results, What was tried, Ruled out, Root cause, Next steps, Question; with `html`, also
  `status-NNN.html` (markdown-it-py, tables on) and charts under `charts/` (matplotlib PNGs).

Every number comes from a ledger row (benchmark levels, telemetry, experiments, the plan, analysis findings) or
from a formula the document names. Rendering is idempotent: the same ledger gives the same bytes, and a file
whose content would not change is not touched. A file edited by hand since pivot wrote it (its sha256 differs
from the one the ledger recorded) is never overwritten: the new version goes beside it (`NAME.new.md`) and
pivot says so. This module imports nothing from tools/: analysis findings arrive as ledger rows.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from markdown_it import MarkdownIt

from agent import models as m
from agent.errors import PivotError
from agent.servers import fault_point
from agent.session import Paths
from agent.store import Store

IMPROVEMENT_HEADINGS = ("Rationale", "Expected impact", "Implementation", "Risks", "Status")
STATUS_HEADINGS = ("Best results", "What was tried", "Ruled out", "Root cause", "Next steps", "Question")
KEPT_VERDICTS = (None, "baseline", "adopted")  # configurations that stand
SET_ASIDE = ("ruled_out", "crashed", "regressed", "no_gain")
VERDICT_WORDS = {
    "baseline": "baseline",
    "adopted": "adopted",
    "no_gain": "no gain",
    "regressed": "regressed",
    "crashed": "crashed",
    "ruled_out": "ruled out",
    "inconclusive": "inconclusive",
    "measured": "measured (not a change)",
    "not_measured": "not measured (the twin does not model it)",
    "predicted": "not launched (the twin predicts no gain)",
    None: "not judged",
}
CHANGE_FORMULA = "change = (after - before) / before x 100, per level"


class SessionLike(Protocol):
    """What the reports need: the ledger, the home's paths and the session id (agent.session.Session has them)."""

    store: Store
    paths: Paths
    notices: list[str]

    @property
    def id(self) -> str: ...


@dataclass
class SessionRef:
    """A session by id, for reading and rendering without taking its lock (a live run may hold it)."""

    store: Store
    paths: Paths
    id: str
    notices: list[str] = field(default_factory=list)


# The "Best results" table: one row per concurrency level.
BEST_HEADER = ["concurrency", "output tok/s", "total tok/s", "peak output tok/s", "mean TTFT ms", "mean TPOT ms",
               "experiment", "config", "source"]  # fmt: skip
BEST_ALIGN = ["r"] * 6 + ["l"] * 3


def markdown() -> MarkdownIt:
    """The parser every document is checked and rendered with: CommonMark, tables on, raw HTML off."""
    return MarkdownIt("commonmark", {"html": False}).enable("table")


# --------------------------------------------------------------------------------------------------
# Checking a document.


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


# --------------------------------------------------------------------------------------------------
# Formatting.


def _tok(v: float | None) -> str:
    return "" if v is None else f"{v:,.0f}"


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


_RANGE = re.compile(r"(?P<sign>[+\-−]?)\s*(?P<lo>\d+(?:\.\d+)?)\s*(?:-|–|to)\s*(?P<hi>\d+(?:\.\d+)?)\s*%")
_SINGLE = re.compile(r"(?P<sign>[+\-−])\s*(?P<lo>\d+(?:\.\d+)?)\s*%")
_CONC_RANGE = re.compile(r"concurrency\s+(\d+)(?:\s*(?:-|–|to)\s*(\d+))?", re.IGNORECASE)


@dataclass(frozen=True)
class Expectation:
    """An expected impact as numbers: a % range of one metric, at some concurrency levels."""

    low_pct: float
    high_pct: float
    metric: str  # a bench_levels column: output_throughput, total_throughput or mean_tpot_ms
    metric_words: str
    levels: tuple[int, int] | None  # inclusive concurrency range, None: the top level
    where: str  # low | high | any

    @property
    def midpoint_pct(self) -> float:
        return (self.low_pct + self.high_pct) / 2


def parse_expectation(text: str) -> Expectation | None:
    """The first "+A-B%" (or "+A%") of a plan item's expected impact, with its metric and levels, if any."""
    found = _RANGE.search(text) or _SINGLE.search(text)
    if not found:
        return None
    sign = -1.0 if found.group("sign") in ("-", "−") else 1.0
    lo = sign * float(found.group("lo"))
    hi = sign * float(found.groupdict().get("hi") or found.group("lo"))
    lo, hi = min(lo, hi), max(lo, hi)
    after = text[found.end() : found.end() + 40].lower()
    if "tpot" in after:
        metric, words = "mean_tpot_ms", "mean TPOT"
    elif "total" in after:
        metric, words = "total_throughput", "total tok/s"
    else:
        metric, words = "output_throughput", "output tok/s"
    levels = None
    conc = _CONC_RANGE.search(text)
    if conc:
        a = int(conc.group(1))
        b = int(conc.group(2)) if conc.group(2) else a
        levels = (min(a, b), max(a, b))
    lowered = text.lower()
    where = "low" if "low concurrency" in lowered and "high" not in lowered else "high" if "high" in lowered else "any"
    return Expectation(lo, hi, metric, words, levels, where)


# --------------------------------------------------------------------------------------------------
# The ledger, read once per rendering.


@dataclass
class Ledger:
    """Everything a report needs about one session, read from the store."""

    record: m.Session
    experiments: list[m.Experiment]
    levels: dict[int, dict[int, m.BenchLevel]]  # experiment -> concurrency -> the mean of its runs (BenchLevel.mean)
    sources: dict[int, str]
    telemetry: dict[int, dict[int, m.Telemetry]]
    findings: list[m.Finding]
    documents: list[m.Document]
    pivots: list[m.Pivot]
    runs: dict[int, int] = field(default_factory=dict)  # experiment -> benchmark runs (reruns average)
    usage: list[m.ModelUsage] = field(default_factory=list)  # the model's use, one row per agent run
    # experiment -> concurrency -> (max - min) / mean of its runs' output tok/s, in %, where it has two or more
    spread_pct: dict[int, dict[int, float]] = field(default_factory=dict)

    @classmethod
    def read(cls, store: Store, session_id: str) -> Ledger:
        record = store.get_session(session_id)
        experiments = store.experiments(record.id)
        levels: dict[int, dict[int, m.BenchLevel]] = {}
        sources: dict[int, str] = {}
        telemetry: dict[int, dict[int, m.Telemetry]] = {}
        runs: dict[int, int] = {}
        spread: dict[int, dict[int, float]] = {}
        for e in experiments:
            eid = e.id or 0
            by_level: dict[int, list[m.BenchLevel]] = {}
            results = store.bench_results(eid)
            runs[eid] = len(results)
            for result in results:
                sources[eid] = result.source
                for level in result.levels:
                    if level.max_concurrency is not None:
                        by_level.setdefault(level.max_concurrency, []).append(level)
            levels[eid] = {c: m.BenchLevel.mean(lvs) for c, lvs in by_level.items()}
            for c, lvs in by_level.items():
                ok = [lv.output_throughput for lv in lvs if lv.completed > 0 and lv.failed == 0]
                if len(ok) >= 2 and sum(ok) > 0:
                    spread.setdefault(eid, {})[c] = (max(ok) - min(ok)) / (sum(ok) / len(ok)) * 100
            telemetry[eid] = {t.max_concurrency: t for t in store.telemetry(eid) if t.max_concurrency is not None}
        return cls(
            record=record,
            experiments=experiments,
            levels=levels,
            sources=sources,
            telemetry=telemetry,
            findings=store.findings(record.id),
            documents=store.documents(record.id),
            pivots=store.pivots(record.id),
            runs=runs,
            usage=store.usage(record.id),
            spread_pct=spread,
        )

    def band_pct(self) -> float:
        """The noise band, as the method sets it: max(the session's minimum gain, the spread of the baseline's runs
        at its highest level that completed)."""
        floor = self.record.settings.min_gain_pct
        base = self.baseline()
        if base is None:
            return floor
        ok = self.ok_levels(base)
        spread = self.spread_pct.get(base.id or 0, {}).get(max(ok)) if ok else None
        return max(floor, spread or 0.0)

    @property
    def plan(self) -> m.Plan:
        return self.record.plan

    def experiment(self, experiment_id: int | None) -> m.Experiment | None:
        return next((e for e in self.experiments if e.id == experiment_id), None)

    def ok_levels(self, e: m.Experiment) -> dict[int, m.BenchLevel]:
        """Levels that completed requests without failures."""
        return {c: lv for c, lv in self.levels.get(e.id or 0, {}).items() if lv.completed > 0 and lv.failed == 0}

    def figure(self, e: m.Experiment) -> tuple[float, int, int] | None:
        """The one number every view gives for an experiment: (output tok/s, concurrency, runs), the mean of its
        runs at the level where that mean is highest (levels with failed requests left out). None when nothing
        completed, or when the engine did not model the change (its numbers say nothing of it)."""
        ok = self.ok_levels(e)
        if not ok or e.verdict == "not_measured":
            return None
        c, level = max(ok.items(), key=lambda kv: (kv[1].output_throughput, kv[0]))
        return level.output_throughput, c, self.runs.get(e.id or 0, 0)

    def figure_text(self, e: m.Experiment) -> str:
        """`figure` in words: "2,046 @2048 (2 runs)" (the mean of 2 runs), "" when there is none."""
        found = self.figure(e)
        if found is None:
            return ""
        tok_s, c, runs = found
        return f"{tok_s:,.0f} @{c} ({runs} run{'s' if runs != 1 else ''})"

    def base_of(self, e: m.Experiment) -> m.Experiment | None:
        return self.experiment(e.base_experiment_id)

    def baseline(self) -> m.Experiment | None:
        for e in self.experiments:
            if e.kind == "baseline" or e.verdict == "baseline":
                return e
        return None

    def change_text(self, e: m.Experiment) -> str:
        """What the experiment changed, in SGLang's spelling: against its base, else the plan's base flags."""
        base = self.base_of(e)
        if e.kind == "baseline" or e.verdict == "baseline":
            return "base flags: " + config_text(e.config)
        if base is None and e.kind == "imported":
            return config_text(e.config) or "(flags not given)"
        diff = e.config.diff(base.config if base else self.plan.target.base_config())
        return str(diff)

    def unmodelled(self, e: m.Experiment) -> list[str]:
        """The flags `e` changes that its engine does not model (recorded on the experiments), as typed."""
        if e.kind == "baseline" or e.verdict == "baseline":
            return []
        base = self.base_of(e)
        gone = set(e.not_modelled) | set(base.not_modelled if base is not None else [])
        if not gone:
            return []
        diff = e.config.diff(base.config if base else self.plan.target.base_config())
        return [c.name for c in diff.flags if c.name in gone]

    def not_measured_text(self, e: m.Experiment) -> str:
        """What a report says of a change the engine could not measure, and what would measure it."""
        flags = self.unmodelled(e)
        names = ", ".join(flags) if flags else "the flags this change touches"
        return f"the twin does not model {names}; measure it on a GPU"

    def power_w(self, e: m.Experiment, c: int) -> tuple[float | None, float | None]:
        """(mean power per GPU, power limit) at a level, from telemetry."""
        t = self.telemetry.get(e.id or 0, {}).get(c)
        if t is None:
            return None, None
        watts = [g.power_w_mean for g in t.gpus if g.power_w_mean is not None]
        limits = [g.power_limit_w for g in t.gpus if g.power_limit_w]
        return (sum(watts) / len(watts) if watts else None), (sum(limits) / len(limits) if limits else None)

    def item_experiments(self, item_id: str) -> list[m.Experiment]:
        return [e for e in self.experiments if item_id in e.plan_items]  # combined experiments name every item

    def best_by_level(self) -> dict[int, tuple[m.Experiment, m.BenchLevel]]:
        """Per concurrency, the highest output tok/s among the configurations that stand (baseline, adopted, not
        judged) on the reference workload; a level none of them measured falls back to any experiment's."""
        key = self.workload_key()
        kept: dict[int, tuple[m.Experiment, m.BenchLevel]] = {}
        other: dict[int, tuple[m.Experiment, m.BenchLevel]] = {}
        for e in self.experiments:
            if e.workload.workload_key() != key:
                continue
            target = kept if e.verdict in KEPT_VERDICTS else other
            for c, lv in self.ok_levels(e).items():
                if c not in target or lv.output_throughput > target[c][1].output_throughput:
                    target[c] = (e, lv)
        return {c: kept.get(c) or other[c] for c in sorted(set(kept) | set(other))}

    def workload_key(self) -> str:
        """The workload results are compared on: the baseline's (an import may differ from the plan's), else the plan's."""
        base = self.baseline()
        return (base.workload if base else self.plan.workload).workload_key()

    def analysed_experiment(self) -> int | None:
        """The experiment the root cause describes: the best one at the top level if analysed, else the latest."""
        analysed = [f.experiment_id for f in self.findings if f.kind == "bottleneck" and f.experiment_id]
        if not analysed:
            return None
        best = self.best_by_level()
        if best:
            top = best[max(best)][0].id
            if top in analysed:
                return top
        return analysed[-1]


def config_text(config: m.ServerConfig) -> str:
    """The flags of a config without --model-path (the target names the model)."""
    return str(config.without("--model-path", "--model"))


# --------------------------------------------------------------------------------------------------
# Writing files without overwriting the user's edits.


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _beside(path: Path, n: int) -> Path:
    suffix = ".new" if n == 1 else f".new-{n}"
    return path.with_name(path.stem + suffix + path.suffix)


def _notify(session: SessionLike, message: str) -> None:
    session.notices.append(message)
    emit: Callable[..., None] | None = getattr(session, "emit", None)
    if emit is not None:
        emit("warning", message)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: a kill mid-write leaves the old file (or none), never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _write(session: SessionLike, path: Path, content: str, doc: m.Document, known: dict[str, m.Document]) -> m.Document:
    """Write `content` to `path` unless it holds a version edited by hand; record it; return its record."""
    paths, store = session.paths, session.store
    data = content.encode("utf-8")
    sha = _sha(data)
    rel = paths.relative(path)
    record = known.get(rel)
    target = path
    if path.exists():
        current = _sha(path.read_bytes())
        if current != sha and (record is None or record.sha256 != current):
            n = 1
            while True:
                candidate = _beside(path, n)
                crel = paths.relative(candidate)
                ours = known.get(crel)
                if not candidate.exists():
                    break
                cur = _sha(candidate.read_bytes())
                if cur == sha or (ours is not None and ours.sha256 == cur):
                    break
                n += 1
            target = candidate
            why = "edited by hand since pivot wrote it" if record is not None else "not written by pivot"
            _notify(
                session,
                f"{rel} was {why}; pivot left it as it is and wrote its new version beside it: "
                f"{paths.relative(candidate)}",
            )
            if record is not None and "edited by hand" not in record.status:
                store.upsert_document(
                    record.model_copy(
                        update={
                            "status": f"edited by hand; pivot's version: {candidate.name}",
                            "updated_at": m.utcnow(),
                        }
                    )
                )
    trel = paths.relative(target)
    if not (target.exists() and _sha(target.read_bytes()) == sha):
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, data)
    old = known.get(trel)
    new = doc.model_copy(update={"path": trel, "sha256": sha})
    if old is not None and all(
        getattr(old, f) == getattr(new, f) for f in ("sha256", "status", "title", "experiment_ids", "kind", "number")
    ):
        return old
    saved = store.upsert_document(new.model_copy(update={"updated_at": m.utcnow()}))
    known[trel] = saved
    return saved


# --------------------------------------------------------------------------------------------------
# Improvement documents.


def item_status(ledger: Ledger, item: m.PlanItem) -> tuple[str, list[m.Experiment]]:
    """The item's status in words, and its experiments (oldest first)."""
    exps = ledger.item_experiments(item.id)
    if item.kind == "code":
        return "documented: a code change for you to make", exps
    if not exps:
        return "proposed", exps
    last = exps[-1]
    together = f" (together with {', '.join(i for i in last.plan_items if i != item.id)})" if last.combined else ""
    if last.verdict == "predicted":
        return f"not launched: {VERDICT_WORDS[last.verdict]}", exps
    if last.verdict == "not_measured":
        return "not measured: the twin does not model it (for a GPU)", exps
    if last.verdict is not None:
        return f"tested{together}: {VERDICT_WORDS[last.verdict]}", exps
    if last.status in ("planned", "running"):
        return "testing", exps
    if last.status == "failed":
        return f"failed: {last.failure or 'see the reason'}", exps
    return "tested: not judged yet", exps


def _expected_comparison(
    exp: Expectation | None, before: dict[int, m.BenchLevel], after: dict[int, m.BenchLevel]
) -> str:
    if exp is None:
        return "The expected impact gives no number to compare with."
    common = sorted(set(before) & set(after))
    if not common:
        return "No level was measured both before and after, so there is nothing to compare."
    if exp.levels is not None:
        chosen = [c for c in common if exp.levels[0] <= c <= exp.levels[1]]
    elif exp.where == "low":
        chosen = common[:1]
    else:
        chosen = common[-1:]
    if not chosen:
        chosen = common[-1:]
    parts, verdicts = [], []
    for c in chosen:
        pct = _change(getattr(before[c], exp.metric), getattr(after[c], exp.metric))
        if pct is None:
            continue
        parts.append(f"{_signed(pct)} at concurrency {c}")
        if pct < exp.low_pct:
            verdicts.append("below")
        elif pct > exp.high_pct:
            verdicts.append("above")
        else:
            verdicts.append("within")
    if not parts:
        return "The change could not be computed (a zero before)."
    words = {"below": "below the expected range", "above": "above the expected range", "within": "within it"}
    summary = words[verdicts[0]] if len(set(verdicts)) == 1 else "partly within it"
    return (
        f"Expected {exp.low_pct:+g}% to {exp.high_pct:+g}% {exp.metric_words}; measured {', '.join(parts)}: {summary}."
    )


def render_improvement(ledger: Ledger, item: m.PlanItem) -> tuple[str, str, list[int]]:
    """(markdown, status, experiment ids) of one plan item's improvement document."""
    plan = ledger.plan
    status, exps = item_status(ledger, item)
    tier = f"{item.tier} ({plan.tiers[item.tier]})" if item.tier in plan.tiers else str(item.tier)
    ids = [e.id for e in exps if e.id is not None]
    rows = [
        ["Plan", f"{plan.name}, session {ledger.record.id}"],
        ["Tier", tier],
        ["Kind", item.kind],
        ["Status", status],
        ["Experiments", ", ".join(f"#{i}" for i in ids) or "none yet"],
    ]
    out = [f"# {item.id} {item.title}", "", _table(["field", "value"], rows), ""]
    out += ["## Rationale", "", item.hypothesis.strip(), ""]
    out += ["## Expected impact", "", item.expected_impact.strip(), ""]
    out += ["## Implementation", ""]
    tested = exps[-1] if exps else None
    if item.kind == "code":
        out += [
            "A code change for you to make; pivot documents it and does not run or simulate it, so it gets no "
            "measured gain here.",
            "",
            item.change.strip() if item.change else "",
            "",
        ]
    elif item.kind == "profile":
        out += [
            "A measurement of the best configuration, not a change: profile it under load and attribute GPU time.",
            "",
        ]
    elif item.kind == "workload":
        out += [
            "Benchmark workload overrides: " + ", ".join(f"{k} = {v}" for k, v in (item.workload or {}).items()),
            "",
        ]
    if item.flags is not None or item.remove_flags:
        flags = str(item.flags) if item.flags is not None else ""
        removed = " ".join(f"(remove {f})" for f in item.remove_flags)
        out += [
            "Flags set on top of the best configuration so far, as the plan writes them:",
            "",
            "```",
            f"{flags} {removed}".strip(),
            "```",
            "",
        ]
    if tested is not None and item.kind != "code":
        engine = ledger.plan.target.engine
        out += [f"Command line of experiment #{tested.id}:", "", "```", f"{engine} serve {tested.config}", "```", ""]
        if tested.audit:
            out += [
                f"Flag audit against {engine} {plan.target.engine_version or ''}".rstrip() + ":",
                "",
                _table(["flag", "status", "what it means"], [[i.flag, i.status, i.message] for i in tested.audit]),
                "",
            ]
    out += ["## Risks", "", item.risks.strip() or "None noted in the plan.", ""]
    claims = [f for f in ledger.findings if f.kind == "claim" and f.plan_item == item.id]
    if claims:
        out += ["## Plan check", ""]
        out += [f"- {f.severity}: {f.text}" for f in claims] + [""]
    out += ["## Status", "", _status_sentence(item, status, tested), ""]
    if tested is not None and item.kind != "code":
        out += _result_section(ledger, item, tested)
    return "\n".join(out).rstrip() + "\n", status, ids


def _status_sentence(item: m.PlanItem, status: str, tested: m.Experiment | None) -> str:
    if item.kind == "code":
        return "Documented. This is a change for you to make in the code; pivot will measure it once it is deployed."
    if tested is None:
        return "Proposed: not tested yet."
    text = f"{status[0].upper()}{status[1:]} (experiment #{tested.id})."
    if tested.reason:
        text += f" {tested.reason}"
    return text


def _result_section(ledger: Ledger, item: m.PlanItem, e: m.Experiment) -> list[str]:
    out = ["## Result", ""]
    base = ledger.base_of(e)
    after = ledger.ok_levels(e)
    every = ledger.levels.get(e.id or 0, {})
    source = ledger.sources.get(e.id or 0)
    if e.combined:
        others = ", ".join(f"{i} {ledger.plan.item(i).title}" for i in e.plan_items if i != item.id)
        out += [
            f"Experiment #{e.id} tested this item together with {others} as one step ({_items(e)}): the result "
            "below is the combination's, not this item's alone.",
            "",
        ]
    if e.prediction:
        out += [f"Before the launch, the search's prediction: {e.prediction}.", ""]
    if e.verdict in ("predicted", "ruled_out") and not every and e.status != "failed":
        out += [f"Experiment #{e.id} was not launched: {e.reason or VERDICT_WORDS[e.verdict]}", ""]
        return out
    if e.status == "failed" and not every:
        out += [f"Experiment #{e.id} did not run: {e.failure or 'failed'}. {e.reason or ''}".strip()]
        if e.log_path:
            out += ["", f"Server log: {_inline_code(e.log_path)}"]
        return [*out, ""]
    if e.verdict == "not_measured":
        ran = (
            f" The twin ran experiment #{e.id}, but its numbers leave this change out, so they are not a result."
            if every
            else " No launch was spent on it."
        )
        out += [f"Verdict: **{VERDICT_WORDS[e.verdict]}**. Not measured: {ledger.not_measured_text(e)}.{ran}", ""]
        return out
    if item.kind == "profile":
        lines = [f for f in ledger.findings if f.experiment_id == e.id and "profile" in f.text.lower()]
        out += [f"- {f.text}" for f in lines] or ["No profile was recorded for this experiment."]
        return [*out, ""]
    before = ledger.ok_levels(base) if base else {}
    levels = sorted(set(every) | set(before))
    rows = []
    for c in levels:
        b, a = before.get(c), every.get(c)
        failed = a is not None and (a.failed > 0 or a.completed == 0)
        rows.append(
            [
                c,
                _tok(b.output_throughput) if b else "",
                _tok(a.output_throughput) if a and not failed else f"{a.failed} failed" if a else "",
                _signed(_change(b.output_throughput, a.output_throughput)) if a and b and not failed else "",
                _ms(b.mean_tpot_ms) if b else "",
                _ms(a.mean_tpot_ms) if a and not failed else "",
                _signed(_change(b.mean_tpot_ms, a.mean_tpot_ms)) if a and b and not failed else "",
            ]
        )
    b_id = f"#{base.id}" if base else "none"
    header = [
        "concurrency",
        f"output tok/s before ({b_id})",
        f"after (#{e.id})",
        "change",
        f"mean TPOT ms before ({b_id})",
        f"after (#{e.id})",
        "change",
    ]
    if source == "simulated":
        out += ["Simulated by pivot's digital twin of SGLang, not measured on GPUs.", ""]
    out += [_table(header, rows, ["r", "r", "r", "r", "r", "r", "r"]), "", f"Formula: {CHANGE_FORMULA}.", ""]
    out += [f"Verdict: **{VERDICT_WORDS[e.verdict]}**" + (f". {e.reason}" if e.reason else "."), ""]
    if base is not None:
        out += [_expected_comparison(parse_expectation(item.expected_impact), before, after), ""]
    crashed = [c for c, lv in every.items() if lv.failed > 0]
    if crashed:
        errors = sorted({err for c in crashed for err in every[c].errors})
        out += [f"Failed requests at concurrency {', '.join(map(str, sorted(crashed)))}: {'; '.join(errors[:3])}.", ""]
    return out


def write_improvement_docs(session: SessionLike) -> list[m.Document]:
    """Write (or rebuild) the improvement document of every plan item; returns their ledger records."""
    ledger = Ledger.read(session.store, session.id)
    known = {d.path: d for d in ledger.documents}
    out = []
    for item in ledger.plan.items:
        out.append(_write_improvement(session, ledger, item, known))
    return out


def write_improvement_doc(session: SessionLike, item_id: str) -> m.Document:
    """Write (or rebuild) one plan item's improvement document."""
    ledger = Ledger.read(session.store, session.id)
    return _write_improvement(session, ledger, ledger.plan.item(item_id), {d.path: d for d in ledger.documents})


def _write_improvement(
    session: SessionLike, ledger: Ledger, item: m.PlanItem, known: dict[str, m.Document]
) -> m.Document:
    text, status, ids = render_improvement(ledger, item)
    problems = check_document(text, IMPROVEMENT_HEADINGS + (("Result",) if "## Result" in text else ()))
    if problems:
        raise PivotError(f"improvement document {item.id} is malformed: {'; '.join(problems)}")
    path = session.paths.docs_dir(session.id) / f"{item.id}-{slug(item.title)}.md"
    doc = m.Document(
        session_id=session.id,
        kind="improvement",
        plan_item=item.id,
        title=f"{item.id} {item.title}",
        path="",
        status=status,
        sha256="",
        experiment_ids=ids,
    )
    return _write(session, path, text, doc, known)


# --------------------------------------------------------------------------------------------------
# Status summaries.


@dataclass
class Summary:
    """A rendered status summary: its markdown, its charts' data and what it rests on."""

    number: int
    markdown: str
    experiment_ids: list[int]
    question: str
    options: list[str]
    series: dict[str, Any] = field(default_factory=dict)


def _default_question(ledger: Ledger, steps: list[tuple[m.PlanItem, Expectation | None]]) -> tuple[str, list[str]]:
    open_ = [p for p in ledger.pivots if p.open]
    if open_:
        return open_[-1].question, open_[-1].options
    options = [f"{item.id} {item.title}" for item, _ in steps[:3]]
    options.append("Something else (say what)")
    return "Which of these should pivot pursue next, or do you have a different direction in mind?", options


def plan_warnings(ledger: Ledger) -> dict[str, list[str]]:
    """Per plan item, the plan checks' warnings and errors recorded in the ledger ("error: ...", "warning: ..."),
    errors first: what a pivot option proposing the item, its document and the summary's next steps must say.
    The checks are tools/analysis/ `check_plan`; they run with every document and summary the tools write."""
    out: dict[str, list[str]] = {}
    claims = [f for f in ledger.findings if f.kind == "claim" and f.plan_item and f.severity in ("warning", "error")]
    for f in sorted(claims, key=lambda f: (f.severity != "error", f.plan_item or "")):
        out.setdefault(f.plan_item or "", []).append(f"{f.severity}: {f.text}")
    return out


def next_steps(ledger: Ledger) -> list[tuple[m.PlanItem, Expectation | None]]:
    """Items not tested yet, ranked by the midpoint of their expected range (items without a number last)."""
    pending = []
    for item in ledger.plan.items:
        exps = ledger.item_experiments(item.id)
        if exps and any(e.status in ("finished", "failed") for e in exps):
            continue
        pending.append((item, parse_expectation(item.expected_impact)))

    def key(pair: tuple[m.PlanItem, Expectation | None]) -> tuple[int, float, str]:
        item, exp = pair
        if exp is None:
            return (1, 0.0, item.id)
        size = abs(exp.midpoint_pct)
        return (0, -size, item.id)

    return sorted(pending, key=key)


def _items(e: m.Experiment) -> str:
    """The plan items an experiment names: "05" or, for a combined step, "05+06"."""
    return "+".join(e.plan_items) if e.plan_items else ""


def prediction_text(e: m.Experiment) -> str:
    """What the search predicted before the launch, as a clause (empty when nothing was predicted)."""
    if e.predicted_change_pct is not None:
        return f"predicted {e.predicted_change_pct:+.1f}%"
    if e.predicted_tok_s is not None:
        return f"predicted {_tok(e.predicted_tok_s)} output tok/s"
    return ""


def _effect(ledger: Ledger, e: m.Experiment) -> str:
    if e.verdict == "predicted":
        return f"not launched; {prediction_text(e) or 'predicted'} (the twin, not a measurement)"
    text = _effect_text(ledger, e)
    pred = prediction_text(e)
    if pred and (ledger.runs.get(e.id or 0, 0) > 0):
        text += f" [{pred}]"
    if e.workload.workload_key() != ledger.workload_key():
        text += " (on a different workload: not compared)"
    return text


def _effect_text(ledger: Ledger, e: m.Experiment) -> str:
    if e.verdict == "not_measured":
        return "not measured: " + ledger.not_measured_text(e)
    levels = ledger.levels.get(e.id or 0, {})
    if e.status == "failed" and not levels:
        return f"did not start ({e.failure or 'failed'})"
    failed = sorted(c for c, lv in levels.items() if lv.failed > 0)
    ok = ledger.ok_levels(e)
    base = ledger.base_of(e)
    if e.kind == "baseline" or e.verdict == "baseline" or base is None:
        if not ok:
            return "no level completed"
        top = max(ok)
        text = f"{_tok(ok[top].output_throughput)} output tok/s at {top}" + _runs_note(ledger, e)
        return text + (f"; requests failed at {', '.join(map(str, failed))}" if failed else "")
    before = ledger.ok_levels(base)
    common = sorted(set(before) & set(ok))
    parts = []
    if common:
        c = common[-1]
        pct = _change(before[c].output_throughput, ok[c].output_throughput)
        parts.append(
            f"{_signed(pct)} output tok/s at {c} ({_tok(before[c].output_throughput)} -> {_tok(ok[c].output_throughput)})"
            + _runs_note(ledger, e)
        )
    if failed:
        parts.append(f"requests failed at {', '.join(map(str, failed))}")
    return "; ".join(parts) or "nothing comparable measured"


def _runs_note(ledger: Ledger, e: m.Experiment) -> str:
    n = ledger.runs.get(e.id or 0, 0)
    return f", mean of {n} runs" if n > 1 else ""


def render_status(ledger: Ledger, number: int, question: str | None, options: Sequence[str] | None) -> Summary:
    """The markdown of status summary `number` (and the data of its charts)."""
    plan, record = ledger.plan, ledger.record
    t = plan.target
    w = ledger.baseline().workload if ledger.baseline() else plan.workload
    best = ledger.best_by_level()
    simulated = any(ledger.sources.get(e.id or 0) == "simulated" for e in ledger.experiments)
    used: set[int] = set()
    out = [f"# Status {number:03d}: {plan.title}", ""]
    intro = (
        f"Session {record.id} ({record.name}), plan {plan.name}: {t.model} on {t.gpus}x {t.hardware}, "
        f"{t.engine} {t.engine_version or ''}".rstrip()
        + f". {len(ledger.experiments)} experiment{'s' if len(ledger.experiments) != 1 else ''}. Workload: {w.dataset_name}, input {w.random_input_len} / output "
        f"{w.random_output_len} tokens (range ratio {w.random_range_ratio:g})."
    )
    out += [intro, ""]
    if simulated:
        out += [
            "Numbers from experiments marked simulated come from pivot's digital twin of SGLang, not from GPUs.",
            "",
        ]

    # -- Best results
    out += ["## Best results", ""]
    if best:
        rows = []
        for c, (e, lv) in best.items():
            used.add(e.id or 0)
            rows.append(
                [
                    c,
                    _tok(lv.output_throughput),
                    _tok(lv.total_throughput),
                    _tok(lv.max_output_tokens_per_s),
                    _ms(lv.mean_ttft_ms),
                    _ms(lv.mean_tpot_ms),
                    f"#{e.id}",
                    config_text(e.config) or "(no flags)",
                    ledger.sources.get(e.id or 0, ""),
                ]
            )
        header = BEST_HEADER
        out += [_table(header, rows, BEST_ALIGN), ""]
        out += [
            "Per level, the highest output tok/s among the configurations that stand (the baseline, adopted "
            "changes and imported runs); a level with failed requests does not count.",
            "",
        ]
    else:
        header = BEST_HEADER
        rows = [[c, "", "", "", "", "", "none yet", "", ""] for c in w.concurrency]
        out += [_table(header, rows, BEST_ALIGN), ""]
        out += ["No level has completed requests yet; the levels are the plan's.", ""]

    # -- What was tried
    out += ["## What was tried", ""]
    tried = [e for e in ledger.experiments if e.kind != "prior"]
    if tried:
        rows = []
        for e in tried:
            used.add(e.id or 0)
            rows.append([f"#{e.id}", _items(e), ledger.change_text(e), _effect(ledger, e), VERDICT_WORDS[e.verdict]])
        out += [_table(["experiment", "item", "change", "effect", "verdict"], rows), ""]
        out += [
            f"Effects compare each experiment with the one it changed, at the highest level both measured ({CHANGE_FORMULA}).",
            "",
        ]
        if any(e.combined for e in tried):
            out += ["An item column like 05+06 is one experiment that combined those items as one step.", ""]
        if any(e.predicted_change_pct is not None or e.predicted_tok_s is not None for e in tried):
            out += [
                "In brackets: the twin's prediction made before the launch, corrected to this campaign's measurements "
                '(a prediction, not a measurement); "not launched" rows were never run.',
                "",
            ]
    else:
        out += ["Nothing yet.", ""]

    # -- Ruled out
    out += ["## Ruled out", ""]
    lines = []
    for e in tried:
        if e.verdict in SET_ASIDE:
            label = f"items {_items(e)} together, " if e.combined else f"item {e.plan_item}, " if e.plan_item else ""
            title = e.title or ledger.change_text(e)
            why = e.reason or e.failure or "no reason recorded"
            lines.append(f"- **{title}** ({label}experiment #{e.id}, {VERDICT_WORDS[e.verdict]}): {why}")
    for p in plan.prior:
        if p.verdict in ("adopted", "baseline"):
            continue
        how = f" (`{p.flags}`)" if p.flags else f" ({p.change})" if p.change else ""
        lines.append(f"- **{p.title}**{how}, before this plan, {VERDICT_WORDS[p.verdict]}: {p.finding}")
    out += (lines or ["Nothing yet."]) + [""]

    # -- Root cause
    out += ["## Root cause", ""]
    out += _root_cause(ledger, used)

    # -- Next steps
    out += ["## Next steps", ""]
    steps = next_steps(ledger)
    warnings = plan_warnings(ledger)
    if steps:
        for i, (item, _) in enumerate(steps, start=1):
            tier = plan.tiers.get(item.tier, f"tier {item.tier}")
            who = "a code change for you to make" if item.kind == "code" else item.kind
            line = f"{i}. **{item.id} {item.title}** ({tier}; {who}). Expected: {item.expected_impact.strip()}"
            errors = [w for w in warnings.get(item.id, []) if w.startswith("error")]
            if errors:
                line += f" Plan check {errors[0]}"
            predicted = [e for e in ledger.item_experiments(item.id) if e.verdict == "predicted"]
            if predicted and prediction_text(predicted[-1]):
                line += f" Not launched: the twin {prediction_text(predicted[-1])} (experiment #{predicted[-1].id})."
            out.append(line)
        out += [
            "",
            "Ranked by the midpoint of each item's expected range, as the plan states it; items without a number last.",
            "",
        ]
    else:
        out += ["Every item of the plan has been tried.", ""]
    unmeasured = [e for e in tried if e.verdict == "not_measured"]
    if unmeasured:
        out += ["To measure on a GPU (the twin does not model what they change, so it did not measure them):", ""]
        out += [
            f"- **{e.plan_item or ''} {e.title}**".replace("** ", "**", 1) + f": {ledger.not_measured_text(e)}."
            for e in unmeasured
        ] + [""]
    corrections = [f for f in ledger.findings if f.kind == "claim" and f.severity == "error"]
    if corrections:
        out += [
            "Plan items with a physics or direction error (see Root cause) should be corrected before they are run again: "
            + ", ".join(sorted({f.plan_item or "" for f in corrections if f.plan_item}))
            + ".",
            "",
        ]

    # -- Question
    if question is None:
        question, options = _default_question(ledger, steps)
    options = list(options or [])
    out += ["## Question", "", question, ""]
    if options:
        out += [f"{i}. {o}" for i, o in enumerate(options, start=1)] + [""]
    elif billed := [u for u in ledger.usage if u.model != "autopilot"]:  # the final summary: the model's use
        out += [usage_text(billed), ""]  # (the built-in autopilot costs nothing; its tokens are estimates)
    text = "\n".join(out).rstrip() + "\n"
    return Summary(number, text, sorted(used), question, options)


def usage_text(usage: Sequence[m.ModelUsage]) -> str:
    """The model's use over a session's runs in one sentence: requests, tokens and cost (where it is known)."""
    requests = sum(u.requests for u in usage)
    tokens_in = sum(u.input_tokens for u in usage)
    tokens_out = sum(u.output_tokens for u in usage)
    models = ", ".join(dict.fromkeys(u.model for u in usage))
    priced = [u.cost_usd for u in usage if u.cost_usd is not None]
    if priced and len(priced) == len(usage):
        cost = f"cost ${sum(priced):,.2f} (genai-prices)"
    elif priced:
        cost = f"cost ${sum(priced):,.2f} for the runs with a known price"
    else:
        cost = "no price known for this model"
    runs = len(usage)
    return (
        f"Model use ({models}): {runs} run{'s' if runs != 1 else ''}, {requests:,} requests, {tokens_in:,} input "
        f"and {tokens_out:,} output tokens; {cost}."
    )


def _root_cause(ledger: Ledger, used: set[int]) -> list[str]:
    eid = ledger.analysed_experiment()
    claims = [f for f in ledger.findings if f.kind == "claim" and f.severity in ("warning", "error")]
    out: list[str] = []
    if eid is None:
        out += ["No analysis is recorded yet (`pivot summary` runs it on the best experiment first).", ""]
    else:
        used.add(eid)
        fs = [f for f in ledger.findings if f.experiment_id == eid]
        verdict = next(f for f in fs if f.kind == "bottleneck")
        title = m.BOTTLENECK_TITLES.get(verdict.category or "", verdict.category or "")
        out += [f"**{title[0].upper()}{title[1:]}**, from the analysis of experiment #{eid}. {verdict.text}", ""]
        evidence = [f for f in fs if f.kind == "evidence" and f.category == verdict.category]
        out += [f"- {f.text}" for f in evidence] + [""]
        scaling = [f for f in fs if f.kind == "scaling"]
        notes = [f for f in fs if f.kind == "note"]
        also = [f for f in fs if f.kind == "evidence" and f.category != verdict.category]
        if also or scaling or notes:
            out += ["Also measured:", ""]
            out += [f"- {f.text}" for f in [*notes, *scaling, *also]] + [""]
        levels = [f for f in fs if f.kind == "level"]
        if levels:
            moe = any("rows_per_expert" in f.values for f in levels)
            header = [
                "concurrency",
                "running requests",
                "rows per expert" if moe else "GEMM rows (M)",
                "FLOP/byte",
                "bound",
                "GEMM TFLOP per step",
                "GEMM ms",
                "TFLOPS",
                "% of peak",
                "GB per step",
                "bandwidth floor ms",
                "TPOT ms",
                "TPOT / floor",
                "W per GPU",
                "% of power limit",
                "KV used %",
            ]
            rows = []
            for f in levels:
                v = f.values
                rows_pe = v["rows_per_expert"] if moe else round(v["gemm_m"])
                gemm_ms = v.get("estimate_expert_gemm_ms" if moe else "estimate_dense_gemm_ms")
                rows.append(
                    [
                        int(v["max_concurrency"]),
                        _tok(v.get("running_decodes")),
                        _rows(rows_pe),
                        f"{v['arithmetic_intensity_flop_per_byte']:,.0f}",
                        "memory" if v.get("memory_bound") else "compute",
                        f"{v['gemm_tflop']:.4g}" if "gemm_tflop" in v else "",
                        _ms(gemm_ms),
                        f"{v['achieved_tflops']:,.1f}",
                        f"{v['share_of_peak_pct']:.1f}",
                        f"{v['step_bytes_gb']:.2f}",
                        _ms(v["bandwidth_floor_ms"]),
                        _ms(v.get("mean_tpot_ms")),
                        f"{v['tpot_over_floor']:.1f}",
                        _tok(v.get("power_w_mean")),
                        _tok(v.get("power_share_pct")),
                        _tok(v.get("kv_usage_pct")),
                    ]
                )
            out += [_table(header, rows, ["r"] * len(header)), ""]
            v = levels[-1].values
            per_expert = (
                f"rows per expert = running requests x {v['experts_per_token']:.0f} / {v['experts']:.0f}; "
                if moe and "experts" in v
                else ""
            )
            out += [
                f"Each row is one set of numbers, at the requests that actually decode (running requests, from "
                f"Little's law): {per_expert}TFLOPS = GEMM TFLOP per step / GEMM ms (the decode-step estimate); "
                f"% of peak = TFLOPS / {v['peak_tflops']:,.0f}; bandwidth floor = GB per step / "
                f"{v.get('bandwidth_gbs', 0):,.0f} GB/s; TPOT / floor = TPOT ms / bandwidth floor ms.",
                "",
            ]
        formulas = sorted({f.formula for f in fs if f.formula})
        if formulas:
            out += ["How the numbers were derived:", ""] + [f"- {x}" for x in formulas] + [""]
    if claims:
        out += ["Plan checks (physics and direction):", ""]
        out += [f"- {f.severity}: {f.text}" for f in claims] + [""]
    return out


def _rows(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:,.{2 if value < 1 else 1 if value < 10 else 0}f}"


def latest_status_doc(documents: Sequence[m.Document]) -> m.Document | None:
    """The newest status summary's markdown record (its HTML twin has the same number)."""
    md = [d for d in documents if d.kind == "status" and d.path.endswith(".md")]
    return max(md, key=lambda d: d.number or 0, default=None)


def _latest_status(ledger: Ledger) -> int:
    numbers = [d.number or 0 for d in ledger.documents if d.kind == "status"]
    return max(numbers, default=0)


def write_status_summary(
    session: SessionLike,
    question: str | None = None,
    options: Sequence[str] | None = None,
    *,
    new: bool = False,
    html: bool = False,
) -> m.Document:
    """Write status summary `status-NNN.md`: with `new`, the next number (a pivot point), else the latest is
    rebuilt (001 when there is none). The question defaults to the open pivot's, else one built from the next
    steps. With `html`, also `status-NNN.html` and its charts. Returns the markdown's ledger record."""
    ledger = Ledger.read(session.store, session.id)
    latest = _latest_status(ledger)
    number = latest + 1 if (new or latest == 0) else latest
    summary = render_status(ledger, number, question, options)
    problems = check_document(summary.markdown, STATUS_HEADINGS)
    if problems:
        raise PivotError(f"status summary {number:03d} is malformed: {'; '.join(problems)}")
    known = {d.path: d for d in ledger.documents}
    folder = session.paths.docs_dir(session.id)
    doc = m.Document(
        session_id=session.id,
        kind="status",
        number=number,
        title=f"Status {number:03d}",
        path="",
        status="latest",
        sha256="",
        experiment_ids=summary.experiment_ids,
    )
    saved = _write(session, folder / f"status-{number:03d}.md", summary.markdown, doc, known)
    fault_point("status-markdown-written")
    if new:
        for d in ledger.documents:
            if d.kind == "status" and (d.number or 0) < number and not d.status.startswith(("superseded", "edited")):
                session.store.upsert_document(d.model_copy(update={"status": f"superseded by status-{number:03d}"}))
    if html:
        write_status_html(session, number, ledger=ledger, markdown_text=summary.markdown, known=known)
    return saved


def complete_status(session: SessionLike) -> m.Document | None:
    """After a step that was writing a status summary was cut short: write the latest summary's HTML and charts
    when they are missing or older than its markdown. Returns the HTML's record when it wrote one."""
    latest = latest_status_doc(session.store.documents(session.id))
    if latest is None or latest.number is None:
        return None
    folder = session.paths.docs_dir(session.id)
    md_path, html_path = folder / f"status-{latest.number:03d}.md", folder / f"status-{latest.number:03d}.html"
    if not md_path.exists():
        return None
    if html_path.exists() and html_path.stat().st_mtime >= md_path.stat().st_mtime:
        return None
    return write_status_html(session, latest.number)


def write_status_html(
    session: SessionLike,
    number: int,
    *,
    ledger: Ledger | None = None,
    markdown_text: str | None = None,
    known: dict[str, m.Document] | None = None,
) -> m.Document:
    """Render status summary `number` as HTML with its charts (PNG files under charts/)."""
    from agent import charts

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
        return f"#{e.id} {words}: {change}{verdict}"

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
                tag=f"#{e.id}",
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
    power_exps = [e for e in exps if role(e) in ("baseline", "best")]
    limit = None
    power_series = []
    for e in power_exps:
        points = {}
        for c in ledger.ok_levels(e):
            w, lim = ledger.power_w(e, c)
            if w is not None:
                points[c] = w
                limit = limit or lim
        if points:
            power_series.append(charts.Series(label(e), points, role(e), tag=f"#{e.id}"))
    if power_series:
        out.append(
            (
                "power",
                "Mean power per GPU at each level (baseline and best) against the power limit.",
                charts.power_chart(power_series, title="Power per GPU", limit_w=limit, note=note),
            )
        )
    return out


def list_documents(session: SessionLike) -> list[m.Document]:
    """The session's documents as the ledger records them (improvement documents by item, then summaries)."""
    return session.store.documents(session.id)
