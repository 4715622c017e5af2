"""A server's Prometheus `/metrics`: the engine's gauges, one number each across schedulers."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

import httpx

from agent.errors import PivotError
from tools.telemetry.gpus import _ACROSS_DP, DP_LABELS
from tools.telemetry.twin import _base, _client


class MetricsUnavailable(PivotError):
    """The server's /metrics cannot be read."""


def parse_metrics(text: str, gauges: Mapping[str, str]) -> dict[str, float]:
    """An engine's gauges from Prometheus text, one number each (series of several schedulers combined).

    `gauges` maps pivot's names (GAUGE_KEYS: num_running_reqs, num_queue_reqs, token_usage, gen_throughput) to the
    engine's metric names (`Engine.gauges`); keys are pivot's, and a gauge the server does not export is absent.
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {v: k for k, v in gauges.items() if k in _ACROSS_DP}
    per_dp: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        key = wanted.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.name != family.name or math.isnan(sample.value):
                continue
            dp = next((str(sample.labels[x]) for x in DP_LABELS if x in sample.labels), "0")
            groups = per_dp.setdefault(key, {})
            groups[dp] = max(groups.get(dp, -math.inf), float(sample.value))
    out: dict[str, float] = {}
    for key, groups in per_dp.items():
        out[key] = sum(groups.values()) if _ACROSS_DP[key] == "sum" else max(groups.values())
    return out


def scrape_metrics(base_url: str, *, gauges: Mapping[str, str], client: httpx.Client | None = None) -> dict[str, float]:
    """`GET /metrics` of a server, parsed by parse_metrics for the engine's `gauges`; MetricsUnavailable with the
    reason when it cannot be read."""
    url = _base(base_url) + "/metrics"
    try:
        with contextlib.ExitStack() as stack:
            http = client or stack.enter_context(_client())
            r = http.get(url)
    except httpx.HTTPError as e:
        raise MetricsUnavailable(f"cannot read {url}: {type(e).__name__}: {e}") from e
    if r.status_code == 404:
        raise MetricsUnavailable(
            f"GET {url} answered 404", hint="start the server with its metrics on (SGLang: --enable-metrics)"
        )
    if r.status_code != 200:
        raise MetricsUnavailable(f"GET {url} answered {r.status_code}")
    try:
        return parse_metrics(r.text, gauges)
    except ValueError as e:
        raise MetricsUnavailable(f"GET {url} is not Prometheus text: {e}") from e
