"""The `sim` engine behind the Engine and Deployment protocols, found through the entry points."""

from __future__ import annotations

import pytest

from agent import models as m
from agent.contracts import Deployment, Engine, load_engine
from tools.engines.sim.engine import SimLaunchError

FLAGS = "--model-path lukealonso/GLM-5-NVFP4 --tp-size 8"


def test_sim_engine_is_a_registered_plugin(tmp_path):
    engine = load_engine("sim", model_profile="glm-5-nvfp4", hardware="rtx-pro-6000-blackwell", gpus=8)
    assert isinstance(engine, Engine) and engine.name == "sim"
    dep = engine.launch(m.ServerConfig.parse(FLAGS), tmp_path / "server.log")
    assert isinstance(dep, Deployment) and dep.alive()
    dep.wait_ready(1.0)
    result = dep.benchmark(m.BenchSpec(random_input_len=256, random_output_len=256, concurrency=[1, 64]))
    assert result.source == "simulated" and [lv.max_concurrency for lv in result.levels] == [1, 64]
    assert result.levels[1].output_throughput > result.levels[0].output_throughput
    tel = dep.telemetry()
    assert tel.source == "simulated" and len(tel.gpus) == 8 and tel.gpus[0].power_limit_w == 600
    assert "The server is fired up and ready to roll!" in (tmp_path / "server.log").read_text()
    dep.stop()
    assert not dep.alive()


def test_audit_marks_removed_and_noop_flags():
    engine = load_engine("sim")
    rows = engine.validate(
        m.ServerConfig.parse("--tp-size 8 --enable-piecewise-cuda-graph --num-continuous-decode-steps 8")
    )
    assert [(r.flag, r.status) for r in rows] == [
        ("--tp-size", "ok"),
        ("--enable-piecewise-cuda-graph", "unknown"),
        ("--num-continuous-decode-steps", "noop"),
    ]


@pytest.mark.parametrize(
    ("flags", "failure"),
    [
        ("--enable-piecewise-cuda-graph", "unrecognized-argument"),
        ("--cuda-graph-max-bs 512", "ambiguous-argument"),
        ("--mem-fraction-static 0.5", "oom"),
        ("--enable-two-batch-overlap", "argument-validation"),
    ],
)
def test_launch_failures_are_classified(tmp_path, flags, failure):
    """Forced past the audit gate, the twin refuses as SGLang would, and the refusal is classified from its log."""
    with pytest.raises(SimLaunchError) as info:
        load_engine("sim").launch(m.ServerConfig.parse(f"{FLAGS} {flags}"), tmp_path / "s.log", force=True)
    assert info.value.failure == failure
    assert (tmp_path / "s.log").read_text().strip()


def test_the_audit_gate_refuses_what_sglang_refuses_before_anything_is_built(tmp_path):
    from tools.engines.process import FlagsRefused

    with pytest.raises(FlagsRefused, match="--enable-piecewise-cuda-graph is unknown") as info:
        load_engine("sim").launch(m.ServerConfig.parse(f"{FLAGS} --enable-piecewise-cuda-graph"), tmp_path / "s.log")
    assert [i.flag for i in info.value.issues] == ["--enable-piecewise-cuda-graph"]
    assert not (tmp_path / "s.log").exists()


def test_ep8_crashes_under_load_and_stays_down(tmp_path):
    dep = load_engine("sim").launch(m.ServerConfig.parse(f"{FLAGS} --ep-size 8"), tmp_path / "s.log")
    result = dep.benchmark(m.BenchSpec(random_input_len=256, random_output_len=256, concurrency=[1, 1024, 64]))
    light, heavy, after = result.levels
    assert light.failed == 0 and heavy.failed > 0 and after.completed == 0
    assert not dep.alive()
    assert "illegal memory access" in dep.log_tail(1)[0]
