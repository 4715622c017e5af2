"""Telemetry, /metrics and the profile tool against `pivot sim serve` as a real process, with the real clients."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from agent.cli import cli
from agent.models import BenchSpec, ProfileSummary, Telemetry
from tests.test_sim_serve import Server, _start, _stop
from tools import loadgen
from tools.engines.sglang import GAUGES
from tools.profile import CATEGORIES, profile_server
from tools.profiles import load_hardware
from tools.telemetry import TelemetryRecorder, read_twin_telemetry, scrape_metrics

SPEC = BenchSpec(concurrency=[16], num_prompts=32, random_input_len=64, random_output_len=48, warmup_requests=0)


@pytest.fixture(scope="module")
def metrics_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The twin of GLM-5-NVFP4 on 8 RTX PRO 6000 at TP8, 50x real time, with /metrics."""
    s = _start(tmp_path_factory.mktemp("tw-metrics"), "--tp-size", "8", "--enable-metrics")
    yield s
    assert _stop(s) == 0


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The same twin without --enable-metrics, as SGLang starts by default."""
    s = _start(tmp_path_factory.mktemp("tw-plain"), "--tp-size", "8")
    yield s
    assert _stop(s) == 0


def test_a_level_on_the_twin_has_simulated_gpus_server_metrics_and_tokens_per_joule(metrics_server: Server):
    hw = load_hardware("rtx-pro-6000-blackwell")
    with TelemetryRecorder(
        metrics_server.url, simulated=True, gauges=GAUGES, interval_s=0.05, metrics_interval_s=0.05
    ) as rec:
        result = loadgen.benchmark(metrics_server.url, SPEC, on_progress=rec.on_progress)
    (level,) = result.levels
    (t,) = rec.levels
    assert t.source == "simulated" and t.max_concurrency == 16 and t.error is None
    assert len(t.gpus) == 8
    for g in t.gpus:
        assert g.samples >= 2 and hw.idle_w <= g.power_w_mean <= g.power_w_max <= hw.tdp_w
        assert g.energy_j is not None and g.energy_j > 0 and g.power_limit_w == hw.tdp_w
    assert t.output_tokens == level.total_output_tokens == 32 * level.total_output_tokens // 32
    assert t.output_tokens_per_j == pytest.approx(level.total_output_tokens / t.energy_j, rel=1e-4)
    s = t.server_metrics
    assert s["metrics_samples"] >= 2 and s["num_running_reqs_max"] >= 1
    assert 0 < s["token_usage_max"] <= 1 and s["num_queue_reqs_max"] >= 0
    assert scrape_metrics(metrics_server.url, gauges=GAUGES).keys() == {"num_running_reqs", "num_queue_reqs", "token_usage",
                                                         "gen_throughput"}  # fmt: skip


def test_without_metrics_the_twin_server_state_comes_from_sim_telemetry(plain_server: Server):
    with TelemetryRecorder(
        plain_server.url, simulated=True, gauges=GAUGES, interval_s=0.05, metrics_interval_s=0.5
    ) as rec:
        with rec.level(16) as lv:
            result = loadgen.benchmark(plain_server.url, SPEC)
            lv.output_tokens = result.levels[0].total_output_tokens
        snap = rec.snapshot()
    t = lv.telemetry
    assert t is not None and t.error is None and t.source == "simulated"
    assert t.server_metrics["num_running_reqs_max"] >= 1 and t.server_metrics["metrics_samples"] >= 2
    assert t.output_tokens_per_j is not None and t.output_tokens_per_j > 0
    assert snap.source == "simulated" and len(snap.gpus) == 8 and snap.max_concurrency is None
    assert set(snap.server_metrics) == {"num_running_reqs", "num_queue_reqs", "token_usage", "gen_throughput"}


def test_read_twin_telemetry_and_pivot_power(metrics_server: Server, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    t = read_twin_telemetry(metrics_server.url)
    assert t.source == "simulated" and [g.gpu for g in t.gpus] == list(range(8))
    result = CliRunner().invoke(cli, ["power", "--json", "--base-url", metrics_server.url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert Telemetry.model_validate_json(result.stdout).source == "simulated"
    result = CliRunner().invoke(cli, ["power", "--base-url", metrics_server.url], catch_exceptions=False)
    assert result.exit_code == 0 and "RTX PRO 6000" in result.stdout and "SIMULATED" in result.stderr
    result = CliRunner().invoke(cli, ["power", "--base-url", metrics_server.url + "/nothing"], catch_exceptions=False)
    assert result.exit_code == 1 and "answered 404" in result.stderr


def test_profile_on_the_twin_is_its_breakdown(plain_server: Server, tmp_path):
    spec = BenchSpec(concurrency=[8], num_prompts=8, random_input_len=64, random_output_len=32, warmup_requests=0)
    s = profile_server(plain_server.url, tmp_path / "profiles", spec=spec)
    assert s.source == "simulated" and list(s.categories) == list(CATEGORIES)
    assert sum(c.share for c in s.categories.values()) == pytest.approx(1.0)
    assert s.categories["expert_gemm"].seconds > 0 and s.categories["communication"].seconds > 0
    assert s.total_s == pytest.approx(sum(c.seconds for c in s.categories.values()))
    assert s.max_concurrency == 8 and s.output_throughput is not None and s.output_throughput > 0
    result = CliRunner().invoke(cli, ["profile", "--base-url", plain_server.url, "--json", "--concurrency", "4",
                                      "--num-prompts", "4", "--input-len", "32", "--output-len", "16",
                                      "--output-dir", str(tmp_path / "p2")], catch_exceptions=False)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert ProfileSummary.model_validate_json(result.stdout).source == "simulated"
