"""The objective in the method: goodput, capacity and energy judged, predicted and written as the plan asks (the
seam in tools/method/objective.py), with throughput's words and numbers unchanged."""

from __future__ import annotations

import pytest

from agent import models as m
from agent.plans import load_plan, parse_plan
from agent.session import Session
from tests.conftest import SMALL_PLAN
from tests.factories import bench_level
from tools.method import THROUGHPUT, Method, objective_for

GOODPUT = '\n[objective]\nkind = "goodput"\nttft_ms = 500\ntpot_ms = 50\n'
TOKEN_GOODPUT = GOODPUT + 'goodput = "token"\n'
CAPACITY = '\n[objective]\nkind = "capacity"\nttft_ms = 500\ntpot_ms = 50\n'
ENERGY = '\n[objective]\nkind = "energy"\n'
ENERGY_SLO = ENERGY + "tpot_ms = 50\nattainment_target = 0.9\n"


def _plan(table: str = "") -> m.Plan:
    return parse_plan(SMALL_PLAN + table, "p.toml")


def _lv(c: int, tok_s: float, **kw) -> m.BenchLevel:
    return bench_level(c, tok_s, **kw)


def _capacity(value: float | None, upper: float | None = None) -> m.Capacity:
    return m.Capacity(axis="concurrency", slos_ms={"ttft": 500.0, "tpot": 50.0}, target=0.95, capacity=value,
                      upper=upper, load_min=1, load_max=8, max_levels=6)  # fmt: skip


# ---------------------------------------------------------------------------------------------- the seam


def test_the_plan_picks_the_objective():
    assert objective_for(_plan()) is THROUGHPUT and THROUGHPUT.name == "throughput"
    req, tok = objective_for(_plan(GOODPUT)), objective_for(_plan(TOKEN_GOODPUT))
    assert (req.name, req.metric, req.unit) == ("goodput", "request_goodput", "good req/s")
    assert (tok.metric, tok.unit) == ("token_goodput_tok_s", "good output tok/s")
    assert objective_for(_plan(CAPACITY)).name == "capacity"
    assert (objective_for(_plan(ENERGY)).name, objective_for(_plan(ENERGY)).unit) == ("energy", "output tok/J")


def test_each_objective_reads_its_own_key_of_a_level():
    lv = _lv(8, 1000, request_goodput=2.5, token_goodput_tok_s=800.0, slo_attainment=0.8,
             energy_per_output_token_j=0.5)  # fmt: skip
    assert THROUGHPUT.value(lv) == 1000
    assert objective_for(_plan(GOODPUT)).value(lv) == 2.5
    assert objective_for(_plan(TOKEN_GOODPUT)).value(lv) == 800.0
    assert objective_for(_plan(ENERGY)).value(lv) == pytest.approx(2.0)  # 1 / 0.5 J per token
    assert objective_for(_plan(ENERGY_SLO)).value(lv) is None  # 80% attainment is under the 90% target
    good = lv.model_copy(update={"slo_attainment": 0.95})
    assert objective_for(_plan(ENERGY_SLO)).value(good) == pytest.approx(0.8 / 0.5)  # only good requests' tokens
    assert objective_for(_plan(GOODPUT)).value(_lv(8, 1000)) is None  # measured without the SLOs: nothing to judge
    assert objective_for(_plan(GOODPUT)).value(lv.model_copy(update={"failed": 1})) is None


def test_capacity_is_a_value_per_run_not_per_level():
    cap = objective_for(_plan(CAPACITY))
    spec = _plan(CAPACITY).workload
    run = m.BenchResult(spec=spec, engine="sim", source="simulated", levels=[_lv(1, 10), _lv(8, 100)])
    assert cap.value_of_run(run) == {}  # no capacity search ran: nothing measured
    top = max(spec.concurrency)
    assert cap.value_of_run(run.model_copy(update={"capacity": _capacity(6, 7)})) == {top: 6.0}
    assert cap.value_of_run(run.model_copy(update={"capacity": _capacity(None, 1)})) == {top: 0.0}  # all missed
    assert THROUGHPUT.value_of_run(run) == {1: 10, 8: 100}


