"""A plan item's expected impact as numbers, and the next steps ranked by it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent import models as m
from tools.reports.ledger import Ledger

_RANGE = re.compile(r"(?P<sign>[+\-−]?)\s*(?P<lo>\d+(?:\.\d+)?)\s*(?:-|–|to)\s*(?P<hi>\d+(?:\.\d+)?)\s*%")
_SINGLE = re.compile(r"(?P<sign>[+\-−])\s*(?P<lo>\d+(?:\.\d+)?)\s*%")
_CONC_RANGE = re.compile(r"concurrency\s+(\d+)(?:\s*(?:-|–|to)\s*(\d+))?", re.IGNORECASE)


# What an expected impact names, by the words after its number (first match wins): the metric (a bench_levels
# column, or `capacity`), its words, and whether a drop of it is the gain (latency, energy per token, power).
_METRICS: tuple[tuple[tuple[str, ...], str, str, bool], ...] = (
    (("tpot",), "mean_tpot_ms", "mean TPOT", True),
    (("ttft",), "mean_ttft_ms", "mean TTFT", True),
    (("j per", "j/tok", "joule per", "joules per", "j per output"), "energy_per_output_token_j",
     "J per output token", True),
    (("tok/j", "tokens per joule", "tokens/j", "token per joule"), "tokens_per_joule", "output tokens per joule",
     False),
    (("w per gpu", "watt", "power"), "mean_gpu_power_w", "W per GPU", True),
    (("good req", "request goodput"), "request_goodput", "good req/s", False),
    (("token goodput", "good output tok", "good tok"), "token_goodput_tok_s", "good output tok/s", False),
    (("goodput",), "request_goodput", "good req/s", False),
    (("capacity", "concurrent requests"), "capacity", "capacity", False),
    (("total",), "total_throughput", "total tok/s", False),
)  # fmt: skip
_THROUGHPUT = ("output_throughput", "output tok/s", False)
# The objective (agent/models/objective.py's kind) each metric's expectation speaks for: a throughput-like gain is a
# gain for every objective; an energy or power drop only for the energy objective; a latency for none.
_SPEAKS_FOR = {
    "mean_tpot_ms": (),
    "mean_ttft_ms": (),
    "energy_per_output_token_j": ("energy",),
    "tokens_per_joule": ("energy",),
    "mean_gpu_power_w": ("energy",),
}


@dataclass(frozen=True)
class Expectation:
    """An expected impact as numbers: a % range of one metric, at some concurrency levels."""

    low_pct: float
    high_pct: float
    metric: str  # a bench_levels column (output_throughput, mean_tpot_ms, energy_per_output_token_j, ...) or capacity
    metric_words: str
    levels: tuple[int, int] | None  # inclusive concurrency range, None: the top level
    where: str  # low | high | any
    lower_is_better: bool = False  # a drop is the gain (TPOT, J per token, W)

    @property
    def midpoint_pct(self) -> float:
        return (self.low_pct + self.high_pct) / 2

    @property
    def gain_pct(self) -> float:
        """The midpoint as a gain: "-15% J per token" is a 15% gain."""
        return -self.midpoint_pct if self.lower_is_better else self.midpoint_pct

    @property
    def best_gain_pct(self) -> float:
        """The most the range promises, as a gain."""
        return -self.low_pct if self.lower_is_better else self.high_pct

    def speaks_for(self, objective: str = "throughput") -> bool:
        """Whether the expectation says what a change does to `objective` (a kind: throughput, goodput, capacity,
        energy): a latency never does; an energy or power expectation only for energy."""
        return objective in _SPEAKS_FOR.get(self.metric, (objective,))


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
    metric, words, lower = _THROUGHPUT
    named = []  # (where in the text, the metric): the metric named first after the number is the one it expects
    for keys, *found in (*_METRICS, (("output tok/s", "tok/s", "throughput"), *_THROUGHPUT)):
        at = [after.find(k) for k in keys if k in after]
        if at:
            named.append((min(at), tuple(found)))
    if named:
        metric, words, lower = min(named, key=lambda pair: pair[0])[1]
    levels = None
    conc = _CONC_RANGE.search(text)
    if conc:
        a = int(conc.group(1))
        b = int(conc.group(2)) if conc.group(2) else a
        levels = (min(a, b), max(a, b))
    lowered = text.lower()
    where = "low" if "low concurrency" in lowered and "high" not in lowered else "high" if "high" in lowered else "any"
    return Expectation(lo, hi, metric, words, levels, where, lower)


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
