"""What a campaign learns about the twin (tools/learn.py): per-item corrections with their uncertainty."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tools import learn


def _obs(n: int, items: set[str], measured: float, predicted: float, runs: int = 2) -> learn.Observation:
    return learn.Observation(n, n, frozenset(items), math.log(measured / predicted), runs, measured, predicted)


def _change(belief: learn.Belief, twin_ratio: float, held: set[str], best: set[str] = frozenset()) -> float:
    """The corrected change in % of a configuration the twin puts at `twin_ratio` of the best."""
    d, _ = belief.difference(held, best)
    return (twin_ratio * math.exp(d) - 1) * 100


def test_an_item_measured_at_no_effect_twice_is_shrunk_to_within_the_band_of_zero():
    """The twin says +16%; two experiments (on other bases) measure no change: the corrected gain is inside the
    noise band of zero, and stays there in every combination that holds the item."""
    priors = learn.prior_sds({"03": 1.16, "05": 1.02})
    obs = [
        _obs(1, set(), 1000.0, 1000.0),  # the baseline, as predicted
        _obs(2, {"03"}, 1000.0, 1160.0),  # 03 alone: no effect
        _obs(3, {"05"}, 1020.0, 1020.0),
        _obs(4, {"03", "05"}, 1020.0, 1183.2),  # 03 on top of 05: no effect again
    ]
    belief = learn.fit(obs, priors, sigma=0.01)
    band = 3.0
    assert abs(_change(belief, 1.16, {"03"})) < band / 2
    assert abs(_change(belief, 1.16, {"03", "05"}, {"05"})) < band / 2
    mean, sd = belief.item("03")
    assert mean == pytest.approx(math.log(1 / 1.16), abs=0.01) and sd < 0.01
    assert abs(belief.item("05")[0]) < 0.005  # measured as predicted: left alone


def test_before_any_measurement_the_twin_is_the_prior_and_its_doubt_grows_with_its_claim():
    belief = learn.fit([], learn.prior_sds({"01": 1.20, "02": 1.0}), sigma=0.01)
    assert belief.item("01")[0] == 0.0 and belief.item("02")[0] == 0.0
    assert belief.item("01")[1] > 2 * belief.item("02")[1]  # +20% claimed: doubted more than a no-op
    assert _change(belief, 1.20, {"01"}) == pytest.approx(20.0)


def test_the_common_error_is_not_blamed_on_items():
    """Every configuration 10% below the twin: the common term carries it, the items stay as predicted."""
    priors = learn.prior_sds({"01": 1.05, "02": 1.08})
    obs = [
        _obs(1, set(), 900.0, 1000.0, runs=3),
        _obs(2, {"01"}, 945.0, 1050.0),
        _obs(3, {"01", "02"}, 1020.6, 1134.0),
    ]
    belief = learn.fit(obs, priors, sigma=0.01)
    assert math.exp(belief.common[0]) == pytest.approx(0.9, abs=0.005)
    assert abs(belief.item("01")[0]) < 0.005 and abs(belief.item("02")[0]) < 0.005


def test_a_missed_bundle_is_split_by_the_priors_and_a_suspect_can_carry_it():
    """01+03+04 predicted +8.6%, measured +0%: the model cannot tell which member; with 04 as the suspect (its prior
    left open) the whole miss is 04's, and 01+03 keeps the twin's gain."""
    priors = learn.prior_sds({"01": 1.0, "03": 1.05, "04": 1.0})
    obs = [_obs(1, set(), 1000.0, 1000.0), _obs(2, {"01", "03", "04"}, 1000.0, 1086.0)]
    plain = learn.fit(obs, priors, sigma=0.01)
    for i in ("01", "03", "04"):
        assert plain.item(i)[0] < 0  # each member takes a share
    assert plain.difference({"01", "03", "04"}, ())[0] == pytest.approx(math.log(1 / 1.086), abs=0.005)
    suspect = learn.fit(obs, {**priors, "04": learn.SUSPECT_SD}, sigma=0.01)
    assert _change(suspect, 1.06, {"01", "03"}) == pytest.approx(6.0, abs=0.3)
    assert _change(plain, 1.06, {"01", "03"}) < 3.0  # the plain reading would never launch it


def test_held_items_reads_the_configuration():
    from agent.plans import load_plan

    plan = load_plan(str(Path(__file__).resolve().parent.parent / "benchmarks/search_plans/eval-llama70b-h200x1.toml"))
    base = plan.target.base_config()
    config = plan.item("03").apply(plan.item("01").apply(base))
    assert learn.held_items(plan, config, base, plan.item_ids()) == {"01", "03"}
    assert learn.held_items(plan, base, base, plan.item_ids()) == frozenset()


def test_factor_text_gives_the_interval():
    assert learn.factor_text(math.log(0.92), 0.01) == "x0.920 (0.90-0.94)"
