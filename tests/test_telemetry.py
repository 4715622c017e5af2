"""GPU telemetry from NVML (a fake pynvml here), per-level summaries checked by hand, and SGLang's /metrics parsed."""

from __future__ import annotations

import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from agent.cli import cli
from agent.models import GpuTelemetry, Telemetry
from tools import telemetry as tm
from tools.engines.sglang import GAUGES
from tools.telemetry import GpuFrame, GpuReading, TelemetryRecorder

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__({3: "Not Supported", 12: "NVML Shared Library Not Found", 15: "GPU is lost"}.get(value, "?"))
        self.value = value


def fake_pynvml(gpus: int = 2, *, driver: bool = True, energy: bool = True, memory_v2: bool = True):
    """A pynvml stand-in: settable power and energy per GPU, temperature NotSupported on GPU 1, and optionally
    no energy function at all (bindings too old) or no v2 memory info."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = FakeNVMLError
    nv.NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    nv.NVML_ERROR_FUNCTION_NOT_FOUND = 13
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 1, 2, 0
    nv.power_mw = [100_000] * gpus
    nv.energy_mj = [1_000_000] * gpus
    nv.calls = {"init": 0, "shutdown": 0, "temperature": 0}

    def init():
        if not driver:
            raise FakeNVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        nv.calls["init"] += 1

    def shutdown():
        nv.calls["shutdown"] += 1

    def temperature(h, sensor):
        nv.calls["temperature"] += 1
        if h == 1:
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        return 41 + h

    def memory(h, version=None):
        if version is not None and not memory_v2:
            raise TypeError("nvmlDeviceGetMemoryInfo() got an unexpected keyword argument 'version'")
        used = (1000 if version else 1645) * 2**20  # v1 counts the driver's reserved memory
        return types.SimpleNamespace(used=used, total=80 * 2**30)

    nv.nvmlInit, nv.nvmlShutdown = init, shutdown
    nv.nvmlDeviceGetCount = lambda: gpus
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: f"NVIDIA H200 #{h}"
    nv.nvmlDeviceGetPowerUsage = lambda h: nv.power_mw[h]
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90 + h, memory=40)
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1980 if kind == 1 else 3201
    nv.nvmlMemory_v2 = 0x2000028
    nv.nvmlDeviceGetMemoryInfo = memory
    nv.nvmlDeviceGetTemperature = temperature
    if energy:
        nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: nv.energy_mj[h]
    return nv


def frame(*readings: tuple[float | None, float | None]) -> GpuFrame:
    """A frame of GPU 0 readings given as (power W, energy counter J)."""
    return GpuFrame([GpuReading(gpu=0, power_w=p, energy_j=e) for p, e in readings])


# ---------------------------------------------------------------------------------------------- summaries


def test_per_level_summary_by_hand():
    frames = [
        GpuFrame([GpuReading(0, "H200", 100, 700, 10, 5, 1500, 3200, 1000, 40, 1000.0),
                  GpuReading(1, "H200", 110, 700, 20, 5, 1500, 3200, 2000, 50, 5000.0)]),
        GpuFrame([GpuReading(0, "H200", 200, 700, 20, 5, 1700, 3200, 1500, 45, 1100.0),
                  GpuReading(1, "H200", 120, 700, 30, 5, 1500, 3200, 2000, 50, 5100.0)]),
        GpuFrame([GpuReading(0, "H200", 300, 700, 30, 5, 1900, 3200, 1200, 43, 1250.0),
                  GpuReading(1, "H200", 130, 700, 40, 5, 1500, 3200, 2000, 50, 5150.0)]),
        GpuFrame([GpuReading(0, "H200", 400, 700, 40, 5, 1900, 3200, 1200, 44, 1300.0),
                  GpuReading(1, "H200", 140, 700, 50, 5, 1500, 3200, 2000, 50, 5175.0)]),
        GpuFrame([GpuReading(0, "H200", 500, 700, 50, 5, 1900, 3200, 1200, 44, 1500.0),
                  GpuReading(1, "H200", 150, 700, 60, 5, 1500, 3200, 2000, 50, 5300.0)]),
    ]  # fmt: skip
    g0, g1 = tm.summarize_gpus(frames)
    assert g0 == GpuTelemetry(
        gpu=0, name="H200", samples=5,
        power_w_mean=300.0,            # (100+200+300+400+500)/5
        power_w_p95=480.0,             # linear: rank 0.95*4 = 3.8 -> 400 + 0.8*(500-400)
        power_w_max=500.0,
        power_limit_w=700.0,
        util_gpu_pct_mean=30.0, util_mem_pct_mean=5.0,
        sm_clock_mhz_mean=1780.0,      # (1500+1700+1900*3)/5
        mem_clock_mhz_mean=3200.0,
        mem_used_mib_max=1500.0, temperature_c_max=45.0,
        energy_j=500.0,                # counter 1500 - 1000
        energy_source="counter",
    )  # fmt: skip
    assert g0.power_share_of_limit == pytest.approx(300 / 700)
    assert (g1.power_w_mean, g1.power_w_p95, g1.energy_j) == (130.0, 148.0, 300.0)
    assert tm.tokens_per_joule(1600, [g0, g1]) == 2.0  # 1600 tokens / (500 + 300) J


def test_energy_needs_two_counter_readings_and_a_counter_that_did_not_reset():
    assert tm.summarize_gpus([frame((100, 50.0))])[0].energy_j is None
    assert tm.summarize_gpus([frame((100, None), (100, None))])[0].energy_j is None
    assert tm.summarize_gpus([frame((100, 900.0), (None, None), (100, 950.0))])[0].energy_j == 50.0
    assert tm.summarize_gpus([frame((100, 900.0), (100, 10.0))])[0].energy_j is None  # driver reloaded
    g = tm.summarize_gpus([frame((100, 900.0), (100, 950.0))])
    assert tm.tokens_per_joule(None, g) is None and tm.tokens_per_joule(100, []) is None
    assert tm.tokens_per_joule(100, [*g, GpuTelemetry(gpu=1)]) is None  # one GPU without energy: no figure
    t = Telemetry(source="measured", gpus=[*g, GpuTelemetry(gpu=1, energy_j=25.0)])
    assert t.energy_j == 75.0


def test_server_metrics_summary_by_hand():
    samples = [
        {"num_running_reqs": 10, "num_queue_reqs": 0, "token_usage": 0.50, "gen_throughput": 1000},
        {"num_running_reqs": 30, "num_queue_reqs": 5, "token_usage": 0.98, "gen_throughput": 3000},
        {"num_running_reqs": 20, "num_queue_reqs": 1, "token_usage": 0.99},
    ]
    s = tm.summarize_server_metrics(samples)
    assert s == {
        "metrics_samples": 3.0,
        "num_running_reqs_mean": 20.0, "num_running_reqs_max": 30.0,
        "num_queue_reqs_mean": 2.0, "num_queue_reqs_max": 5.0,
        "token_usage_mean": 0.8233, "token_usage_max": 0.99,     # (0.5+0.98+0.99)/3 = 0.82333
        "gen_throughput_mean": 2000.0, "gen_throughput_max": 3000.0,
    }  # fmt: skip
    assert tm.summarize_server_metrics([]) == {}


SGLANG_METRICS_TEXT = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0",dp_rank="0"} 12.0
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="1",tp_rank="0",dp_rank="0"} 12.0
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="4",dp_rank="1"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",dp_rank="0"} 3.0
sglang:num_queue_reqs{model_name="m",dp_rank="1"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",dp_rank="0"} 0.97
sglang:token_usage{model_name="m",dp_rank="1"} 0.42
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="m",dp_rank="0"} 1500.5
sglang:gen_throughput{model_name="m",dp_rank="1"} 499.5
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 123456.0
"""


