"""GPU readings: what one GPU reports at one moment, and the NVML reader that takes them.

Also the constants the telemetry shares (intervals, pivot gauge names, the data-parallel labels).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from agent.errors import PivotError

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
    t_s: float | None = None  # when it was read (time.monotonic), for the power integral of a GPU without the counter


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
        return GpuFrame(out, t_s=time.monotonic())

    def close(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
