"""A plan item's expected impact as numbers, and the next steps ranked by it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent import models as m
from tools.reports.ledger import Ledger

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
