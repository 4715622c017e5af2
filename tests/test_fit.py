"""The target fitted (tools/fit.py): the twin's host overhead, GEMM efficiency, bandwidth and power multipliers
fitted to what an engine measured, on an engine whose hardware differs from its profile (a truth file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import models as m
from agent.plans import load_plan
from agent.session import Session
from tools import search
from tools.engines.sim.engine import SimEngine
from tools.fit import fit_target, scaled
from tools.method import Method
from tools.profiles import load_hardware

PLAN = Path(__file__).resolve().parent.parent / "benchmarks" / "search_plans" / "eval-glm5-rtxpro6000x8.toml"


def _campaign(store, paths, tmp_path, truth: str, items: list[str]) -> tuple[Session, m.Plan]:
    """The baseline and one experiment per item, each benchmarked once by the sim engine measuring `truth`."""
    plan = load_plan(str(PLAN))
    t = plan.target
    engine = SimEngine(model_profile=t.model_profile, hardware=t.hardware, gpus=t.gpus, truth=truth)
    s = Session.create(store, paths, plan, engine_name="sim", engine=engine)
    base = None
    for item in [None, *items]:
        config = plan.target.base_config() if item is None else plan.item(item).apply(plan.target.base_config())
        method = Method.read(store, s.id)
        fields = search.record_fields(method, [item], config=config) if item else search.record_fields(method, [], True)
        e = store.add_experiment(
            s.id,
            m.Experiment(plan_items=[item] if item else [], kind="change" if item else "baseline", config=config,
                         base_experiment_id=base.id if base else None, workload=plan.workload, **fields),
        )  # fmt: skip
        dep = engine.launch(config, tmp_path / f"{e.id}.log")
        store.add_bench_result(e.id or 0, dep.benchmark(plan.workload))
        for tel in dep.level_telemetry:
            store.add_telemetry(e.id or 0, tel)
        e = store.update_experiment(
            e.model_copy(update={"status": "finished", "verdict": "baseline" if not item else "no_gain"})
        )
        base = base or e
    return s, plan


def test_host_overhead_and_gemm_efficiency_are_recovered(store, paths, tmp_path):
    """Host work x2 and the tensor cores at 0.7 of the profile: after the baseline and three experiments the fit
    finds both within 10%, and the residuals fall."""
    truth = tmp_path / "truth.toml"
    truth.write_text(
        '[hardware.scale]\n"calibration.host_ms_per_step" = 2.0\n'
        + "".join(f'"dense_tflops.{k}" = 0.7\n' for k in load_hardware("rtx-pro-6000-blackwell").dense_tflops)
    )
    s, plan = _campaign(store, paths, tmp_path, str(truth), ["02", "04", "06"])
    t = plan.target
    fit = fit_target(Method.read(store, s.id), str(t.model_profile), str(t.hardware), t.gpus)
    assert fit is not None and fit.experiments == [1, 2, 3, 4]
    got = {p.name: p for p in fit.parameters}
    assert got["host"].identified and got["host"].value == pytest.approx(2.0, rel=0.10)
    assert got["compute"].identified and got["compute"].value == pytest.approx(0.7, rel=0.10)
    assert got["host"].low < 2.0 < got["host"].high
    assert all(fit.rms_after_pct[k] < fit.rms_before_pct[k] for k in fit.rms_before_pct)
    assert "host overhead per step: x2.0" in "\n".join(fit.lines())


def test_a_true_profile_is_left_as_it_is(store, paths, tmp_path):
    truth = tmp_path / "truth.toml"
    truth.write_text('name = "none"\n')
    s, plan = _campaign(store, paths, tmp_path, str(truth), ["02"])
    t = plan.target
    fit = fit_target(Method.read(store, s.id), str(t.model_profile), str(t.hardware), t.gpus)
    assert fit is not None
    for p in fit.parameters:
        assert p.value == pytest.approx(1.0, abs=0.02), p
    assert fit.scale() == {} or all(abs(v - 1) < 0.02 for v in fit.scale().values())


def test_scaled_holds_power_activity_at_most_one():
    hw = load_hardware("h200")
    assert scaled(hw, {"power": 10.0}).calibration.power_activity == pytest.approx(1.0)
    assert scaled(hw, {"host": 2.0}).calibration.host_ms_per_step == 2 * hw.calibration.host_ms_per_step


def test_with_fit_twin_the_search_ranks_by_the_fitted_twin(store, paths, tmp_path):
    """`--fit-twin`: after the baseline and three experiments on hardware unlike its profile, the search's predictor is
    the twin on the fitted profile, and it predicts an unmeasured configuration far closer to what the engine
    measures than the stock twin does; without the setting the stock twin stays."""
    from tools.engines.sim.predictor import TwinPredictor

    truth = tmp_path / "truth.toml"
    truth.write_text(
        '[hardware.scale]\n"calibration.host_ms_per_step" = 2.0\n'
        + "".join(f'"dense_tflops.{k}" = 0.7\n' for k in load_hardware("rtx-pro-6000-blackwell").dense_tflops)
    )
    s, plan = _campaign(store, paths, tmp_path, str(truth), ["02", "04", "06"])
    method = Method.read(store, s.id)
    stock = search.Surrogate(method).predictor
    assert isinstance(stock, TwinPredictor) and stock.hardware_name == plan.target.hardware  # the setting is off
    store.set_session_settings(s.id, method.settings.model_copy(update={"fit_twin": True}))
    fitted = search.Surrogate(Method.read(store, s.id)).predictor
    assert isinstance(fitted, TwinPredictor) and fitted.hardware_name != stock.hardware_name
    config = plan.item("05").apply(plan.target.base_config())  # never measured
    level = max(plan.workload.concurrency)
    engine = SimEngine(model_profile=plan.target.model_profile, hardware=plan.target.hardware, gpus=plan.target.gpus,
                       truth=str(truth))  # fmt: skip
    measured = engine.launch(config, tmp_path / "05.log").benchmark(plan.workload).level(level).output_throughput
    errors = [abs(p.predict(config, plan.workload, level).level.output_throughput / measured - 1) for p in (stock,
              fitted)]  # fmt: skip
    assert errors[1] < 0.05 and errors[1] < errors[0] / 2, errors


def test_with_fit_twin_the_summary_and_show_json_state_the_fit(store, paths, tmp_path):
    """A session that ranks by the fitted twin states the fitted parameters, their intervals and the residuals in
    the summary's lessons and in `pivot show --json` without `--fit`; without the setting only with it."""
    from agent.cli.sessions import _lessons_json
    from tools.lessons import learnt_lines

    truth = tmp_path / "truth.toml"
    truth.write_text('[hardware.scale]\n"calibration.host_ms_per_step" = 2.0\n')
    s, _ = _campaign(store, paths, tmp_path, str(truth), ["02", "04", "06"])
    lines = learnt_lines(s)
    assert lines is not None and not any("fitted to this target" in x for x in lines)
    assert (_lessons_json(store, store.get_session(s.id), fit=False) or {}).get("fit") is None
    store.set_session_settings(s.id, Method.read(store, s.id).settings.model_copy(update={"fit_twin": True}))
    lines = learnt_lines(s) or []
    assert any("The twin fitted to this target" in x for x in lines), lines
    assert any("host overhead per step: x" in x for x in lines), lines
    fit = (_lessons_json(store, store.get_session(s.id), fit=False) or {}).get("fit")
    assert fit is not None and {p["name"] for p in fit["parameters"]} >= {"host", "compute"}
    assert fit["rms_after_pct"] and fit["rms_before_pct"]
