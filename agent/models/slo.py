"""The latency SLOs a campaign is judged under, as SGLang's benchmark and vLLM's define them (per request, in
milliseconds), and the load axis a capacity search grows: the vocabulary agent/models/bench.py and
agent/models/objective.py share (bench's levels carry SLO attainment; the objective reads bench's levels), kept
apart so neither imports the other's module for it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Literal

SloMetric = Literal["ttft", "tpot", "e2el"]
SLO_METRICS: tuple[SloMetric, ...] = ("ttft", "tpot", "e2el")
SLO_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2E latency"}
LoadAxis = Literal["concurrency", "request_rate"]

_PAIR = re.compile(r"^\s*([A-Za-z0-9_]+)\s*:\s*(\S+)\s*$")


def check_slos(slos: Mapping[str, float]) -> dict[SloMetric, float]:
    """SLOs in SGLang's order (ttft, tpot, e2el) after SGLang's own checks: a known metric, a positive finite number
    of milliseconds; ValueError (in words a user can act on) otherwise."""
    out: dict[SloMetric, float] = {}
    for name, value in slos.items():
        if name not in SLO_METRICS:
            raise ValueError(f"unknown SLO {name!r}: the SLOs are ttft, tpot and e2el (milliseconds)")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"SLO {name} must be a number of milliseconds, not {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"SLO {name} must be a positive, finite number of milliseconds (got {value})")
        out[name] = float(value)  # type: ignore[index]
    return {k: out[k] for k in SLO_METRICS if k in out}


def parse_slos(text: str | Iterable[str]) -> dict[SloMetric, float]:
    """SLOs from SGLang's `--goodput` pairs: "ttft:500 tpot:50", "ttft:500,tpot:50" or a list of pairs (ms).

    Raises ValueError for a pair that is not METRIC:MS, an unknown metric, a value that is not a positive finite
    number, or a metric given twice (SGLang refuses the same)."""
    tokens = text.replace(",", " ").split() if isinstance(text, str) else [p for t in text for p in t.split(",")]
    tokens = [t for t in tokens if t.strip()]
    if not tokens:
        raise ValueError("no SLO given: write them as ttft:500,tpot:50 (milliseconds)")
    slos: dict[str, float] = {}
    for token in tokens:
        match = _PAIR.match(token)
        if not match:
            raise ValueError(f"{token!r} is not an SLO: write METRIC:MILLISECONDS, e.g. ttft:500")
        name, raw = match.group(1).lower(), match.group(2)
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"SLO {name} must be a number of milliseconds, not {raw!r}") from None
        if name in slos:
            raise ValueError(f"SLO {name} is given twice")
        slos[name] = value
    return check_slos(slos)


def slo_text(slos: Mapping[str, float]) -> str:
    """The SLOs in words: "TTFT <= 500 ms, TPOT <= 50 ms"."""
    return ", ".join(f"{SLO_LABELS[k]} <= {v:g} ms" for k, v in slos.items())
