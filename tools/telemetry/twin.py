"""The twin's GPU readings: `GET /sim/telemetry` on the simulated server, in the shape NVML gives."""

from __future__ import annotations

import contextlib
from typing import Literal

import httpx

from agent.models import Telemetry
from tools.telemetry.gpus import GAUGE_KEYS, HTTP_TIMEOUT_S, GpuFrame, GpuReading, TelemetryUnavailable
from tools.tls import tls_context

# ------------------------------------------------------------------------------------------------ the twin


def _client() -> httpx.Client:
    return httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False, verify=tls_context())


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
