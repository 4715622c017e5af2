"""/metrics (SGLang's Prometheus names), /start_profile and /stop_profile, and /sim/telemetry."""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from agent import models as m
from tools.engines.sim.common import TELEMETRY_WINDOW_S, sched_log


class Histogram:
    """A Prometheus histogram kept as plain counts, so the engine can observe a step's tokens at once."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n

    def buckets(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out


class Scraped(Protocol):
    """What the collector reads from the twin's server (tools/engines/sim/twin_server.py's TwinServer), named here so
    this module does not import the server that mixes its endpoints in."""

    served_model_name: str
    core: Any  # the engine core: running and waiting requests, KV slots and usage
    twin: Any  # the twin: its limits (KV capacity, the running-request cap)
    last_gen_throughput: float
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_total: int
    aborted_total: int
    ttft: Histogram
    itl: Histogram
    e2e: Histogram


class TwinCollector:
    """SGLang's metric names, read from the server's state at scrape time."""

    def __init__(self, server: Scraped) -> None:
        self.server = server

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s = self.server
        labels, values = ["model_name"], [s.served_model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        def histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
            f = HistogramMetricFamily(name, doc, labels=labels)
            f.add_metric(values, h.buckets(), h.sum)
            return f

        core = s.core
        yield gauge("sglang:num_running_reqs", "The number of running requests.", len(core.running))
        yield gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", len(core.waiting))
        yield gauge("sglang:num_used_tokens", "The number of used tokens.", core.used_slots())
        yield gauge("sglang:token_usage", "The token usage.", core.token_usage())
        yield gauge("sglang:gen_throughput", "The generation throughput (token/s).", s.last_gen_throughput)
        yield gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", 0.0)
        yield gauge("sglang:max_total_num_tokens", "The KV pool size in tokens.", s.twin.limits.kv_capacity_tokens)
        yield gauge("sglang:max_running_requests", "The cap on running requests.", s.twin.limits.max_running_requests)
        yield counter("sglang:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total)
        yield counter("sglang:generation_tokens", "Number of generation tokens processed.", s.generation_tokens_total)
        yield counter("sglang:num_requests", "Number of requests processed.", s.requests_total)
        yield counter("sglang:num_aborted_requests", "Number of requests aborted.", s.aborted_total)
        yield histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft)
        yield histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl)
        yield histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                        s.e2e)  # fmt: skip


@dataclass
class ProfileWindow:
    """A /start_profile ... /stop_profile window: the engine's counters when it opened (and closed)."""

    start: dict[str, Any]
    num_steps: int | None = None
    end: dict[str, Any] | None = None


class MetricsMixin:
    """TwinServer's metrics, profile and telemetry endpoints."""

    async def metrics(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(TwinCollector(self))
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _steps(self) -> int:
        return self.core.prefill_index + self.core.decode_index

    def _profile_counters(self) -> dict[str, Any]:
        core = self.core
        return {
            "sim_s": self.sim_now(),
            "breakdown_s": dict(core.breakdown_s),
            "busy_s": core.busy_s,
            "steps": self._steps(),
            "prefill_steps": core.prefill_index,
            "decode_steps": core.decode_index,
        }

    async def start_profile(self, request: web.Request) -> web.Response:
        """Open a profile window (SGLang's `num_steps` closes it by itself after that many steps)."""
        body: dict[str, Any] = {}
        if request.can_read_body:
            with contextlib.suppress(ValueError):
                body = await request.json() or {}
        if self.profile is not None and self.profile.end is None:
            return web.Response(status=400, text="Profiling is already in progress. Call /stop_profile first.\n")
        num_steps = body.get("num_steps") if isinstance(body, dict) else None
        self.profile = ProfileWindow(self._profile_counters(), int(num_steps) if num_steps else None)
        sched_log.info("Profiling starts (simulated: the twin's step-time breakdown).")
        return web.Response(text="Start profiling.\n")

    async def stop_profile(self, request: web.Request) -> web.Response:
        """Close the window: step time by component (seconds and share) over the steps run inside it."""
        p = self.profile
        if p is None:
            return web.Response(status=400, text="Profiling is not in progress. Call /start_profile first.\n")
        end = p.end or self._profile_counters()
        self.profile = None
        seconds = {k: end["breakdown_s"][k] - p.start["breakdown_s"].get(k, 0.0) for k in end["breakdown_s"]}
        total = sum(seconds.values())
        sched_log.info("Profiling done (simulated).")
        return web.json_response(
            {
                "simulated": True,
                "window_s": round(end["sim_s"] - p.start["sim_s"], 6),
                "step_time_s": total,
                "busy_s": end["busy_s"] - p.start["busy_s"],
                "prefill_steps": end["prefill_steps"] - p.start["prefill_steps"],
                "decode_steps": end["decode_steps"] - p.start["decode_steps"],
                "breakdown": {k: {"seconds": v, "share": v / total if total > 0 else 0.0} for k, v in seconds.items()},
            }
        )

    def telemetry_snapshot(self, window_s: float = TELEMETRY_WINDOW_S) -> m.Telemetry:
        """Simulated per-GPU telemetry: power over the last `window_s` simulated seconds, energy since ready."""
        now = self.sim_now()
        window_s = max(min(window_s, now), 1e-9) if now > 0 else 1e-9
        recent = [u for u in self._recent if u[0] > now - window_s]
        busy, tensor, memory = (sum(u[i] for u in recent) for i in (1, 2, 3))
        share = min(busy / window_s, 1.0) if now > 0 else 0.0
        cost, hw, r = self.twin.cost, self.twin.hw, self.twin.resolved
        power = cost.power_w(tensor / window_s, memory / window_s) if now > 0 else hw.idle_w
        core = self.core
        energy = cost.power_w(core.tensor_s / now, core.memory_s / now) * now if now > 0 else 0.0
        mem_mib = (r["weights_gib_per_gpu"] + r["kv_pool_gib_per_gpu"]) * 1024
        gpu = {
            "name": hw.title,
            "samples": 1,
            "power_w_mean": round(power, 1),
            "power_w_p95": round(power, 1),
            "power_w_max": round(power, 1),
            "power_limit_w": hw.tdp_w,
            "util_gpu_pct_mean": round(100 * share, 1),
            "mem_used_mib_max": round(mem_mib, 1),
            "energy_j": round(energy, 3),
        }
        core = self.core
        return m.Telemetry(
            source="simulated",
            gpus=[m.GpuTelemetry(gpu=i, **gpu) for i in range(self.twin.par.gpus)],
            server_metrics={
                "num_running_reqs": float(len(core.running)),
                "num_queue_reqs": float(len(core.waiting)),
                "token_usage": core.token_usage(),
                "gen_throughput": self.last_gen_throughput,
                "sim_time_s": now,
                "busy_s": core.busy_s,
                "window_s": window_s,
            },
        )

    async def telemetry(self, request: web.Request) -> web.Response:
        try:
            window = float(request.query.get("window_s", TELEMETRY_WINDOW_S))
        except ValueError:
            return web.json_response({"error": {"message": "window_s must be a number"}}, status=400)
        return web.Response(text=self.telemetry_snapshot(window).model_dump_json(), content_type="application/json")