def test_the_objectives_words():
    assert THROUGHPUT.at(64) == "output tok/s at concurrency 64"
    assert THROUGHPUT.change_words(1000, 1234) == "output tok/s from 1,000 to 1,234 (+23%)"
    cap = objective_for(_plan(CAPACITY))
    assert cap.change_words(640, 896) == (
        "capacity at TTFT <= 500 ms, TPOT <= 50 ms from 640 to 896 concurrent requests (+40%)"
    )
    assert objective_for(_plan(GOODPUT)).change_words(2.5, 3.0) == (
        "request goodput at TTFT <= 500 ms, TPOT <= 50 ms from 2.50 to 3.00 good req/s (+20%)"
    )


# ---------------------------------------------------------------------------------------------- the judgement


def _experiment(store, s, items, base, runs, config=None):
    e = store.add_experiment(
        s.id,
        m.Experiment(plan_items=items, kind="change" if items else "baseline",
                     config=config or s.plan.target.base_config(),
                     base_experiment_id=base.id if base else None, workload=s.plan.workload),
    )  # fmt: skip
    for run in runs:
        store.add_bench_result(e.id or 0, run)
    return store.update_experiment(e.model_copy(update={"status": "finished"}))


def test_a_capacity_campaign_is_judged_on_the_capacity_of_each_run(store, paths):
    plan = _plan(CAPACITY)
    spec = plan.workload
    levels = [_lv(1, 10), _lv(8, 100)]

    def run(value, upper):
        return m.BenchResult(spec=spec, engine="sim", source="simulated", levels=levels,
                             capacity=_capacity(value, upper))  # fmt: skip

    with Session.create(store, paths, plan, engine_name="sim") as s:
        base = _experiment(store, s, [], None, [run(5, 6), run(5, 6)])
        store.update_experiment(base.model_copy(update={"verdict": "baseline"}))
        config = plan.item("01").apply(base.config)
        e = _experiment(store, s, ["01"], base, [run(7, 8), run(7, 8)], config)
        method = Method.read(store, s.id)
        jb = method.judge(method.experiment(base.id))
        assert jb.suggestion == "baseline" and jb.after_tok_s == 5.0
        assert method.noise_pct() == 0.0  # the noise band is measured on the objective: both runs found 5
        j = method.judge(e)
        # the same output tok/s at every level: throughput would call it no gain; capacity rose by 40%
        assert j.suggestion == "adopted" and j.change_pct == pytest.approx(40.0)
        assert j.text.startswith("+40.0% concurrent requests of capacity at TTFT <= 500 ms, TPOT <= 50 ms (95% of ")
        assert "(5 -> 7, mean of 2 runs: 7, 7;" in j.text


def test_a_goodput_campaign_is_judged_on_goodput_and_its_noise(store, paths):
    plan = _plan(GOODPUT)
    spec = plan.workload

    def run(good):
        return m.BenchResult(spec=spec, engine="sim", source="simulated",
                             levels=[_lv(1, 10, request_goodput=1.0), _lv(8, 100, request_goodput=good)])  # fmt: skip

    with Session.create(store, paths, plan, engine_name="sim") as s:
        base = _experiment(store, s, [], None, [run(2.0), run(2.1)])
        store.update_experiment(base.model_copy(update={"verdict": "baseline"}))
        e = _experiment(store, s, ["01"], base, [run(1.5), run(1.5)], plan.item("01").apply(base.config))
        method = Method.read(store, s.id)
        assert method.noise_pct() == pytest.approx(0.1 / 2.05 * 100)
        j = method.judge(e)
        assert j.suggestion == "regressed" and j.concurrency == 8
        assert j.text.startswith("-26.8% good req/s at concurrency 8 (TTFT <= 500 ms, TPOT <= 50 ms) (2.05 -> 1.50")


