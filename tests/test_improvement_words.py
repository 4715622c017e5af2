"""An improvement document says each thing once: a not-launched item's status is not repeated three times, a page
with two predictions says which is current, and a combined step's change is never held against one item's range."""

from __future__ import annotations

from agent import models as m
from tests.factories import bench_level
from tools.reports import Ledger, render_improvement

REASON = ("not launched: predicted +1.5%, inside the 3.5% noise band: the twin predicts 2,077 output tok/s at "
          "concurrency 8. A prediction, not a measurement")  # fmt: skip


def _session(store, plan) -> tuple[m.Experiment, str]:
    store.create_session(m.Session(id="words1", name="x", plan=plan, engine="sim"))
    base = store.add_experiment("words1", m.Experiment(kind="baseline", config=plan.target.base_config(),
                                                       workload=plan.workload, status="finished", verdict="baseline"))  # fmt: skip
    store.add_bench_result(base.id, m.BenchResult(spec=plan.workload, engine="sim", source="simulated",
                                                  levels=[bench_level(1, 10.0), bench_level(8, 100.0)]))  # fmt: skip
    return base, "words1"


def _predicted(store, plan, base, pct: float, reason: str = REASON) -> m.Experiment:
    item = plan.item("01")
    return store.add_experiment("words1", m.Experiment(
        plan_item="01", plan_items=["01"], config=item.apply(base.config), base_experiment_id=base.id,
        workload=plan.workload, status="planned", verdict="predicted", reason=reason, predicted_change_pct=pct,
        prediction=f"the twin predicts {pct:+.1f}%"))  # fmt: skip


def test_a_not_launched_item_says_so_once(store, small_plan):
    base, sid = _session(store, small_plan)
    _predicted(store, small_plan, base, 1.5)
    text, status, _ = render_improvement(Ledger.read(store, sid), small_plan.item("01"))
    assert status == "not launched: the twin predicts no gain"
    assert text.count("not launched") <= 2 and "not launched: not launched" not in text
    assert text.count("predicted +1.5%, inside the 3.5% noise band") == 1  # the reason, whole, in one place
    assert "(the twin predicts no gain) (experiment" not in text


def test_two_predictions_on_a_page_say_which_is_current(store, small_plan):
    base, sid = _session(store, small_plan)
    _predicted(store, small_plan, base, 1.5)
    item = small_plan.item("01")
    later = store.add_experiment("words1", m.Experiment(
        plan_item="01", plan_items=["01"], config=item.apply(base.config), base_experiment_id=base.id,
        workload=small_plan.workload, status="finished", verdict="no_gain", reason="+0.2% at 8, inside the band",
        predicted_change_pct=0.1, prediction="the twin predicts +0.1%"))  # fmt: skip
    store.add_bench_result(later.id, m.BenchResult(spec=small_plan.workload, engine="sim", source="simulated",
                                                   levels=[bench_level(1, 10.0), bench_level(8, 100.2)]))  # fmt: skip
    text, _, _ = render_improvement(Ledger.read(store, sid), item)
    assert "+1.5%" in text and "+0.1%" in text
    assert "Earlier, on experiment #1 (the best then), experiment #2 had the prediction +1.5%" in text
    assert "(experiment #3, on experiment #1) is the current one" in text
    assert "Before the launch of experiment #3, the search's prediction: the twin predicts +0.1%" in text


def test_a_combined_steps_change_is_not_held_against_one_items_range(store, small_plan):
    base, sid = _session(store, small_plan)
    item = small_plan.item("01")
    both = store.add_experiment("words1", m.Experiment(
        plan_item="01", plan_items=["01", "02"], config=item.apply(base.config), base_experiment_id=base.id,
        workload=small_plan.workload, status="finished", verdict="adopted", reason="+30% at 8"))  # fmt: skip
    store.add_bench_result(both.id, m.BenchResult(spec=small_plan.workload, engine="sim", source="simulated",
                                                  levels=[bench_level(1, 10.0), bench_level(8, 130.0)]))  # fmt: skip
    text, _, _ = render_improvement(Ledger.read(store, sid), item)
    assert "the change above is the combination's (01+02), not this item's alone" in text
    assert "above the expected range" not in text and "within it" not in text  # 01 expects +10% at 8
