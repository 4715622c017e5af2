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

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import Any, Generic, Literal, TypeVar

import httpx
import numpy as np

from agent.errors import PivotError
from agent.models import GpuTelemetry, Telemetry, utcnow

DEFAULT_INTERVAL_S = 0.2
DEFAULT_METRICS_INTERVAL_S = 0.5
HTTP_TIMEOUT_S = 2.0
NVML_UNAVAILABLE = "NVML unavailable"
# pivot's names for a server's gauges (each engine maps them to its own Prometheus names, `Engine.gauges`), and how
# one gauge's series from several schedulers add up: within one data-parallel rank, the series of its TP/PP ranks
# describe the same requests (max); across DP ranks requests add up (sum), KV usage (a fraction of the pool) does not.
_ACROSS_DP = {"num_running_reqs": "sum", "num_queue_reqs": "sum", "token_usage": "max", "gen_throughput": "sum"}
GAUGE_KEYS = tuple(_ACROSS_DP)
DP_LABELS = ("dp_rank", "engine")  # the label that tells data-parallel ranks apart: SGLang's, vLLM's
_NOT_SUPPORTED = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")


class TelemetryUnavailable(PivotError):
    """GPU readings cannot be had here (no driver, no bindings, no twin answering)."""


@dataclass(slots=True)
class GpuReading:
    """One GPU at one moment; None where the GPU or driver does not report the quantity."""

    gpu: int
    name: str | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    mem_used_mib: float | None = None
    temperature_c: float | None = None
    energy_j: float | None = None  # the total-energy counter (since driver load; on the twin, since ready)


@dataclass(slots=True)
class GpuFrame:
    """All GPUs read at one moment, and (from the twin only) the server's state at that moment."""

    gpus: list[GpuReading]
    server: dict[str, float] | None = None


# ------------------------------------------------------------------------------------------------ NVML


def _load_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as e:
        raise TelemetryUnavailable(
            f"{NVML_UNAVAILABLE}: the nvidia-ml-py package (module pynvml) is not installed",
            hint="pip install nvidia-ml-py",
        ) from e
    return pynvml