def test_sglang_gauges_are_combined_across_schedulers():
    # within a DP rank the PP/TP ranks report the same requests (max); DP ranks add up; KV usage is the max
    assert tm.parse_metrics(SGLANG_METRICS_TEXT, GAUGES) == {
        "num_running_reqs": 19.0, "num_queue_reqs": 5.0, "token_usage": 0.97, "gen_throughput": 2000.0,
    }  # fmt: skip
    assert tm.parse_metrics("# no metrics\n", GAUGES) == {}


# ---------------------------------------------------------------------------------------------- NVML


def test_nvml_reader_reads_and_skips_what_is_not_supported():
    nv = fake_pynvml(2)
    reader = tm.NvmlReader(nv)
    r0, r1 = reader.read().gpus
    assert r0 == GpuReading(gpu=0, name="NVIDIA H200 #0", power_w=100.0, power_limit_w=700.0, util_gpu_pct=90.0,
                            util_mem_pct=40.0, sm_clock_mhz=1980.0, mem_clock_mhz=3201.0, mem_used_mib=1000.0,
                            temperature_c=41.0, energy_j=1000.0)  # fmt: skip
    assert r1.temperature_c is None and r1.power_w == 100.0
    reader.read()
    assert nv.calls["temperature"] == 3  # GPU 1's NotSupported is remembered, not asked again
    assert reader.last_error is None
    reader.close()
    reader.close()
    assert nv.calls == {"init": 1, "shutdown": 1, "temperature": 3}


