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
