"""The background samplers and the recorder that brackets benchmark levels with telemetry."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import Any, Generic, Literal, TypeVar

import httpx

from agent.errors import PivotError
from agent.models import GpuTelemetry, Telemetry, utcnow
from tools.telemetry.gpus import (
    DEFAULT_INTERVAL_S,
    DEFAULT_METRICS_INTERVAL_S,
    NVML_UNAVAILABLE,
    GpuFrame,
    NvmlReader,
    TelemetryUnavailable,
)
from tools.telemetry.scrape import scrape_metrics
from tools.telemetry.summary import snapshot_gpus, summarize_gpus, summarize_server_metrics, tokens_per_joule
from tools.telemetry.twin import TwinReader, _client

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
