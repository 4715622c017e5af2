"""Objectives users set: the plan's [objective] and `pivot run --objective`, the capacity search (levels that bracket
the load where SLO attainment crosses the target), and the shipped SLO plan run on the twin to its first pivot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import models as m
from agent.cli import cli
from agent.errors import PlanError
from agent.plans import load_plan, parse_plan, plan_changes
from agent.session import Paths
from agent.store import Store
from tests.conftest import SMALL_PLAN
from tools.engines.sim.engine import SimEngine
from tools.engines.sim.predictor import twin_predictor
from tools.loadgen.capacity import CapacityPlan, predicted_capacity, run_capacity, search_capacity, twin_predict
from tools.metrics import compute_level

CAPACITY = """
[objective]
kind = "capacity"
tpot_ms = 250
ttft_ms = 20000
attainment_target = 0.9
"""


# ---------------------------------------------------------------------------------------------- the plan


def test_an_objective_table_puts_its_slos_in_the_workload_without_changing_its_key():
    plan = parse_plan(SMALL_PLAN + CAPACITY, "p.toml")
    assert plan.objective.kind == "capacity" and plan.objective.slos_ms == {"ttft": 20000.0, "tpot": 250.0}
    assert plan.workload.goodput_slos_ms == {"ttft": 20000.0, "tpot": 250.0}
    assert plan.workload.workload_key() == parse_plan(SMALL_PLAN, "p.toml").workload.workload_key()
    assert (
        plan.objective.describe()
        == "capacity (concurrent requests) at TTFT <= 20000 ms, TPOT <= 250 ms (90% of requests)"
    )
    assert parse_plan(SMALL_PLAN, "p.toml").objective == m.Objective()  # throughput unless a plan says otherwise


@pytest.mark.parametrize(
    ("table", "where", "words"),
    [
        ('kind = "goodput"', r"p\.toml:\d+: objective: ", "a goodput objective needs at least one SLO"),
        ('kind = "capacity"\ntpot_ms = -1', r"p\.toml:\d+: objective\.tpot_ms: ", "greater than 0"),
        ('kind = "fast"', r"p\.toml:\d+: objective\.kind: ", "'throughput', 'goodput', 'capacity' or 'energy'"),
        ('kind = "energy"\nttft = 5', r"p\.toml:\d+: objective\.ttft: ", "Extra inputs"),
        ('kind = "capacity"\ntpot_ms = 9\nload_min = 8\nload_max = 4', r"p\.toml:\d+: objective: ", "load_min"),
    ],
)
def test_a_bad_objective_names_the_file_the_line_and_the_field(table, where, words):
    with pytest.raises(PlanError) as caught:
        parse_plan(SMALL_PLAN + "\n[objective]\n" + table + "\n", "p.toml")
    assert re.match(where, caught.value.message), caught.value.message
    assert words in caught.value.message
    line = int(caught.value.message.split(":")[1])
    text = (SMALL_PLAN + "\n[objective]\n" + table + "\n").splitlines()[line - 1]
    assert text.startswith(("[objective]", caught.value.message.split(": ")[1].split(".")[-1].strip()))


def test_an_edited_objective_is_a_recorded_plan_change():
    old = parse_plan(SMALL_PLAN, "p.toml")
    new = parse_plan(SMALL_PLAN + CAPACITY, "p.toml")
    assert plan_changes(old, new) == [
        "objective: output tok/s -> capacity (concurrent requests) at TTFT <= 20000 ms, TPOT <= 250 ms (90% of requests)"
    ]


def test_pivot_run_objective_and_slo_are_kept_with_the_session(tmp_path):
    home = tmp_path / "home"
    result = CliRunner().invoke(
        cli,
        ["--home", str(home), "run", "glm5-nvfp4-rtxpro6000x8", "--engine", "sim", "--concurrency", "1,256", "-q",
         "--objective", "goodput", "--slo", "ttft:5000,tpot:250", "--goodput-kind", "token"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with Store(Paths.from_env(home).db_path) as store:
        (record,) = store.list_sessions()
        assert record.plan.objective == m.Objective(kind="goodput", ttft_ms=5000, tpot_ms=250, goodput="token")
        for e in store.experiments(record.id):
            assert e.workload.goodput_slos_ms == {"ttft": 5000.0, "tpot": 250.0}
            for run in store.bench_results(e.id):
                assert all(lv.slo_attainment is not None for lv in run.levels)


def test_an_edited_plan_without_an_objective_keeps_the_sessions(store, paths, tmp_path, capsys):
    from agent.cli.run import _take_plan
    from agent.session import Session

    plan = parse_plan(SMALL_PLAN, "p.toml").with_objective(m.Objective(kind="capacity", tpot_ms=80))
    with Session.create(store, paths, plan, engine_name="sim") as session:
        _take_plan(session, parse_plan(SMALL_PLAN.replace("+10% at 8", "+12% at 8"), "p.toml"))
        assert session.record.plan.objective == m.Objective(kind="capacity", tpot_ms=80)
        _take_plan(session, parse_plan(SMALL_PLAN + '\n[objective]\nkind = "throughput"\n', "p.toml"))
        assert session.record.plan.objective == m.Objective()  # a file that says so replaces it, recorded
    assert any(c.changes[0].startswith("objective: capacity") for c in store.plan_changes(session.id))


def test_pivot_run_refuses_an_objective_that_does_not_hold_together(tmp_path):
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "run", "glm5-nvfp4-rtxpro6000x8", "--objective",
                                      "capacity"])  # fmt: skip
    assert result.exit_code == 1 and "needs at least one SLO" in result.stderr
    assert not (tmp_path / "state" / "pivot.db").exists() or "session" not in result.stderr


# ---------------------------------------------------------------------------------------------- the search


def _level(attainment: float) -> m.BenchLevel:
    return compute_level([], max_concurrency=1).model_copy(update={"slo_attainment": attainment})


def _curve(crossing: float):
    """Attainment 1.0 up to `crossing`, then falling linearly to 0 at twice it."""
    return lambda x: _level(1.0 if x <= crossing else max(0.0, 2 - x / crossing))


SPEC = m.BenchSpec(concurrency=[1, 256, 512, 1024, 2048])
CONC = CapacityPlan.of(m.Objective(kind="capacity", tpot_ms=100), SPEC)


def _search(curve, plan=CONC, known_levels=(), predicted=None):
    ran: list[float] = []

    def measure(load):
        ran.append(load)
        return curve(load)

    known = {float(c): curve(c) for c in known_levels}
    capacity, _ = search_capacity(measure, plan, known=known, predicted=predicted)
    return capacity, ran


def test_a_good_prediction_brackets_the_crossing_in_two_levels():
    curve = _curve(700)  # attainment 0.95 at 735
    exact = predicted_capacity(curve, CONC)
    capacity, ran = _search(curve, known_levels=SPEC.concurrency, predicted=exact)
    assert exact is not None and 700 <= exact <= 735
    assert ran[0] == exact and len(ran) <= 3
    assert capacity.capacity is not None and capacity.upper is not None
    assert capacity.capacity <= 735 < capacity.upper and capacity.upper / capacity.capacity - 1 <= CONC.resolution


def test_without_a_prediction_the_bracket_is_halved_within_the_level_budget():
    capacity, ran = _search(_curve(700), known_levels=SPEC.concurrency)
    assert len(ran) <= CONC.max_levels and capacity.capacity <= 735 < capacity.upper  # type: ignore[operator]
    assert capacity.predicted_capacity is None


def test_an_open_bracket_is_reported_as_open():
    bounded = CapacityPlan.of(m.Objective(kind="capacity", tpot_ms=100, load_max=2048), SPEC)
    capacity, ran = _search(_curve(5000), plan=bounded, known_levels=SPEC.concurrency)
    assert (capacity.capacity, capacity.upper, ran) == (2048.0, None, [])
    assert capacity.bracket_text.startswith("at least 2048")


def test_a_sweep_that_meets_everywhere_is_searched_above_its_top_without_a_prediction():
    """[measure]: vLLM has no predictor; a sweep whose every level meets the SLOs is not reported as "at least" its
    top level: the search doubles past it (up to 8x the top unless the objective bounds it) and brackets there."""
    capacity, ran = _search(_curve(5000), known_levels=SPEC.concurrency)
    assert ran[0] == 4096 and len(ran) <= CONC.max_levels and CONC.load_max == 8 * 2048
    assert capacity.capacity is not None and capacity.upper is not None
    assert capacity.capacity <= 5250 < capacity.upper  # attainment 0.95 at 5250
    capacity, ran = _search(lambda x: _level(0.5), known_levels=SPEC.concurrency)
    assert (capacity.capacity, capacity.upper) == (None, 1.0) and capacity.bracket_text.startswith("below 1")


def test_the_request_rate_axis_is_searched_with_poisson_arrivals():
    plan = CapacityPlan.of(m.Objective(kind="capacity", tpot_ms=100, load="request_rate", max_levels=8), SPEC)
    assert (plan.load_min, plan.load_max) == (0.1, 1000.0)
    one = plan.spec_at(SPEC, 3.5)
    assert one.request_rate == 3.5 and one.concurrency == [2048] and one.goodput_slos_ms == {"tpot": 100.0}
    capacity, ran = _search(_curve(3.7), plan=plan)
    assert len(ran) <= 8 and capacity.capacity <= 3.7 * 1.05 < capacity.upper  # type: ignore[operator]


def test_on_the_twin_the_bracket_holds_the_twins_own_crossing(tmp_path):
    """The twin's deployment measured by the search, its predictor placing the first level: the levels run are few,
    the crossing is inside the bracket, and the predicted capacity is where the twin measures it (noise-free)."""
    plan_ = load_plan("glm5-nvfp4-rtxpro6000x8-capacity")
    objective, spec = plan_.objective, plan_.workload.model_copy(update={"concurrency": [1, 256]})
    config = plan_.target.base_config()
    engine = SimEngine()
    deployment = engine.launch(config, tmp_path / "server.log")
    swept = deployment.benchmark(spec)
    plan = CapacityPlan.of(objective, spec)
    start = predicted_capacity(twin_predict(twin_predictor("glm-5-nvfp4", "rtx-pro-6000-blackwell", 8), config, spec,
                                            plan), plan)  # fmt: skip
    raw = tmp_path / "levels.jsonl"
    capacity = run_capacity(deployment, spec, objective, swept, predicted=start, output_file=raw)
    assert start is not None and capacity.predicted_capacity == start
    assert capacity.capacity == start  # noise-free, the twin measures what it predicted
    measured = [p for p in capacity.points if p.load not in (1.0, 256.0)]
    assert 1 <= len(measured) <= objective.max_levels
    at = {p.load: p.attainment for p in capacity.points}
    assert at[capacity.capacity] >= objective.attainment_target > at[capacity.upper]  # type: ignore[index]
    assert capacity.upper / capacity.capacity - 1 <= objective.resolution + 1e-9  # type: ignore[operator]
    lines = [json.loads(x) for x in raw.read_text().splitlines()]
    assert [row["max_concurrency"] for row in lines] == [p.load for p in measured]
    assert all(row["goodput_slos_ms"] == {"tpot": 250.0} for row in lines)


# ---------------------------------------------------------------------------------------------- the shipped plan


def test_the_shipped_slo_plan_runs_on_the_twin_and_brackets_every_measured_run(tmp_path):
    home = tmp_path / "home"
    result = CliRunner().invoke(
        cli, ["--home", str(home), "run", "glm5-nvfp4-rtxpro6000x8-capacity", "--engine", "sim", "-q"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "question:" in result.stdout
    with Store(Paths.from_env(home).db_path) as store:
        (record,) = store.list_sessions()
        assert record.plan.objective.kind == "capacity"
        runs = [r for e in store.experiments(record.id) for r in store.bench_results(e.id)]
        assert runs and all(r.capacity is not None for r in runs)
        for r in runs:
            cap = r.capacity
            assert cap.capacity is not None and cap.upper is not None and 100 < cap.capacity < 256
            assert len([p for p in cap.points if p.load not in map(float, r.spec.concurrency)]) <= cap.max_levels
        docs = [d.path for d in store.documents(record.id) if d.kind == "status"]
    text = (home / next(p for p in docs if p.endswith(".md"))).read_text()
    html = (home / next(p for p in docs if p.endswith(".html"))).read_text()
    assert "-attainment.png" in html  # SLO attainment against load, the target line drawn
    assert "Capacity at TPOT <= 250 ms (95% of requests), in concurrent requests:" in text
    assert re.search(r"\| #1 \| baseline \| 1\d\d \|", text)


def test_the_shipped_slo_plan_checks_clean_but_for_the_seeds_own_errors():
    result = CliRunner().invoke(cli, ["plan", "check", "glm5-nvfp4-rtxpro6000x8-capacity", "--json"])
    shipped = CliRunner().invoke(cli, ["plan", "check", "glm5-nvfp4-rtxpro6000x8", "--json"])
    errors = lambda r: sorted(  # noqa: E731
        (x["where"], x["message"]) for x in json.loads(r.stdout)["problems"] if x["severity"] == "error"
    )
    assert errors(result) == errors(shipped)


def test_the_plans_that_ship_include_an_slo_objective():
    plans = {p.stem for p in (Path(__file__).parent.parent / "plans").glob("*.toml")}
    assert "glm5-nvfp4-rtxpro6000x8-capacity" in plans


def test_an_objective_no_level_meets_is_said_at_the_baseline_with_a_pivot(tmp_path):
    """SLOs no request can meet: the baseline's verdict says so with the value per level, and the campaign stops at
    a pivot before any change is judged against zero; 'continue' goes on as it is."""
    home = tmp_path / "home"
    args = ["--home", str(home), "run", "glm5-nvfp4-rtxpro6000x8", "--engine", "sim", "--concurrency", "1,64", "-q",
            "--objective", "goodput", "--slo", "ttft:1,tpot:1"]  # fmt: skip
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with Store(Paths.from_env(home).db_path) as store:
        (record,) = store.list_sessions()
        experiments = store.experiments(record.id)
        assert [e.kind for e in experiments if store.bench_results(e.id)] == ["baseline"]  # nothing judged vs zero
        base = experiments[0]
        assert "no level meets the objective" in (base.reason or "") and "within the SLOs" in base.reason
        (pivot,) = store.pivots(record.id)
        assert "gives 0 for the objective" in pivot.question and "--plan FILE --answer continue" in pivot.question
        assert pivot.options[0].startswith("continue")
    result = CliRunner().invoke(cli, ["--home", str(home), "resume", record.id, "--answer", "continue", "-q"],
                                catch_exceptions=False)  # fmt: skip
    assert result.exit_code == 0, result.output
    with Store(Paths.from_env(home).db_path) as store:
        assert any(e.kind == "change" and store.bench_results(e.id) for e in store.experiments(record.id))
        assert not any("gives 0 for the objective" in p.question for p in store.pivots(record.id)[1:])
