"""The wrong-twin benchmark's truths (benchmarks/wrong_twin.py, [learn]): what each scenario makes wrong about the twin
is what it says, on every shipped search plan, and the files written under benchmarks/wrong_twin/ are today's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.plans import load_plan
from tools.engines.sim.truth import load_truth

ROOT = Path(__file__).resolve().parent.parent
PLANS = sorted((ROOT / "benchmarks" / "search_plans").glob("*.toml"))


@pytest.fixture(scope="module")
def wrong_twin():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import wrong_twin

    return wrong_twin


@pytest.mark.parametrize("plan_path", PLANS, ids=[p.stem for p in PLANS])
def test_each_scenario_is_the_wrong_it_names(wrong_twin, plan_path: Path, tmp_path: Path) -> None:
    plan = load_plan(str(plan_path))
    texts = wrong_twin.truth_texts(plan_path)
    alone = wrong_twin._alone(plan)
    best = set(wrong_twin.grid_of(plan_path)["best"].split("+"))
    assert {"s1", "s3", "s5", "s7"} <= set(texts)
    for name, text in texts.items():
        f = tmp_path / f"{name}.toml"
        f.write_text(text)
        truth = load_truth(str(f))  # a truth file the sim engine takes (-o truth=FILE)
        written = ROOT / "benchmarks" / "wrong_twin" / plan.name / f"{name}.toml"
        assert written.read_text() == text, f"{written} is stale: run benchmarks/wrong_twin.py"
        item = truth.name.split("-")[1]
        if name in ("s3", "s7"):  # the hardware: no flag is wrong
            assert not truth.flags and truth.hardware.scale
        if name == "s7":
            assert truth.hardware.scale == wrong_twin.S7_SCALES
        if name == "s5":  # the item the twin predicts gains most alone costs 10%
            (effect,) = truth.flags
            assert alone[item] == max(alone.values()) and effect.throughput_scale == pytest.approx(
                wrong_twin.HARM_SCALE
            )
        if name == "s6":  # s1's item has no effect and s2's costs 8%, together
            dead, costly = truth.name.split("-")[1:]
            assert dead == load_truth(str(written.with_name("s1.toml"))).name.split("-")[1]
            assert costly == load_truth(str(written.with_name("s2.toml"))).name.split("-")[1]
            assert any(f.no_effect for f in truth.flags)
            assert [f.throughput_scale for f in truth.flags if not f.no_effect] == [wrong_twin.COST_SCALE]
        if name == "s1":  # the item the twin predicts gains most alone does nothing
            assert alone[item] == max(alone.values()) and all(f.no_effect for f in truth.flags)
        if name in ("s2", "s4"):  # an item the twin calls neutral costs / gains 8%
            assert abs(alone[item]) < wrong_twin.NEUTRAL_PCT
            (effect,) = truth.flags
            scale = wrong_twin.COST_SCALE if name == "s2" else wrong_twin.GAIN_SCALE
            assert effect.throughput_scale == pytest.approx(scale)
        if name == "s4":  # one the search would not launch for the twin's sake, and the engine runs
            assert item not in best and wrong_twin._runs(plan, plan.item(item))


def test_plans_without_expectations_keep_everything_but_the_numbers(wrong_twin) -> None:
    """--no-expectations: the same plans, each item's expected impact without a number (the twin's word alone)."""
    from tools.reports import parse_expectation

    for original, copy in zip(PLANS, wrong_twin.without_expectations(PLANS), strict=True):
        plan, stripped = load_plan(str(original)), load_plan(str(copy))
        assert [it.id for it in stripped.items] == [it.id for it in plan.items]
        assert stripped.model_dump(exclude={"items", "source"}) == plan.model_dump(exclude={"items", "source"})
        assert any(parse_expectation(it.expected_impact) for it in plan.items)
        for it, bare in zip(plan.items, stripped.items, strict=True):
            assert parse_expectation(bare.expected_impact) is None, bare.expected_impact
            assert bare.model_copy(update={"expected_impact": it.expected_impact}) == it


def test_a_copy_without_expectations_reads_its_plans_cached_grids(wrong_twin, monkeypatch) -> None:
    """The copies' grids are their plans' (same items, same flags): read from the caches under the plan, never
    computed again nor written back under the copy's bytes."""
    copies = wrong_twin.without_expectations(PLANS[:1])
    assert wrong_twin.ORIGINALS[copies[0]] == PLANS[0]
    cases = wrong_twin.write_truths(copies, ["exact", "s1"])

    def computed(*_):
        raise AssertionError("a copy's grid was computed again")

    monkeypatch.setattr(wrong_twin, "grid", computed)
    monkeypatch.setattr(wrong_twin, "_grid_job", computed)
    out = wrong_twin.grids(cases, jobs=1)
    assert {k: g["best"] for k, g in out.items()} == {
        k: g["best"] for k, g in wrong_twin.grids(wrong_twin.write_truths(PLANS[:1], ["exact", "s1"]), 1).items()
    }


@pytest.mark.parametrize("plan_path", PLANS, ids=[p.stem for p in PLANS])
def test_random_truths_are_valid_seeded_and_wrong_everywhere(wrong_twin, plan_path: Path, tmp_path: Path) -> None:
    """--random N: r<k> is the same text every run (seeded by the plan and k), a truth the sim engine takes whose
    hardware stays a valid profile, with items made dead only where the base does not set their flags."""
    plan = load_plan(str(plan_path))
    base = plan.target.base_config()
    texts = [wrong_twin.random_text(plan_path, k) for k in (1, 2, 3)]
    assert texts == [wrong_twin.random_text(plan_path, k) for k in (1, 2, 3)] and len(set(texts)) == 3
    for k, text in enumerate(texts, 1):
        f = tmp_path / f"r{k}.toml"
        f.write_text(text)
        truth = load_truth(str(f))
        assert truth.name == f"r{k}" and set(truth.hardware.scale) == set(wrong_twin.RANDOM_HARDWARE)
        hw = truth.hardware_for(plan.target.hardware)  # a valid profile: every efficiency at most 1
        assert hw.calibration.bandwidth_efficiency <= 1 and hw.calibration.allreduce_efficiency <= 1
        assert all(not e.no_effect or e.flag not in base for e in truth.flags)
        assert all(e.no_effect or abs(e.throughput_scale - 1) < 0.5 for e in truth.flags)
        ran = {f.name for it in plan.items if it.flags and wrong_twin._runs(plan, it) for f in it.flags.flags}
        assert {e.flag for e in truth.flags} <= ran  # a flag the engine refuses or ignores is wrong nowhere
        written = ROOT / "benchmarks" / "wrong_twin" / plan.name / f"r{k}.toml"
        assert written.read_text() == text, f"{written} is stale: run benchmarks/wrong_twin.py --random 3"