class NvmlReader:
    """Reads every GPU through NVML; quantities a GPU does not support are left None (and not asked again)."""

    source: Literal["measured"] = "measured"

    def __init__(self, nvml: ModuleType | None = None, gpus: Sequence[int] | None = None) -> None:
        self.nvml = nvml if nvml is not None else _load_pynvml()
        error = getattr(self.nvml, "NVMLError", Exception)
        try:
            self.nvml.nvmlInit()
        except error as e:
            raise TelemetryUnavailable(
                f"{NVML_UNAVAILABLE}: {e}", hint="no NVIDIA driver here; for the twin's GPUs read /sim/telemetry"
            ) from e
        except (OSError, AttributeError) as e:
            raise TelemetryUnavailable(f"{NVML_UNAVAILABLE}: {type(e).__name__}: {e}") from e
        self._open = True
        try:
            count = int(self.nvml.nvmlDeviceGetCount())
            indices = list(range(count)) if gpus is None else list(gpus)
            bad = [i for i in indices if not 0 <= i < count]
            if bad:
                raise TelemetryUnavailable(f"no GPU {bad[0]} here: NVML sees {count} GPU(s)")
            self.handles = {i: self.nvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
        except error as e:
            self.close()
            raise TelemetryUnavailable(f"{NVML_UNAVAILABLE}: {e}") from e
        except TelemetryUnavailable:
            self.close()
            raise
        self.unsupported: set[tuple[int, str]] = set()
        self.last_error: str | None = None
        self.names = {i: self._name(h) for i, h in self.handles.items()}

    def _name(self, handle: Any) -> str | None:
        name = self._call(-1, "name", lambda: self.nvml.nvmlDeviceGetName(handle))
        return name.decode(errors="replace") if isinstance(name, bytes) else name

    def _call(self, gpu: int, what: str, fn: Callable[[], Any]) -> Any:
        """fn(), or None when this GPU does not support it (remembered) or the read failed (kept in last_error)."""
        if (gpu, what) in self.unsupported:
            return None
        try:
            return fn()
        except AttributeError:  # bindings too old to have the function
            self.unsupported.add((gpu, what))
            return None
        except getattr(self.nvml, "NVMLError", Exception) as e:
            codes = {getattr(self.nvml, c, None) for c in _NOT_SUPPORTED} - {None}
            if getattr(e, "value", None) in codes:
                self.unsupported.add((gpu, what))
            else:
                self.last_error = f"GPU {gpu}: {what}: {e}"
            return None

    def _memory_used_mib(self, gpu: int, handle: Any) -> float | None:
        nvml = self.nvml

        def v2() -> Any:  # v2 'used' excludes the driver's reserved memory (STACK.md)
            return nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)

        if (gpu, "memory_v2") not in self.unsupported:
            try:
                return v2().used / 2**20
            except (TypeError, AttributeError, getattr(nvml, "NVMLError", Exception)):
                self.unsupported.add((gpu, "memory_v2"))
        info = self._call(gpu, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        return None if info is None else info.used / 2**20

    def read(self) -> GpuFrame:
        nvml, out = self.nvml, []
        for i, h in self.handles.items():
            power = self._call(i, "power", lambda h=h: nvml.nvmlDeviceGetPowerUsage(h))
            limit = self._call(i, "power_limit", lambda h=h: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
            util = self._call(i, "utilization", lambda h=h: nvml.nvmlDeviceGetUtilizationRates(h))
            sm = self._call(i, "sm_clock", lambda h=h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
            mem = self._call(i, "mem_clock", lambda h=h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))
            temp = self._call(i, "temperature", lambda h=h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
            energy = self._call(i, "energy", lambda h=h: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            out.append(
                GpuReading(
                    gpu=i,
                    name=self.names.get(i),
                    power_w=None if power is None else power / 1000,  # mW
                    power_limit_w=None if limit is None else limit / 1000,
                    util_gpu_pct=None if util is None else float(util.gpu),
                    util_mem_pct=None if util is None else float(util.memory),
                    sm_clock_mhz=None if sm is None else float(sm),
                    mem_clock_mhz=None if mem is None else float(mem),
                    mem_used_mib=self._memory_used_mib(i, h),
                    temperature_c=None if temp is None else float(temp),
                    energy_j=None if energy is None else energy / 1000,  # mJ
                )
            )
        return GpuFrame(out)

    def close(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()


# ------------------------------------------------------------------------------------------------ the twin


def _client() -> httpx.Client:
    return httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False)


def _base(base_url: str) -> str:
    url = base_url.strip().rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def read_twin_telemetry(
    base_url: str, *, window_s: float | None = None, client: httpx.Client | None = None
) -> Telemetry:
    """The twin's simulated GPUs now (`GET /sim/telemetry` of `pivot sim serve`): Telemetry(source="simulated").

    Raises TelemetryUnavailable when nothing answers there or the answer is not the twin's.
    """
    url = _base(base_url) + "/sim/telemetry"
    params = {"window_s": window_s} if window_s is not None else None
    try:
        with contextlib.ExitStack() as stack:
            http = client or stack.enter_context(_client())
            r = http.get(url, params=params)
    except httpx.HTTPError as e:
        raise TelemetryUnavailable(
            f"cannot read {url}: {type(e).__name__}: {e}", hint="is `pivot sim serve` running at that address?"
        ) from e
    if r.status_code != 200:
        raise TelemetryUnavailable(
            f"GET {url} answered {r.status_code}", hint="/sim/telemetry exists only on the twin (`pivot sim serve`)"
        )
    try:
        return Telemetry.model_validate_json(r.content)
    except ValueError as e:
        raise TelemetryUnavailable(f"GET {url} did not answer with the twin's telemetry: {e}") from e


class TwinReader:
    """Reads the twin's simulated GPUs (and its server state) from /sim/telemetry."""

    source: Literal["simulated"] = "simulated"

    def __init__(self, base_url: str) -> None:
        self.base_url = _base(base_url)
        self._http = _client()
        read_twin_telemetry(self.base_url, client=self._http)  # fail now if it is not there

    def read(self) -> GpuFrame:
        t = read_twin_telemetry(self.base_url, client=self._http)
        gpus = [
            GpuReading(
                gpu=g.gpu,
                name=g.name,
                power_w=g.power_w_mean,
                power_limit_w=g.power_limit_w,
                util_gpu_pct=g.util_gpu_pct_mean,
                util_mem_pct=g.util_mem_pct_mean,
                sm_clock_mhz=g.sm_clock_mhz_mean,
                mem_clock_mhz=g.mem_clock_mhz_mean,
                mem_used_mib=g.mem_used_mib_max,
                temperature_c=g.temperature_c_max,
                energy_j=g.energy_j,
            )
            for g in t.gpus
        ]
        server = {k: v for k, v in t.server_metrics.items() if k in GAUGE_KEYS}
        return GpuFrame(gpus, server)

    def close(self) -> None:
        self._http.close()


# ------------------------------------------------------------------------------------------------ /metrics


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


# ------------------------------------------------------------------------------------------------ summaries


def _values(xs: Sequence[float | None]) -> list[float]:
    return [float(x) for x in xs if x is not None and not math.isnan(x)]


def _mean(xs: Sequence[float | None]) -> float | None:
    v = _values(xs)
    return sum(v) / len(v) if v else None


def _max(xs: Sequence[float | None]) -> float | None:
    v = _values(xs)
    return max(v) if v else None


def _p95(xs: Sequence[float | None]) -> float | None:
    v = _values(xs)
    return float(np.percentile(v, 95)) if v else None  # numpy's default (linear between closest ranks)


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def summarize_gpus(frames: Sequence[GpuFrame]) -> list[GpuTelemetry]:
    """One GpuTelemetry per GPU over these frames (in time order): means, p95, maxima, and joules as the
    difference of the energy counter between the first and the last frame that has it."""
    by_gpu: dict[int, list[GpuReading]] = {}
    for frame in frames:
        for r in frame.gpus:
            by_gpu.setdefault(r.gpu, []).append(r)
    out = []
    for gpu, rs in sorted(by_gpu.items()):
        power = [r.power_w for r in rs]
        energies = _values([r.energy_j for r in rs])
        energy = energies[-1] - energies[0] if len(energies) >= 2 else None
        limits = _values([r.power_limit_w for r in rs])
        out.append(
            GpuTelemetry(
                gpu=gpu,
                name=next((r.name for r in rs if r.name), None),
                samples=len(rs),
                power_w_mean=_round(_mean(power)),
                power_w_p95=_round(_p95(power)),
                power_w_max=_round(_max(power)),
                power_limit_w=limits[-1] if limits else None,
                util_gpu_pct_mean=_round(_mean([r.util_gpu_pct for r in rs])),
                util_mem_pct_mean=_round(_mean([r.util_mem_pct for r in rs])),
                sm_clock_mhz_mean=_round(_mean([r.sm_clock_mhz for r in rs])),
                mem_clock_mhz_mean=_round(_mean([r.mem_clock_mhz for r in rs])),
                mem_used_mib_max=_round(_max([r.mem_used_mib for r in rs])),
                temperature_c_max=_max([r.temperature_c for r in rs]),
                energy_j=_round(energy) if energy is not None and energy >= 0 else None,  # <0: the counter reset
            )
        )
    return out


def summarize_server_metrics(samples: Sequence[dict[str, float]]) -> dict[str, float]:
    """A level's server state from /metrics samples: mean and max running requests, mean and max queued,
    mean and max KV token usage (1.0 is a full pool), mean and max generation throughput, and the count."""
    if not samples:
        return {}
    out: dict[str, float] = {"metrics_samples": float(len(samples))}
    for key in GAUGE_KEYS:
        series = [s.get(key) for s in samples]
        if not _values(series):
            continue
        out[f"{key}_mean"] = round(_mean(series) or 0.0, 4)
        out[f"{key}_max"] = round(_max(series) or 0.0, 4)
    return out


def tokens_per_joule(output_tokens: int | None, gpus: Sequence[GpuTelemetry]) -> float | None:
    """Output tokens per joule of all GPUs together; None unless every GPU has its energy."""
    if output_tokens is None or not gpus or any(g.energy_j is None for g in gpus):
        return None
    joules = sum(g.energy_j or 0.0 for g in gpus)
    return round(output_tokens / joules, 6) if joules > 0 else None


def snapshot_gpus(frame: GpuFrame) -> list[GpuTelemetry]:
    """One frame as GpuTelemetry (samples=1); energy_j is the counter's reading itself (since driver load, or on
    the twin since ready), as /sim/telemetry reports it."""
    gpus = summarize_gpus([frame])
    counters = {r.gpu: r.energy_j for r in frame.gpus}
    return [g.model_copy(update={"energy_j": _round(counters.get(g.gpu))}) for g in gpus]


def read_gpus(*, nvml: ModuleType | None = None, gpus: Sequence[int] | None = None) -> Telemetry:
    """This host's GPUs now, through NVML: Telemetry(source="measured"), or "unavailable" with the reason.

    energy_j is each GPU's total-energy counter (joules since the driver loaded)."""
    try:
        reader = NvmlReader(nvml, gpus)
    except TelemetryUnavailable as e:
        return Telemetry(source="unavailable", error=e.message)
    try:
        frame = reader.read()
        return Telemetry(source="measured", started_at=utcnow(), gpus=snapshot_gpus(frame), error=reader.last_error)
    finally:
        reader.close()


# ------------------------------------------------------------------------------------------------ sampling

T = TypeVar("T")


class PeriodicSampler(Generic[T]):
    """Calls `read` every `interval_s` in a daemon thread; keeps the latest value, and every value while recording.

    A failing read is counted and its message kept (`errors`, `last_error`); sampling goes on.
    """

    def __init__(self, name: str, read: Callable[[], T], interval_s: float) -> None:
        if interval_s <= 0:
            raise PivotError(f"the sampling interval must be > 0 s (got {interval_s})")
        self.name, self.read, self.interval_s = name, read, interval_s
        self.latest: T | None = None
        self.recorded: list[T] = []
        self.recording = False
        self.errors = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> T | None:
        """Read once now (from any thread); the value, or None if the read failed."""
        with self._lock:
            try:
                value = self.read()
            except Exception as e:  # a sampler never raises into a run
                self.errors += 1
                self.last_error = e.message if isinstance(e, PivotError) else f"{type(e).__name__}: {e}"
                return None
            self.latest = value
            if self.recording:
                self.recorded.append(value)
            return value

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample()
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind: skip the missed ticks rather than burst
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"pivot-{self.name}", daemon=True)
            self._thread.start()

    def begin(self) -> None:
        """Start recording afresh (the values of an earlier window are dropped)."""
        with self._lock:
            self.recorded = []
            self.errors = 0
            self.last_error = None
            self.recording = True

    def finish(self) -> list[T]:
        """Stop recording; the values recorded since begin()."""
        with self._lock:
            self.recording = False
            values, self.recorded = self.recorded, []
            return values

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


@dataclass
class _Level:
    max_concurrency: int
    started_at: datetime


@dataclass
class LevelHandle:
    """What `TelemetryRecorder.level()` yields: set `output_tokens` inside; `telemetry` is there after the block."""

    max_concurrency: int
    output_tokens: int | None = None
    telemetry: Telemetry | None = None


@dataclass
class TelemetryRecorder:
    """Samples GPUs and the server's /metrics in the background and summarizes them per benchmark level.

    `base_url` is the server (None: GPUs only). `simulated=True` reads the twin's /sim/telemetry instead of
    NVML (and its server state when /metrics is off). `nvml` replaces the pynvml module (tests).
    Never raises into a run: what cannot be read is reported in each Telemetry's `error`.
    """

    base_url: str | None = None
    simulated: bool = False
    interval_s: float = DEFAULT_INTERVAL_S
    metrics_interval_s: float = DEFAULT_METRICS_INTERVAL_S
    nvml: ModuleType | None = None
    gpus: Sequence[int] | None = None
    gauges: Mapping[str, str] = field(default_factory=dict)  # the engine's (Engine.gauges): none, no /metrics scrape
    levels: list[Telemetry] = field(default_factory=list)  # every level ended, in order

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.metrics_interval_s <= 0:
            raise PivotError("sampling intervals must be > 0 s")
        if self.simulated and not self.base_url:
            raise PivotError("simulated telemetry needs the twin's base_url")
        self._reader: NvmlReader | TwinReader | None = None
        self._gpu_error: str | None = None
        self._gpu: PeriodicSampler[GpuFrame] | None = None
        self._metrics: PeriodicSampler[dict[str, float]] | None = None
        self._http: httpx.Client | None = None
        self._level: _Level | None = None
        self._started = False
        self._worker: ThreadPoolExecutor | None = None
        self._pending: list[Future[Any]] = []
        self._progress_level: int | None = None

    # ---- lifecycle

    def start(self) -> TelemetryRecorder:
        """Open NVML (or the twin) and start the sampling threads; safe to call twice."""
        if self._started:
            return self
        self._started = True
        try:
            self._reader = TwinReader(self.base_url or "") if self.simulated else NvmlReader(self.nvml, self.gpus)
        except TelemetryUnavailable as e:
            self._gpu_error = e.message
        except Exception as e:  # never into the run
            self._gpu_error = f"{NVML_UNAVAILABLE}: {type(e).__name__}: {e}"
        if self._reader is not None:
            self._gpu = PeriodicSampler("gpu-telemetry", self._reader.read, self.interval_s)
            self._gpu.start()
        if self.base_url and self.gauges:
            self._http = _client()
            base, http, gauges = self.base_url, self._http, self.gauges
            self._metrics = PeriodicSampler("server-metrics", lambda: scrape_metrics(base, gauges=gauges, client=http),
                                            self.metrics_interval_s)  # fmt: skip
            self._metrics.start()
        return self

    def stop(self) -> None:
        """Finish the marks in progress, stop the threads and close NVML; safe to call twice."""
        self.flush()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        for sampler in (self._gpu, self._metrics):
            if sampler is not None:
                sampler.stop()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._http is not None:
            self._http.close()
            self._http = None
        self._gpu = self._metrics = None
        self._started = False

    def __enter__(self) -> TelemetryRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def source(self) -> Literal["measured", "simulated", "unavailable"]:
        if self._reader is None:
            return "unavailable"
        return self._reader.source

    # ---- levels

    def mark_level(self, concurrency: int) -> None:
        """A benchmark level at this max_concurrency starts now (an open level is ended first, without tokens)."""
        if not self._started:
            self.start()
        if self._level is not None:
            self.end_level()
        if isinstance(self._reader, NvmlReader):
            self._reader.last_error = None
        for sampler in (self._gpu, self._metrics):
            if sampler is not None:
                sampler.begin()
                sampler.sample()  # the level's first reading (and the energy counter's start) at the mark
        self._level = _Level(concurrency, utcnow())

    def end_level(self, output_tokens: int | None = None) -> Telemetry:
        """The level since mark_level() as one Telemetry (also appended to `levels`); never raises."""
        level, self._level = self._level, None
        if level is None:
            return Telemetry(source=self.source, error="end_level() without mark_level(): no level was recorded")
        try:
            telemetry = self._summarize(level, output_tokens)
        except Exception as e:  # never into the run
            telemetry = Telemetry(source=self.source, max_concurrency=level.max_concurrency,
                                  started_at=level.started_at, finished_at=utcnow(), output_tokens=output_tokens,
                                  error=f"telemetry could not be summarized: {type(e).__name__}: {e}")  # fmt: skip
        self.levels.append(telemetry)
        return telemetry

    def _summarize(self, level: _Level, output_tokens: int | None) -> Telemetry:
        frames: list[GpuFrame] = []
        metrics: list[dict[str, float]] = []
        errors: list[str] = []
        if self._gpu is not None:
            self._gpu.sample()  # the counter's end at the mark
            if self._gpu.last_error:
                errors.append(f"GPU readings: {self._gpu.last_error} ({self._gpu.errors} failed)")
            frames = self._gpu.finish()
        elif self._gpu_error:
            errors.append(self._gpu_error)
        if self._reader is not None and isinstance(self._reader, NvmlReader) and self._reader.last_error:
            errors.append(self._reader.last_error)
        if self._metrics is not None:
            self._metrics.sample()
            metrics = self._metrics.finish()
            if not metrics and self.simulated:
                metrics = [f.server for f in frames if f.server]  # the twin without --enable-metrics
            elif self._metrics.last_error:
                errors.append(f"server metrics: {self._metrics.last_error}")
        gpus = summarize_gpus(frames)
        return Telemetry(
            source=self.source,
            max_concurrency=level.max_concurrency,
            started_at=level.started_at,
            finished_at=utcnow(),
            gpus=gpus,
            server_metrics=summarize_server_metrics(metrics),
            error="; ".join(errors) or None,
            output_tokens=output_tokens,
            output_tokens_per_j=tokens_per_joule(output_tokens, gpus),
        )

    @contextlib.contextmanager
    def level(self, concurrency: int) -> Iterator[LevelHandle]:
        """mark_level() on entry, end_level(handle.output_tokens) on exit; the result in handle.telemetry."""
        handle = LevelHandle(concurrency)
        self.mark_level(concurrency)
        try:
            yield handle
        finally:
            handle.telemetry = self.end_level(handle.output_tokens)

    def on_progress(self, progress: Any) -> None:
        """A load generator's progress callback (tools.loadgen.LevelProgress): marks and ends its levels.

        The readings at the marks are taken on a worker thread, so the load generator's event loop never
        waits for NVML or /metrics; the levels are in `levels` after flush() (stop() flushes too).
        """
        phase = getattr(progress, "phase", None)
        concurrency = int(getattr(progress, "max_concurrency", 0) or 0)
        if phase == "running" and self._progress_level != concurrency:
            self._progress_level = concurrency
            self._submit(self.mark_level, concurrency)
        elif phase == "done":
            if self._progress_level != concurrency:
                self._submit(self.mark_level, concurrency)
            self._progress_level = None
            level = getattr(progress, "level", None)
            self._submit(self.end_level, getattr(level, "total_output_tokens", None))

    def _submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pivot-telemetry-marks")
        self._pending.append(self._worker.submit(fn, *args))

    def flush(self) -> None:
        """Wait until the marks handed over by on_progress() are done."""
        pending, self._pending = self._pending, []
        for future in pending:
            with contextlib.suppress(Exception):  # end_level never raises; a failed mark leaves no level
                future.result()

    def snapshot(self) -> Telemetry:
        """Readings now (one sample per GPU, the server's gauges now): what Deployment.telemetry() returns."""
        if not self._started:
            self.start()
        errors: list[str] = []
        gpus: list[GpuTelemetry] = []
        frame = None
        if self._gpu is not None:
            frame = self._gpu.sample()
            if frame is None:
                errors.append(f"GPU readings: {self._gpu.last_error}")
            else:
                gpus = snapshot_gpus(frame)
        elif self._gpu_error:
            errors.append(self._gpu_error)
        server: dict[str, float] = {}
        if self._metrics is not None:
            server = self._metrics.sample() or {}
            if not server and frame is not None and frame.server:
                server = dict(frame.server)
            elif not server and self._metrics.last_error:
                errors.append(f"server metrics: {self._metrics.last_error}")
        return Telemetry(source=self.source, started_at=utcnow(), gpus=gpus, server_metrics=server,
                         error="; ".join(errors) or None)  # fmt: skip
