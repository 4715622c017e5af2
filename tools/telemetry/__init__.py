"""GPU and server telemetry over benchmark levels: NVML (or the twin's /sim/telemetry) and the server's /metrics.

Two background threads sample while a server is benchmarked: one reads every GPU (NVML through
`pynvml`, from the nvidia-ml-py package; on the twin, `GET /sim/telemetry`), one scrapes the server's
Prometheus `/metrics` for the engine's gauges (`Engine.gauges` maps pivot's names, GAUGE_KEYS, to the engine's:
SGLang's `sglang:num_running_reqs`, vLLM's `vllm:num_requests_running`, ...).
`TelemetryRecorder.mark_level()` / `end_level()` bracket a benchmark level; each level becomes one
`models.Telemetry`: per GPU the mean, p95 and max power, the enforced limit, utilization, clocks, peak memory,
peak temperature and the joules from the GPU's total-energy counter (NVML's power reading is a ~1 s average, the
counter is exact), plus the server's queue and KV usage and the output tokens per joule. Nothing here raises into
a run: without a driver the level says source "unavailable" and error "NVML unavailable: ...", a server without
its metrics (SGLang's `--enable-metrics`) leaves `server_metrics` empty with the reason in `error`.

    recorder = TelemetryRecorder("http://127.0.0.1:30000", gauges=engine.gauges)   # simulated=True for the twin
    recorder.start()
    recorder.mark_level(64)
    ...                                                        # the level's load
    telemetry = recorder.end_level(output_tokens=level.total_output_tokens)
    recorder.stop()

or hand `recorder.on_progress` to the load generator, which marks and ends levels itself (`recorder.levels`,
complete after `recorder.flush()` or `stop()`).
"""

from __future__ import annotations

from tools.telemetry.gpus import (
    DEFAULT_INTERVAL_S,
    DEFAULT_METRICS_INTERVAL_S,
    DP_LABELS,
    GAUGE_KEYS,
    HTTP_TIMEOUT_S,
    NVML_UNAVAILABLE,
    GpuFrame,
    GpuReading,
    NvmlReader,
    TelemetryUnavailable,
)
from tools.telemetry.recorder import LevelHandle, PeriodicSampler, TelemetryRecorder
from tools.telemetry.scrape import MetricsUnavailable, parse_metrics, scrape_metrics
from tools.telemetry.summary import (
    read_gpus,
    snapshot_gpus,
    summarize_gpus,
    summarize_server_metrics,
    tokens_per_joule,
)
from tools.telemetry.twin import TwinReader, read_twin_telemetry

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_METRICS_INTERVAL_S",
    "DP_LABELS",
    "GAUGE_KEYS",
    "HTTP_TIMEOUT_S",
    "NVML_UNAVAILABLE",
    "GpuFrame",
    "GpuReading",
    "LevelHandle",
    "MetricsUnavailable",
    "NvmlReader",
    "PeriodicSampler",
    "TelemetryRecorder",
    "TelemetryUnavailable",
    "TwinReader",
    "parse_metrics",
    "read_gpus",
    "read_twin_telemetry",
    "scrape_metrics",
    "snapshot_gpus",
    "summarize_gpus",
    "summarize_server_metrics",
    "tokens_per_joule",
]