def test_old_bindings_without_energy_or_memory_v2():
    reader = tm.NvmlReader(fake_pynvml(1, energy=False, memory_v2=False))
    (r,) = reader.read().gpus
    assert r.energy_j is None and r.mem_used_mib == 1645.0  # v1: reserved memory included
    reader.close()


def test_without_a_driver_telemetry_is_unavailable_and_nothing_raises():
    nv = fake_pynvml(driver=False)
    t = tm.read_gpus(nvml=nv)
    assert t.source == "unavailable" and t.error == "NVML unavailable: NVML Shared Library Not Found"
    with TelemetryRecorder(nvml=nv, interval_s=0.01) as rec:
        rec.mark_level(8)
        level = rec.end_level(output_tokens=1000)
        snap = rec.snapshot()
    assert level.source == "unavailable" and level.max_concurrency == 8 and level.gpus == []
    assert level.error == "NVML unavailable: NVML Shared Library Not Found"
    assert level.output_tokens == 1000 and level.output_tokens_per_j is None
    assert snap.error == level.error


def test_this_machine_has_no_driver_and_says_so():
    t = tm.read_gpus()  # the real pynvml: the CI machines have no NVIDIA driver
    if t.source == "measured":  # pragma: no cover - a GPU host
        pytest.skip("this host has an NVIDIA driver")
    assert t.source == "unavailable" and t.error.startswith("NVML unavailable: ")


def test_recorder_levels_with_a_fake_driver():
    nv = fake_pynvml(2)
    rec = TelemetryRecorder(nvml=nv, interval_s=0.005).start()
    try:
        nv.power_mw = [350_000, 120_000]
        rec.mark_level(64)
        time.sleep(0.1)  # the thread samples about 20 times
        nv.energy_mj = [1_500_000, 1_120_000]  # +500 J and +120 J during the level
        first = rec.end_level(output_tokens=3100)
        nv.power_mw = [600_000, 600_000]
        with rec.level(128) as lv:
            time.sleep(0.02)
            nv.energy_mj = [1_800_000, 1_420_000]
            lv.output_tokens = 1200
        second = lv.telemetry
    finally:
        rec.stop()
    assert first.source == "measured" and first.max_concurrency == 64 and first.error is None
    g0, g1 = first.gpus
    assert g0.samples >= 3 and g0.power_w_mean == g0.power_w_max == 350.0 and g1.power_w_mean == 120.0
    assert (g0.energy_j, g1.energy_j) == (500.0, 120.0)
    assert first.output_tokens_per_j == 5.0  # 3100 / 620
    assert first.started_at <= first.finished_at
    assert second is not None and [g.energy_j for g in second.gpus] == [300.0, 300.0]
    assert second.output_tokens_per_j == 2.0 and second.gpus[0].power_w_mean == 600.0
    assert rec.levels == [first, second]
    assert nv.calls["shutdown"] == 1


def test_end_level_without_a_mark_and_progress_callbacks():
    rec = TelemetryRecorder(nvml=fake_pynvml(1), interval_s=0.01).start()
    try:
        assert "without mark_level" in (rec.end_level().error or "")
        rec.on_progress(types.SimpleNamespace(phase="warmup", max_concurrency=4))
        rec.on_progress(types.SimpleNamespace(phase="running", max_concurrency=4))
        rec.on_progress(types.SimpleNamespace(phase="running", max_concurrency=4))  # progress ticks: same level
        rec.on_progress(types.SimpleNamespace(phase="done", max_concurrency=4,
                                              level=types.SimpleNamespace(total_output_tokens=77)))  # fmt: skip
        rec.on_progress(types.SimpleNamespace(phase="done", max_concurrency=8, level=None))  # a level never running
        rec.flush()
        assert [(t.max_concurrency, t.output_tokens) for t in rec.levels] == [(4, 77), (8, None)]
    finally:
        rec.stop()


# ---------------------------------------------------------------------------------------------- /metrics