def test_the_shipped_capacity_plan_reads_as_capacity():
    o = objective_for(load_plan("glm5-nvfp4-rtxpro6000x8-capacity"))
    assert o.name == "capacity" and o.what == "capacity at TPOT <= 250 ms"


# ---------------------------------------------------------------------------------------------- words and expectations


def test_an_expectation_names_its_metric_and_an_energy_gain_is_a_drop():
    from tools.reports import parse_expectation

    energy = parse_expectation("-15% J per token at the same throughput")
    assert energy is not None and (energy.metric, energy.gain_pct) == ("energy_per_output_token_j", 15.0)
    assert energy.speaks_for("energy") and not energy.speaks_for("throughput")
    tok = parse_expectation("+20-30% output tok/s at concurrency 2048; little change at low concurrency.")
    assert tok is not None and (tok.metric, tok.gain_pct, tok.levels) == ("output_throughput", 25.0, (2048, 2048))
    assert tok.speaks_for("throughput") and tok.speaks_for("capacity") and tok.speaks_for("energy")
    tpot = parse_expectation("-10-20% mean TPOT")
    assert tpot is not None and tpot.metric == "mean_tpot_ms" and not tpot.speaks_for("throughput")
    assert parse_expectation("-8% W per GPU").metric == "mean_gpu_power_w"  # type: ignore[union-attr]
    assert parse_expectation("+10-20% capacity at TPOT <= 50 ms").metric == "capacity"  # type: ignore[union-attr]


def test_a_power_item_is_promising_only_when_energy_is_the_objective(store, paths):
    from tools.method.moves import promising

    power = '\n[[items]]\nid = "09"\ntier = 1\nkind = "power"\ntitle = "Cap"\npower_limit_w = 300\n' \
        'hypothesis = "h"\nexpected_impact = "-15% J per token"\n'  # fmt: skip
    for table, want in (("", False), (ENERGY, True)):
        plan = _plan(power + table)
        with Session.create(store, paths, plan, engine_name="sim") as s:
            assert promising(Method.read(store, s.id), plan.item("09")) is want


def test_the_summary_and_the_pivot_speak_of_capacity(store, paths):
    from agent.questions import headline
    from tools import reports
    from tools.method.compute import moves_of
    from tools.reports.status import _effect

    plan = _plan(CAPACITY)
    spec = plan.workload

    def run(value, upper):
        return m.BenchResult(spec=spec, engine="sim", source="simulated", levels=[_lv(1, 10), _lv(8, 100)],
                             capacity=_capacity(value, upper))  # fmt: skip

    with Session.create(store, paths, plan, engine_name="sim") as s:
        base = _experiment(store, s, [], None, [run(5, 6), run(5, 6)])
        store.update_experiment(base.model_copy(update={"verdict": "baseline"}))
        e = _experiment(store, s, ["01"], base, [run(7, 8), run(7, 8)], plan.item("01").apply(base.config))
        store.update_experiment(e.model_copy(update={"verdict": "adopted"}))
        ledger = reports.Ledger.read(store, s.id)
        assert _effect(ledger, ledger.experiment(e.id)).startswith(
            "capacity at TTFT <= 500 ms, TPOT <= 50 ms from 5 to 7 concurrent requests (+40%); +0.0% output tok/s at 8"
        )
        assert _effect(ledger, ledger.experiment(base.id)).startswith("5 concurrent requests of capacity at TTFT")
        assert ledger.band_pct() == s.settings.min_gain_pct  # no noise in the capacity of two runs
        head = headline(moves_of(s))
        assert head == (
            "Best so far: 7 concurrent requests of capacity at TTFT <= 500 ms, TPOT <= 50 ms (95% of requests) "
            "(experiment 2, +40.0% over the baseline)."
        )


# ---------------------------------------------------------------------------------------------- the search


