"""sim-http that cannot keep up with its time scale is never judged: a level during which this host fell behind the
twin's clock runs again at a lower time scale, and is refused as a measurement when it still falls behind; what a
user reads while it runs (progress lines) and the raw JSONL carry the twin's numbers, as the ledger does."""

from __future__ import annotations

import json
import re

import pytest

from agent import models as m
from tests.factories import bench_level
from tools.engines import http
from tools.engines.http import HttpDeployment
from tools.engines.process import live_servers
from tools.engines.sim.engine import SimEngine
from tools.engines.sim.http_engine import sim_http_engine

CONFIG = m.ServerConfig.parse("--tp-size 1")
PROFILE = {"model_profile": "llama-3.3-70b-fp8", "hardware": "h200", "gpus": 1}
SPEC = m.BenchSpec(concurrency=[32], random_input_len=64, random_output_len=64, random_range_ratio=1.0,
                   num_prompts=64, warmup_requests=1)  # fmt: skip
FAST = 5000.0  # far faster than any host can serve 32 streams: every step is late


@pytest.fixture(autouse=True)
def _no_server_left():
    yield
    assert live_servers() == []


def _twin_level(tmp_path) -> m.BenchLevel:
    deployment = SimEngine(**PROFILE).launch(CONFIG, tmp_path / "twin.log")
    return deployment.benchmark(SPEC).levels[0]


def _bench(tmp_path, time_scale: float):
    engine = sim_http_engine(time_scale=time_scale, startup_s=0.1, **PROFILE)
    deployment = engine.launch(CONFIG, tmp_path / "server.log")
    assert isinstance(deployment, HttpDeployment)
    lines: list[str] = []
    raw = tmp_path / "raw.jsonl"
    try:
        deployment.wait_ready(60)
        result = deployment.benchmark(SPEC, on_progress=lines.append, output_file=raw)
    finally:
        deployment.stop()
    return deployment, result, lines, [m.BenchLevel.model_validate(json.loads(x)) for x in raw.read_text().splitlines()]


@pytest.mark.slow
def test_a_level_the_host_cannot_keep_up_with_runs_again_slower_and_reads_like_the_twin(tmp_path):
    deployment, result, lines, raw = _bench(tmp_path, FAST)
    (level,) = result.levels
    assert deployment.time_scale is not None and deployment.time_scale < FAST
    assert any("runs again at time scale" in line for line in lines), lines
    assert level.refused is None and level.holds
    assert level.host_other_cores is not None  # its timings are this host's: what other processes took is recorded
    twin = _twin_level(tmp_path)
    # before: the host's own speed times 5000, an order of magnitude off the twin; now within the HTTP path's slack
    # (the client's own delays on a host whose two cores run other tests too: up to a fifth, measured under -n 3)
    assert level.output_throughput == pytest.approx(twin.output_throughput, rel=0.25), (level, twin)
    assert level.mean_tpot_ms == pytest.approx(twin.mean_tpot_ms, rel=0.25)
    # the raw JSONL and the progress lines carry the same (simulated) numbers as the result
    assert [lv.output_throughput for lv in raw] == [level.output_throughput]
    done = [line for line in lines if ": done," in line][-1]  # the run that counts
    shown = float(re.search(r"([\d,]+) output tok/s", done).group(1).replace(",", ""))
    assert shown == pytest.approx(level.output_throughput, abs=1)


@pytest.mark.slow
def test_a_level_still_behind_at_the_lowest_scale_is_refused_and_never_judged(tmp_path, monkeypatch):
    monkeypatch.setattr(http, "MIN_TIME_SCALE", FAST)  # no lower scale to go to: the host stays behind
    _, result, lines, raw = _bench(tmp_path, FAST)
    (level,) = result.levels
    assert level.refused is not None and "not a measurement" in level.refused and not level.holds
    assert raw[0].refused == level.refused
    assert not any("runs again" in line for line in lines)
    assert m.BenchLevel.mean([level, level.model_copy(update={"refused": None})]).refused is None


def test_a_refused_level_is_left_out_of_every_judgement(store, small_plan):
    from tools.method import Method

    store.create_session(m.Session(id="clock1", name="x", plan=small_plan, engine="sim-http"))
    spec = small_plan.workload

    def level(c: int, tok_s: float, refused: str | None = None) -> m.BenchLevel:
        return bench_level(c, tok_s, refused=refused)

    base = store.add_experiment("clock1", m.Experiment(kind="baseline", config=small_plan.target.base_config(),
                                                       workload=spec, status="finished", verdict="baseline"))  # fmt: skip
    change = store.add_experiment("clock1", m.Experiment(plan_item="01", config=small_plan.target.base_config(),
                                                         base_experiment_id=base.id, workload=spec,
                                                         status="finished"))  # fmt: skip
    for e, top in ((base, 100.0), (change, 400.0)):
        result = m.BenchResult(spec=spec, engine="sim-http", source="simulated",
                               levels=[level(1, 10.0), level(8, top, "not a measurement: behind")])  # fmt: skip
        store.add_bench_result(e.id, result)
    method = Method.read(store, "clock1")
    j = method.judge(method.experiment(change.id))
    assert j.concurrency == 1 and j.change_pct == pytest.approx(0.0)  # not +300% at the refused level
    assert "not a measurement at concurrency 8" in j.text