class _Metrics(BaseHTTPRequestHandler):
    text = SGLANG_METRICS_TEXT
    status = 200

    def do_GET(self):
        body = self.text.encode() if self.path == "/metrics" else b"not found"
        self.send_response(self.status if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Metrics
    server.shutdown()
    server.server_close()
    _Metrics.status, _Metrics.text = 200, SGLANG_METRICS_TEXT


def test_a_level_scrapes_metrics_while_nvml_is_missing(metrics_server):
    url, handler = metrics_server
    assert tm.scrape_metrics(url, gauges=GAUGES)["num_running_reqs"] == 19.0
    with TelemetryRecorder(url, gauges=GAUGES, nvml=fake_pynvml(driver=False), metrics_interval_s=0.01) as rec:
        rec.mark_level(32)
        time.sleep(0.05)
        handler.text = SGLANG_METRICS_TEXT.replace(" 12.0\n", " 40.0\n").replace("0.97", "1.0")
        time.sleep(0.05)
        t = rec.end_level()
    assert t.source == "unavailable" and t.error == "NVML unavailable: NVML Shared Library Not Found"
    s = t.server_metrics
    assert s["metrics_samples"] >= 3
    assert s["num_running_reqs_max"] == 47.0 and s["token_usage_max"] == 1.0  # a full KV pool, as data
    assert 19.0 < s["num_running_reqs_mean"] < 47.0 and s["num_queue_reqs_max"] == 5.0
    assert s["gen_throughput_mean"] == 2000.0


def test_a_server_without_metrics_is_an_error_in_the_level_not_an_exception(metrics_server):
    url, handler = metrics_server
    handler.status = 404
    with pytest.raises(tm.MetricsUnavailable, match="answered 404") as e:
        tm.scrape_metrics(url, gauges=GAUGES)
    assert e.value.hint == "start the server with its metrics on (SGLang: --enable-metrics)"
    with TelemetryRecorder(url, gauges=GAUGES, nvml=fake_pynvml(1), metrics_interval_s=0.01) as rec:
        rec.mark_level(1)
        t = rec.end_level(10)
    assert t.source == "measured" and t.server_metrics == {}
    assert t.error is not None and "server metrics: GET " in t.error and "answered 404" in t.error
    # nothing listens here at all: also just an error
    with TelemetryRecorder("http://127.0.0.1:9", gauges=GAUGES, nvml=fake_pynvml(1)) as rec:
        rec.mark_level(1)
        assert "server metrics: cannot read http://127.0.0.1:9/metrics" in (rec.end_level().error or "")


# ---------------------------------------------------------------------------------------------- pivot power


def test_pivot_power_reads_nvml(monkeypatch):
    nv = fake_pynvml(2)
    nv.power_mw = [350_000, 140_000]
    monkeypatch.setattr(tm.gpus, "_load_pynvml", lambda: nv)
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(cli, ["power"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    # gpu, name (3 words), power W, limit W, % limit, util, mem util, SM MHz, mem MHz, mem used MiB, temp, energy J
    assert rows == [["0", "NVIDIA", "H200", "#0", "350.0", "700", "50", "90", "40", "1,980", "3,201", "1,000", "41", "1,000"],
                    ["1", "NVIDIA", "H200", "#1", "140.0", "700", "20", "91", "40", "1,980", "3,201", "1,000", "-", "1,000"]]  # fmt: skip
    assert "NVML at" in result.stderr
    result = CliRunner().invoke(cli, ["power", "--json", "--gpus", "1"], catch_exceptions=False)
    t = Telemetry.model_validate_json(result.stdout)
    assert t.source == "measured" and [g.gpu for g in t.gpus] == [1] and t.gpus[0].temperature_c_max is None


def test_pivot_power_without_a_driver(monkeypatch):
    monkeypatch.setattr(tm.gpus, "_load_pynvml", lambda: fake_pynvml(driver=False))
    result = CliRunner().invoke(cli, ["power"], catch_exceptions=False)
    assert result.exit_code == 1 and result.stdout == ""
    assert "NVML unavailable: NVML Shared Library Not Found" in result.stderr and "--base-url" in result.stderr
    result = CliRunner().invoke(cli, ["power", "--json"], catch_exceptions=False)
    assert result.exit_code == 1 and Telemetry.model_validate_json(result.stdout).source == "unavailable"
    result = CliRunner().invoke(cli, ["power", "--gpus", "7"], catch_exceptions=False)
    monkeypatch.setattr(tm.gpus, "_load_pynvml", lambda: fake_pynvml(2))
    result = CliRunner().invoke(cli, ["power", "--gpus", "7"], catch_exceptions=False)
    assert result.exit_code == 1 and "no GPU 7 here: NVML sees 2 GPU(s)" in result.stderr
