"""Paired measurement (tools/method/paired.py): a decisive change is judged against its base measured again after
it (A/B/A), run by run at the same moment, so a host that drifts between them moves both sides and not the verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import models as m
from agent.store import Store
from tests.formula_engine import Effect, Formula, FormulaEngine, FormulaPredictor, formula_plan, run_to_the_end
from tools import search
from tools.method import Method
from tools.method.paired import back_to_back, pair

EFFECTS = {"01": Effect("--null-control 1", factor=1.0), "02": Effect("--real-gain 1", factor=1.3)}


@pytest.fixture(autouse=True)
def quick_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tools.reports.status.write_status_html", lambda *a, **k: None)


def test_each_run_is_paired_with_its_base_at_the_moment_it_ran() -> None:
    base = [(0.0, 100.0), (10.0, 120.0), (30.0, 140.0)]
    got = pair(base, [(5.0, 132.0), (20.0, 130.0), (40.0, 500.0)])  # the last has no base run after it
    assert got is not None and got.refs == [110.0, 130.0] and got.base_runs == 3
    assert got.change_pct == pytest.approx(10.0)  # +20% and +0%
    assert pair(base[:1], [(5.0, 100.0)]) is None  # no base run after it: no pair


def campaign(tmp_path: Path, monkeypatch, paired: str, drift: float) -> tuple[Store, str]:
    formula = Formula(EFFECTS)
    plan = formula_plan(EFFECTS, {"01": 1, "02": 1}, {"01": "+5%", "02": "+30%"})
    monkeypatch.setattr(search, "predictor_for", lambda method: FormulaPredictor(formula))
    engine = FormulaEngine(formula, drift=drift)
    settings = m.SessionSettings(paired=paired, search=False)  # the plain path: every item launched in plan order
    store, sid, _ = run_to_the_end(tmp_path / paired, plan, engine, settings, continues=3)
    return store, sid


def verdicts(store: Store, sid: str) -> dict[str, m.Experiment]:
    return {e.plan_item: e for e in store.experiments(sid) if e.plan_item and e.verdict}


def test_a_host_that_speeds_up_run_after_run_adopts_nothing_false_when_runs_are_paired(tmp_path, monkeypatch):
    """Every run measures 5% more than the one before it (the host's load falls). Compared with the base's runs
    taken before it, a null control reads as a gain beyond the band and is adopted; in pairs it is not, and the real
    +30% is reported within a few points of +30%, not at the drift's +50%."""
    store, sid = campaign(tmp_path, monkeypatch, "off", drift=0.05)
    old = verdicts(store, sid)
    assert old["01"].verdict == "adopted"  # the failure pairing exists for

    store, sid = campaign(tmp_path, monkeypatch, "on", drift=0.05)
    new = verdicts(store, sid)
    assert new["01"].verdict == "no_gain", new["01"].reason
    assert "paired with its base measured before and after it (A/B/A" in (new["01"].reason or "")
    assert new["02"].verdict == "adopted", new["02"].reason
    method = Method.read(store, sid)
    j = method.judge(new["02"])
    assert 24 < (j.change_pct or 0) < 36, j.text
    base = method.baseline()
    assert base is not None and method.run_count(base) >= 3  # measured again after the changes
    level = max(method.ok_values(base))
    steady = back_to_back(base.id or 0, method.experiments, method.runs, method.objective.value_of_run, level)
    assert len(steady) == 2  # the band is the back-to-back runs' spread, not the drift's


def test_paired_auto_leaves_a_simulated_engine_unpaired(tmp_path, monkeypatch):
    store, sid = campaign(tmp_path, monkeypatch, "auto", drift=0.0)
    got = verdicts(store, sid)
    assert got["02"].verdict == "adopted" and "A/B/A" not in (got["02"].reason or "")
    method = Method.read(store, sid)
    assert method.run_count(method.baseline()) == 2  # no base measured again
