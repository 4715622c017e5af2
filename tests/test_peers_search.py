"""The search as a seam: the twin-guided search, the plan's order, Optuna's TPE and random configurations each propose
the launches of one campaign on the formula engine, and the method's contract holds for every one of them: launches
only of released, audited items; verdicts as the judgement permits; the launch budget respected; a campaign that
ends; the same ledger giving the same proposals (a resume proposes what an unbroken run would)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from agent import models as m
from agent.store import Store
from tests.formula_engine import Effect, Formula, FormulaEngine, FormulaPredictor, formula_plan, run_to_the_end
from tools import peers, search
from tools.method import Method

pytest.importorskip("optuna")

EFFECTS = {
    "01": Effect("--knob-a 1", factor=1.10),
    "02": Effect("--knob-b 1", factor=1.06),
    "03": Effect("--knob-c 1", factor=0.80),  # a brake
    "04": Effect("--knob-d 1", factor=1.08, with_item="01", pair_factor=0.85),  # pays only without 01
    "05": Effect("--knob-e 1", refused=True),  # the engine refuses it: never launched by any proposer
}
TIERS = {"01": 1, "02": 1, "03": 1, "04": 1, "05": 1}
PROPOSERS = ["twin", "plan-order", "optuna-tpe", "random"]


@pytest.fixture(autouse=True)
def quick_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tools.reports.status.write_status_html", lambda *a, **k: None)


def grid_best() -> float:
    formula = Formula(EFFECTS)
    plan = formula_plan(EFFECTS, TIERS)
    ok = [i for i in EFFECTS if not EFFECTS[i].refused]
    best = 0.0
    for n in range(len(ok) + 1):
        for combo in itertools.combinations(ok, n):
            config = plan.target.base_config(())
            for i in combo:
                config = plan.item(i).apply(config)
            tok, crashed = formula.reading(config, plan.workload, max(plan.workload.concurrency))
            if tok is not None and not crashed:
                best = max(best, tok)
    return best


def campaign(home: Path, monkeypatch, proposer: str, budget: int | None, seed: int = 0) -> tuple[Store, str]:
    store, sid, _ = campaign_outcome(home, monkeypatch, proposer, budget, seed)
    return store, sid


def campaign_outcome(home: Path, monkeypatch, proposer: str, budget: int | None, seed: int = 0):
    formula = Formula(EFFECTS)
    plan = formula_plan(EFFECTS, TIERS, {i: "+5%" for i in EFFECTS})
    monkeypatch.setattr(search, "predictor_for", lambda method: FormulaPredictor(formula))
    engine = FormulaEngine(formula, noise=0.0)
    settings = m.SessionSettings(proposer=proposer, search=proposer != "plan-order", max_launches=budget, seed=seed)
    return run_to_the_end(home, plan, engine, settings)


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_every_proposer_keeps_the_methods_contract(tmp_path, monkeypatch, proposer):
    budget = 14
    store, sid = campaign(tmp_path, monkeypatch, proposer, budget)
    method = Method.read(store, sid)
    assert store.get_session(sid).status == "finished"
    launched = [e for e in method.experiments if method.run_count(e) or e.verdict == "crashed"]
    assert not [e for e in launched if "05" in e.plan_items]  # refused by the audit: ruled out, never launched
    assert all(e.verdict for e in method.experiments), [(e.number, e.status) for e in method.experiments]
    assert peers.launches_spent(method) <= budget + 2  # a verdict's confirming rerun may follow the last candidate
    best = method.best()
    assert best is not None
    value = sum(method.ok_values(best)[max(method.ok_values(best))]) / method.run_count(best)
    floor = 0.99 if proposer != "plan-order" else 0.9  # the plan's order adds 01 first and never finds 04 alone
    assert value >= floor * grid_best(), (proposer, value, grid_best())


@pytest.mark.parametrize("proposer", ["optuna-tpe", "random"])
def test_a_peer_proposes_from_the_ledger_alone(tmp_path, monkeypatch, proposer):
    """Two campaigns with the same seed launch the same configurations in the same order (the history is the
    ledger's, the sampler seeded by the session's seed and the trials told): a resume proposes what an unbroken
    run would."""
    runs = []
    for k in range(2):
        store, sid = campaign(tmp_path / str(k), monkeypatch, proposer, 10, seed=7)
        runs.append([(tuple(e.plan_items), tuple(e.reverts)) for e in store.experiments(sid)])
    assert runs[0] == runs[1]


def test_the_budget_stops_new_launches_and_says_so(tmp_path, monkeypatch):
    store, sid, out = campaign_outcome(tmp_path, monkeypatch, "random", 4)
    method = Method.read(store, sid)
    spent = peers.launches_spent(method)
    assert 4 <= spent <= 4 + 2  # the rerun a verdict waited for may follow the fourth launch
    assert out.status == "finished" and "the launch budget is spent" in out.message, out.message
    assert f"({spent} launches of 4: --max-launches)" in out.message


def test_the_cli_runs_a_peer_under_a_budget_and_refuses_a_bad_one(tmp_path):
    """`pivot run PLAN --search optuna-tpe --max-launches 6` as a user types it, on the twin: finished, the budget
    said; an unknown search is a usage error before anything is recorded."""
    import json

    from click.testing import CliRunner

    from agent.cli import cli

    plan = str(Path(__file__).resolve().parent.parent / "benchmarks" / "search_plans" / "eval-llama70b-h200x1.toml")
    runner = CliRunner()
    done = runner.invoke(cli, ["--home", str(tmp_path), "run", plan, "--search", "optuna-tpe", "--max-launches", "6",
                               "--json", "--quiet"], catch_exceptions=False)  # fmt: skip
    assert done.exit_code == 0, done.output
    outcome = json.loads(done.stdout)
    assert outcome["status"] == "finished" and "the launch budget is spent" in outcome["message"], outcome
    bad = runner.invoke(cli, ["--home", str(tmp_path / "other"), "run", plan, "--search", "annealing"])
    assert bad.exit_code == 2 and "annealing" in bad.output
    assert not (tmp_path / "other" / "state" / "pivot.db").exists()


def test_what_does_not_start_is_an_infeasible_trial(tmp_path, monkeypatch):
    """A configuration that did not start is told to the sampler as infeasible (Optuna 5's constraints: `starts`
    = 1, the worst value measured), every measured one as feasible, so TPE learns to avoid what does not run; a step
    the method would not take is told infeasible too (`method` = 1) and never proposed."""
    import optuna

    effects = {**EFFECTS, "06": Effect("--knob-f 1", startup=True)}
    tiers = {**TIERS, "06": 1}
    formula = Formula(effects)
    plan = formula_plan(effects, tiers, {i: "+5%" for i in effects})
    monkeypatch.setattr(search, "predictor_for", lambda method: FormulaPredictor(formula))
    settings = m.SessionSettings(proposer="optuna-tpe", search=True, max_launches=14, seed=3)
    store, sid, _ = run_to_the_end(tmp_path, plan, FormulaEngine(formula, noise=0.0), settings)
    method = Method.read(store, sid)
    assert any("06" in e.plan_items and e.verdict == "crashed" for e in method.experiments)
    studies: list[optuna.Study] = []
    create = optuna.create_study
    monkeypatch.setattr(optuna, "create_study", lambda **kw: studies.append(create(**kw)) or studies[-1])
    from tools.method.answers import Decision

    found = peers.propose(method, Decision(released={1}), "optuna-tpe", ok=lambda c: "03" not in c)
    assert found is None or "03" not in found[0]
    trials = studies[0].trials
    crashed = [t for t in trials if t.params.get("--knob-f") == "06" and t.constraints.get("starts") == 1.0]
    assert crashed, [(t.params, t.constraints) for t in trials]
    assert not [t for t in trials if t.state == optuna.trial.TrialState.FAIL]  # heard, not dropped (the asked one runs)
    asked_03 = [t for t in trials[len(method.experiments) :] if t.params.get("--knob-c") == "03"]
    assert all(t.constraints.get("method") == 1.0 for t in asked_03)


def test_optuna_gp_without_pytorch_is_refused_before_anything_is_recorded(tmp_path):
    """`--search optuna-gp` needs PyTorch for Optuna's GP sampler: where it is missing, one line says so and what
    to install, and no session is recorded."""
    from click.testing import CliRunner

    from agent.cli import cli

    try:
        import torch  # noqa: F401

        pytest.skip("PyTorch is installed here: the GP sampler runs")
    except ImportError:
        pass
    plan = str(Path(__file__).resolve().parent.parent / "benchmarks" / "search_plans" / "eval-llama70b-h200x1.toml")
    out = CliRunner().invoke(cli, ["--home", str(tmp_path), "run", plan, "--search", "optuna-gp"])
    assert out.exit_code == 1 and "needs PyTorch" in out.output and "pip install torch" in out.output, out.output
    assert not (tmp_path / "state" / "pivot.db").exists()


def test_a_stall_pivot_of_a_peer_with_launches_left_offers_to_go_on(tmp_path):
    """TPE on the held-out ten-item plan, with noise, stalls after three changes without gain while 10 of its 20
    launches are left: the pivot offers to go on with its next step (the budget left said), not only to stop; the
    answer `1` goes on."""
    import json

    from click.testing import CliRunner

    from agent.cli import cli

    root = Path(__file__).resolve().parent.parent
    plan = str(root / "benchmarks" / "heldout_plans" / "heldout-ten-llama70b-h200x2.toml")
    runner = CliRunner()
    args = ["--home", str(tmp_path), "run", plan, "--noise", "0.015", "--search", "optuna-tpe", "--max-launches", "20"]
    out = runner.invoke(cli, [*args, "--json", "--quiet"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    outcome = json.loads(out.stdout)
    assert outcome["status"] == "pivot" and outcome["question"].startswith("The last 3 changes gave no gain"), outcome
    first = outcome["options"][0]
    assert first.startswith("continue: the optuna-tpe proposer's next step (") and "launches left" in first, outcome
    assert outcome["options"][-1].startswith("stop"), outcome
    store = Store(tmp_path / "state" / "pivot.db")
    before = peers.launches_spent(Method.read(store, outcome["session"]))
    again = runner.invoke(cli, ["--home", str(tmp_path), "resume", outcome["session"], "--answer", "1", "--json",
                                "--quiet"], catch_exceptions=False)  # fmt: skip
    assert again.exit_code == 0, again.output
    assert peers.launches_spent(Method.read(store, outcome["session"])) > before
