"""Samples over a level made into `models.Telemetry`: per-GPU mean, p95 and max, energy, server gauges."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from agent.models import GpuTelemetry, Telemetry, utcnow
from tools.telemetry.gpus import GAUGE_KEYS, GpuFrame, GpuReading, NvmlReader, TelemetryUnavailable

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


def _power_integral_j(stamped: Sequence[tuple[float | None, float | None]]) -> float | None:
    """Joules from (time, power) readings by the trapezoid rule; None with fewer than two timed readings.
    NVML's power reading is about a one-second average (STACK.md), so this lags the counter on short levels: on an
    H200 (scripts/nvml_power_check.py, scripts/calibration/h200-nvml-power-check.json) it read 1.8% over the counter
    idle and 5.4% under it over an 8 s bf16 matmul level that ramped from 79 to 698 W."""
    points = [(t, w) for t, w in stamped if t is not None and w is not None and not math.isnan(w)]
    if len(points) < 2:
        return None
    return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in itertools.pairwise(points))


def summarize_gpus(frames: Sequence[GpuFrame]) -> list[GpuTelemetry]:
    """One GpuTelemetry per GPU over these frames (in time order): means, p95, maxima, and joules as the
    difference of the energy counter between the first and the last frame that has it, or, for a GPU without
    the counter, the integral of its power readings over the frames' times."""
    by_gpu: dict[int, list[tuple[float | None, GpuReading]]] = {}
    for frame in frames:
        for r in frame.gpus:
            by_gpu.setdefault(r.gpu, []).append((frame.t_s, r))
    out = []
    for gpu, stamped in sorted(by_gpu.items()):
        rs = [r for _, r in stamped]
        power = [r.power_w for r in rs]
        energies = _values([r.energy_j for r in rs])
        energy = energies[-1] - energies[0] if len(energies) >= 2 else None
        source = "counter" if energy is not None else None
        if energy is None and not energies:
            energy = _power_integral_j([(t, r.power_w) for t, r in stamped])
            source = "power_integral" if energy is not None else None
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
                energy_source=source if energy is not None and energy >= 0 else None,
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


def energy_fields(telemetry: Telemetry | None, output_tokens: int | None) -> dict[str, float]:
    """A level's energy beside its tok/s, from its telemetry: `mean_gpu_power_w` (mean over the GPUs of each GPU's
    mean power) and `energy_per_output_token_j` (joules of all GPUs / output tokens); {} where they are unknown."""
    if telemetry is None or not telemetry.gpus:
        return {}
    out: dict[str, float] = {}
    watts = [g.power_w_mean for g in telemetry.gpus if g.power_w_mean is not None]
    if watts:
        out["mean_gpu_power_w"] = round(sum(watts) / len(watts), 1)
    joules = telemetry.energy_j
    if joules is not None and joules > 0 and output_tokens:
        out["energy_per_output_token_j"] = round(joules / output_tokens, 4)
    return out


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
