"""Energy and power: GPU power limits through NVML (set, restored, refused clearly), the power item, the twin's power
and clocks under a limit, and the energy every level reports beside its tok/s."""

from __future__ import annotations

import json
import sys

import pytest

from agent import models as m
from agent.errors import LaunchFailed
from agent.plans import parse_plan
from tests.conftest import SMALL_PLAN
from tools.engines.command import CommandEngine
from tools.engines.sim.engine import SimEngine, SimLaunchError
from tools.engines.sim.twin import Twin, TwinStartupError
from tools.telemetry import power as pw
from tools.telemetry.gpus import GpuFrame, GpuReading
from tools.telemetry.summary import energy_fields, read_gpus, summarize_gpus


class NVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


class FakeNvml:
    """The few NVML calls power limits need, on GPUs that take 200..700 W (an H200's constraints)."""

    NVMLError = NVMLError
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_NOT_SUPPORTED = 3

    def __init__(self, gpus: int = 2, *, refuse: dict[int, int] | None = None, limit_mw: int = 700_000) -> None:
        self.limits = dict.fromkeys(range(gpus), limit_mw)
        self.refuse = dict(refuse or {})  # gpu -> NVML error code for a set
        self.calls: list[tuple[int, int]] = []
        self.open = 0

    def nvmlInit(self) -> None:
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i not in self.limits:
            raise NVMLError(2, "Invalid Argument")
        return i

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: int) -> list[int]:
        return [200_000, 700_000]

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return self.limits[h]

    def nvmlDeviceSetPowerManagementLimit(self, h: int, mw: int) -> None:
        self.calls.append((h, mw))
        if h in self.refuse and mw != 700_000:
            code = self.refuse[h]
            raise NVMLError(code, {4: "Insufficient Permissions", 3: "Not Supported"}[code])
        self.limits[h] = mw


def test_a_limit_is_set_on_every_gpu_and_restored(tmp_path):
    nvml = FakeNvml()
    pending = tmp_path / "pending.json"
    limits = pw.set_power_limits(["0", "1"], 450, nvml=nvml, pending_path=pending)
    assert nvml.limits == {0: 450_000, 1: 450_000}
    assert json.loads(pending.read_text()) == {"restore_mw": {"0": 700_000, "1": 700_000}}
    assert limits.restore() == [] and limits.restore() == []  # twice is safe
    assert nvml.limits == {0: 700_000, 1: 700_000} and not pending.exists() and nvml.open == 0


def test_without_root_the_refusal_says_so_and_nothing_stays_changed(tmp_path):
    nvml = FakeNvml(refuse={1: FakeNvml.NVML_ERROR_NO_PERMISSION})
    with pytest.raises(pw.PowerLimitRefused) as caught:
        pw.set_power_limits(["0", "1"], 450, nvml=nvml, pending_path=tmp_path / "p.json")
    assert caught.value.failure == "power-limit"
    assert "needs root" in caught.value.message and "Insufficient Permissions" in caught.value.message
    assert "nvidia-smi -i 1 -pl 450" in (caught.value.hint or "")
    assert nvml.limits == {0: 700_000, 1: 700_000}  # GPU 0 was set, then put back


def test_a_limit_outside_the_cards_range_is_refused_before_anything_is_set():
    nvml = FakeNvml()
    with pytest.raises(pw.PowerLimitRefused) as caught:
        pw.set_power_limits(["0"], 800, nvml=nvml)
    assert "takes power limits from 200 to 700 W, not 800 W" in caught.value.message
    assert nvml.calls == [] and nvml.open == 0
    with pytest.raises(pw.PowerLimitRefused, match="does not let its power limit be set"):
        pw.set_power_limits(["0"], 300, nvml=FakeNvml(refuse={0: FakeNvml.NVML_ERROR_NOT_SUPPORTED}))


def test_limits_a_killed_pivot_left_set_are_put_back(tmp_path):
    nvml = FakeNvml()
    pending = tmp_path / "pending.json"
    pw.set_power_limits(["0", "1"], 300, nvml=nvml, pending_path=pending)  # ... and pivot dies before restore()
    assert pw.restore_pending(pending, nvml=nvml) == ["GPU 0 back to 700 W", "GPU 1 back to 700 W"]
    assert nvml.limits == {0: 700_000, 1: 700_000} and not pending.exists()
    assert pw.restore_pending(pending, nvml=nvml) == []


def test_the_servers_gpus_are_the_visible_ones_else_the_first_n():
    assert pw.server_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, 2) == ["2", "3"]
    assert pw.server_gpus({"CUDA_VISIBLE_DEVICES": "GPU-abc"}, 1) == ["GPU-abc"]
    assert pw.server_gpus({}, 4) == ["0", "1", "2", "3"]


def test_on_a_host_without_gpus_a_power_item_fails_to_launch_with_its_reason(tmp_path):
    """A real launch (the command engine, a server that would start) under a power limit, on this GPU-less host."""
    if read_gpus().source == "measured":
        pytest.skip("this host has GPUs: a power limit could really be set")
    engine = CommandEngine(command=[sys.executable, "-c", "import time; time.sleep(30)", "--port", "{port}"])
    config = m.ServerConfig().with_power_limit(400)
    with pytest.raises(LaunchFailed) as caught:
        engine.launch(config, tmp_path / "server.log")
    assert caught.value.failure == "power-limit" and "no GPU power limit can be set here" in caught.value.message