def test_the_search_ranks_candidates_by_the_predicted_capacity(store, paths):
    """On the shipped capacity plan, the twin's predicted capacity ranks the candidates: the larger prefill chunks
    (06, the exhaustive grid's best, benchmarks/slo_grid.json) are predicted to raise capacity at TPOT <= 250 ms."""
    from tools import search
    from tools.engines.sim.predictor import twin_predictor
    from tools.method.compute import moves_of

    plan = load_plan("glm5-nvfp4-rtxpro6000x8-capacity")
    t = plan.target
    settings = m.SessionSettings(engine_options={"model_profile": t.model_profile, "hardware": t.hardware,
                                                 "gpus": t.gpus})  # fmt: skip
    twin = twin_predictor(t.model_profile, t.hardware, t.gpus)
    top = max(plan.workload.concurrency)
    _, base_capacity = objective_for(plan).predict(twin, t.base_config(), plan.workload, top)
    assert base_capacity is not None and 100 < base_capacity < 256
    bracket = m.Capacity(axis="concurrency", slos_ms={"tpot": 250.0}, target=0.95, capacity=base_capacity,
                         load_min=1, load_max=2048, max_levels=6)  # fmt: skip
    run = m.BenchResult(spec=plan.workload, engine="sim", source="simulated", capacity=bracket,
                        levels=[_lv(c, 100.0 * c) for c in plan.workload.concurrency])  # fmt: skip
    with Session.create(store, paths, plan, engine_name="sim", settings=settings) as s:
        base = _experiment(store, s, [], None, [run, run])
        store.update_experiment(base.model_copy(update={"verdict": "baseline"}))
        method = Method.read(store, s.id)
        sur = search.Surrogate(method)
        assert len(sur.belief().observations) == 1  # the baseline's measured / predicted capacity
        assert abs(sur.belief().common[0]) < 0.01
        est = sur.estimate(("06",))
        assert est.source == "twin" and est.change_pct is not None and est.change_pct > 10
        assert "concurrent requests of capacity at TPOT <= 250 ms" in est.note
        ranked = search.candidates(method, moves_of(s).decision, sur)  # tier 1 is open: its items and pairs
        assert ranked and [c.gain for c in ranked] == sorted((c.gain for c in ranked), reverse=True)
        tier1 = [it.id for it in plan.items if it.tier == 1 and search.searchable(it)]
        assert ranked[0].gain >= max(sur.estimate((i,)).change_pct or -100 for i in tier1)


def test_an_energy_campaign_on_the_twin_launches_its_power_limit_and_keeps_it(tmp_path):
    """The SLO evaluation's energy plan to its end on the twin, `continue` at every pivot: the power item is
    launched (with the items the twin predicts beside it) and adopted, and the best is within 1% of the grid's best
    output tokens per joule (benchmarks/slo_grid.json)."""
    import json
    from pathlib import Path

    from agent import loop
    from agent.session import Paths
    from agent.store import Store

    root = Path(__file__).resolve().parent.parent
    plan = load_plan(str(root / "benchmarks" / "slo_plans" / "slo-energy-llama70b-h200x1.toml"))
    grid = json.loads((root / "benchmarks" / "slo_grid.json").read_text())[plan.name]
    paths = Paths.from_env(tmp_path)
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    t = plan.target
    settings = m.SessionSettings(engine_options={"model_profile": t.model_profile, "hardware": t.hardware,
                                                 "gpus": t.gpus, "noise": 0.0})  # fmt: skip
    with Store(paths.db_path) as store, Session.create(store, paths, plan, engine_name="sim", settings=settings) as s:
        outcome = loop.run(s)
        for _ in range(10):
            if outcome.status != "pivot":
                break
            outcome = loop.run(s, answer="continue")
        assert outcome.status == "finished", outcome.message
        method = Method.read(store, s.id)
        best = method.best()
        assert best is not None and best.config.gpu_power_limit_w is not None
        assert any(i in method.active_items() for i in ("08", "09"))
        j = method.judge(best)
        assert j.after_tok_s is not None and j.after_tok_s >= 0.99 * grid["best_value"]
        assert "output tok/J at concurrency 1024" in j.text