# ---------------------------------------------------------------------------------------------- the power item


def test_a_power_item_sets_the_limit_on_top_of_the_best_config():
    plan = parse_plan(
        SMALL_PLAN + '\n[[items]]\nid = "03"\ntier = 1\nkind = "power"\ntitle = "Cap at 450 W"\npower_limit_w = 450\n'
        'hypothesis = "Fewer joules per token."\nexpected_impact = "-10% J per token"\n',
        "p.toml",
    )
    base = plan.target.base_config()
    config = plan.item("03").apply(base)
    assert config.gpu_power_limit_w == 450 and config.argv() == base.argv()
    assert str(config.diff(base)) == "GPU power limit 450 W" and str(config).endswith("[GPU power limit 450 W]")
    assert plan.item("01").apply(config).gpu_power_limit_w == 450  # later changes keep it
    with pytest.raises(ValueError, match="power_limit_w"):
        m.PlanItem(id="04", tier=1, title="t", kind="power", hypothesis="h", expected_impact="e")


def test_the_twin_slows_its_clock_to_hold_the_limit():
    spec = m.BenchSpec(random_input_len=1024, random_output_len=1024, concurrency=[256], prompts_per_concurrency=1)
    base = m.ServerConfig.parse("--tp-size 1")
    rows = []
    for watts in (None, 500, 400, 300):
        config = base if watts is None else base.with_power_limit(watts)
        twin = Twin.build("llama-3.3-70b-fp8", "h200", 1, config)
        ((level, sim),) = twin.predict(spec)
        rows.append((level.output_throughput, level.mean_gpu_power_w, sim.clock, level.energy_per_output_token_j))
    full = rows[0]
    assert full[1] > 500 and full[2] == 1.0  # unlimited, it draws more than the first limit
    for (tok_s, watts, clock, joules), limit, (prev_tok_s, _, prev_clock, prev_joules) in zip(
        rows[1:], (500, 400, 300), rows, strict=False
    ):
        assert watts == pytest.approx(limit, rel=0.02)  # the clock found holds the limit
        assert clock < prev_clock and tok_s < prev_tok_s and joules < prev_joules  # slower, and fewer J per token


def test_the_twin_refuses_a_limit_its_gpu_does_not_take(tmp_path):
    with pytest.raises(TwinStartupError) as caught:
        Twin.build("llama-3.3-70b-fp8", "h200", 1, m.ServerConfig.parse("--tp-size 1").with_power_limit(150))
    assert caught.value.classify == "power-limit" and "from 200 to 700 W" in caught.value.message
    engine = SimEngine("llama-3.3-70b-fp8", "h200", 1)
    with pytest.raises(SimLaunchError) as launched:
        engine.launch(m.ServerConfig.parse("--tp-size 1").with_power_limit(900), tmp_path / "s.log")
    assert launched.value.failure == "power-limit"


# ---------------------------------------------------------------------------------------------- energy per level


def test_a_gpu_without_the_energy_counter_gets_the_integral_of_its_power():
    frames = [GpuFrame([GpuReading(0, power_w=w)], t_s=t) for t, w in ((0.0, 100.0), (1.0, 200.0), (3.0, 200.0))]
    (g,) = summarize_gpus(frames)
    assert g.energy_j == 150.0 + 400.0 and g.energy_source == "power_integral"
    counted = [GpuFrame([GpuReading(0, power_w=100.0, energy_j=e)], t_s=t) for t, e in ((0.0, 10.0), (1.0, 60.0))]
    assert summarize_gpus(counted)[0].energy_source == "counter" and summarize_gpus(counted)[0].energy_j == 50.0


def test_energy_fields_are_the_levels_watts_per_gpu_and_joules_per_token():
    t = m.Telemetry(source="measured", gpus=[m.GpuTelemetry(gpu=0, power_w_mean=300, energy_j=600),
                                             m.GpuTelemetry(gpu=1, power_w_mean=200, energy_j=400)])  # fmt: skip
    assert energy_fields(t, 2000) == {"mean_gpu_power_w": 250.0, "energy_per_output_token_j": 0.5}
    assert energy_fields(m.Telemetry(source="unavailable"), 2000) == {}


def test_the_twins_levels_carry_energy_beside_tok_s():
    twin = Twin.build("glm-5-nvfp4", "rtx-pro-6000-blackwell", 8, m.ServerConfig.parse("--tp-size 8"))
    spec = m.BenchSpec(random_input_len=256, random_output_len=256, concurrency=[64], prompts_per_concurrency=1)
    ((level, sim),) = twin.predict(spec)
    joules = level.mean_gpu_power_w * 8 * sim.wall_s  # type: ignore[operator]
    assert level.energy_per_output_token_j == pytest.approx(joules / level.total_output_tokens, rel=1e-3)
    telemetry = twin.telemetry(sim, 64)
    assert all(g.energy_source == "model" for g in telemetry.gpus)
