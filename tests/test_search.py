"""The search (tools/search.py): candidates of every kind on a twin with known interactions, the confirmation rule,
no launch for no-op flags, items predicted inside the noise recorded as predictions, and the pivot options.

The twin is replaced by a small function of the flags (`fake_twin`) whose interactions are the kinds the search is
built for; the audit is SGLang 0.5.23's catalog (so --num-continuous-decode-steps is a real no-op)."""

from __future__ import annotations

import pytest
from pydantic_ai import ModelRetry

from agent import models as m
from agent.contracts import Prediction
from agent.session import Session
from tests.factories import bench_level
from tools import search
from tools.engines.sim.engine import SimEngine
from tools.method import Decision, Method, decision, offers
from tools.method.moves import as_asked
from tools.method.offers import retry_offer

TOP = 1024

ITEMS = {
    "01": ("--max-running-requests 1024", "Raise the running cap"),  # capacity pair with 02: pays only together
    "02": ("--mem-fraction-static 0.9", "More memory for the KV pool"),
    "03": ("--schedule-conservativeness 0.5", "Less conservative scheduling"),  # sub-floor, adds up with 04
    "04": ("--chunked-prefill-size 16384", "Larger prefill chunks"),
    "05": ("--num-continuous-decode-steps 8", "Continuous decode steps"),  # a no-op in SGLang 0.5.23
    "06": ("--cuda-graph-max-bs-decode 512", "Decode CUDA graphs up to 512"),  # pays only after 07
    "07": ("--tp-size 2 --pp-size 1", "TP2 instead of PP2"),
    "08": ("--disable-overlap-schedule", "No overlap scheduler"),  # neutral
}


def fake_tok(config: m.ServerConfig) -> float:
    flags = str(config)
    has = {k: v[0] in flags for k, v in ITEMS.items()}
    tok = 1000.0
    if has["01"] and has["02"]:
        tok *= 1.16
    elif has["01"]:
        tok *= 1.008
    tok *= 1.021 if has["03"] else 1.0
    tok *= 1.020 if has["04"] else 1.0
    if has["03"] and has["04"]:
        tok *= 1.006
    if has["07"]:
        tok *= 1.30
    if has["06"]:
        tok *= 1.066 if has["07"] else 1.021
    tok *= 1.004 if has["08"] else 1.0
    return tok


class FakePredictor:
    """A predictor of the contract (agent/contracts/predictor.py) reading `fake_tok`, or `read` when given."""

    name = "a fake twin"

    def __init__(self, read=None) -> None:
        self.read = read

    def predict(self, config, spec, level):
        if self.read is not None:
            return self.read(config, level)
        return Prediction(bench_level(level, fake_tok(config)))


@pytest.fixture
def fake_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "predictor_for", lambda method: FakePredictor())


def make_plan(ids: list[str], tiers: dict[str, int] | None = None) -> m.Plan:
    items = []
    for i in ids:
        flags, title = ITEMS[i]
        items.append(
            m.PlanItem(
                id=i,
                tier=(tiers or {}).get(i, 1),
                title=title,
                kind="flag",
                flags=m.ServerConfig.parse(flags),
                hypothesis="h",
                expected_impact="+2-5% output tok/s.",
            )
        )
    return m.Plan(
        name="search-test",
        title="search test",
        target=m.Target(
            model="m",
            model_profile="llama-3.3-70b-fp8",
            hardware="h200",
            gpus=2,
            flags=m.ServerConfig.parse("--tp-size 1 --pp-size 2"),
        ),
        workload=m.BenchSpec(concurrency=[1, TOP]),
        tiers={1: "one", 2: "two"},
        items=items,
    )


def session_for(store, paths, plan: m.Plan, **settings) -> Session:
    s = Session.create(
        store, paths, plan, engine_name="sim", engine=SimEngine(), settings=m.SessionSettings(**settings)
    )
    return s


def measure(store, session: Session, e: m.Experiment, *values: float) -> m.Experiment:
    for v in values:
        store.add_bench_result(
            e.id or 0,
            m.BenchResult(
                spec=session.plan.workload,
                engine="sim",
                source="simulated",
                levels=[bench_level(1, 10), bench_level(TOP, v)],
            ),
        )
    return store.update_experiment(e.model_copy(update={"status": "finished"}))


def add(
    store, session: Session, items: list[str], config: m.ServerConfig, base: m.Experiment | None, **update
) -> m.Experiment:
    kind = "baseline" if not items else "change"
    e = store.add_experiment(
        session.id,
        m.Experiment(
            plan_items=items,
            kind=kind,
            config=config,
            base_experiment_id=base.id if base else None,
            workload=session.plan.workload,
        ),
    )
    return store.update_experiment(e.model_copy(update=update)) if update else e


def baseline(store, session: Session, value: float = 1000.0) -> m.Experiment:
    base = add(store, session, [], session.plan.target.base_config(), None)
    base = measure(store, session, base, value, value * 1.0001)  # runs a real engine gives: never the same twice
    return store.update_experiment(base.model_copy(update={"verdict": "baseline"}))


def validate(config: m.ServerConfig) -> list[m.FlagIssue]:
    return SimEngine().validate(config)


def test_capacity_pair_is_one_combined_step(store, paths, fake_twin) -> None:
    s = session_for(store, paths, make_plan(["01", "02", "08"]))
    baseline(store, s)
    method = Method.read(store, s.id)
    ranked = search.candidates(method, decision(method))
    top = ranked[0]
    assert top.kind == "combined" and top.items == ("01", "02")
    assert top.gain == pytest.approx(16.0, abs=0.1)
    assert top.alone["01"] == pytest.approx(0.8, abs=0.1) and top.alone["02"] == pytest.approx(0.0, abs=0.1)
    step = search.next_step(method, decision(method), validate)
    assert step is not None and step.action == "launch" and step.items == ("01", "02")
    assert "01 + 02 together" in step.reason and "alone" in step.reason
    # a neutral item never rides along in a combination (each item must add its share)
    assert not any(c.kind == "combined" and "08" in c.items for c in ranked)


def test_sub_floor_gains_that_add_up_are_combined(store, paths, fake_twin) -> None:
    s = session_for(store, paths, make_plan(["03", "04"]))
    baseline(store, s)
    method = Method.read(store, s.id)
    ranked = search.candidates(method, decision(method))
    assert ranked[0].items == ("03", "04") and ranked[0].kind == "combined"
    assert ranked[0].gain > method.band_pct() > max(ranked[0].alone.values())
    step = search.next_step(method, decision(method), validate)
    assert step is not None and step.items == ("03", "04")


def test_noop_item_is_ruled_out_without_a_launch(store, paths, fake_twin) -> None:
    from tools.docs import _rule_out_item

    s = session_for(store, paths, make_plan(["05", "08"]))
    baseline(store, s)
    method = Method.read(store, s.id)
    step = search.next_step(method, decision(method), validate)
    assert step is not None and step.action == "ruled_out" and step.items == ("05",)
    assert "no-op" in step.reason and "no launch" in step.reason
    e = _rule_out_item(s, method, "05", step.reason)
    assert e.verdict == "ruled_out" and e.status == "planned" and store.bench_results(e.id or 0) == []
    # an item whose flags are not no-ops still cannot be ruled out without a measurement
    with pytest.raises(ModelRetry):
        _rule_out_item(s, Method.read(store, s.id), "08", "no reason")


def test_item_predicted_inside_the_noise_is_not_launched_and_says_so(store, paths, fake_twin) -> None:
    from tools.docs import _predicted_item

    s = session_for(store, paths, make_plan(["08"]))
    baseline(store, s)
    method = Method.read(store, s.id)
    step = search.next_step(method, decision(method), validate)
    assert step is not None and step.action == "predicted" and step.items == ("08",)
    assert "not launched" in step.reason and "prediction, not a measurement" in step.reason
    e = _predicted_item(s, method, "08", step.reason)
    assert e.verdict == "predicted" and e.predicted_change_pct == pytest.approx(0.4, abs=0.05)
    method = Method.read(store, s.id)
    assert method.done(s.plan.item("08"))
    # the plan expects +2-5% of it, the twin +0.4%: one launch checks the twin, once nothing else is left
    check = search.next_step(method, decision(method), validate)
    assert check is not None and check.action == "launch" and check.items == ("08",), check
    assert "one launch checks the twin" in check.reason
    # a gain beyond the band cannot be recorded as a prediction: it must be measured
    s2 = session_for(store, paths, make_plan(["07"]))
    baseline(store, s2)
    with pytest.raises(ModelRetry):
        _predicted_item(s2, Method.read(store, s2.id), "07", "skip")


def test_retest_after_an_adoption_and_bounded(store, paths, fake_twin) -> None:
    plan = make_plan(["06", "07"])
    s = session_for(store, paths, plan)
    base = baseline(store, s)
    cg = add(store, s, ["06"], plan.item("06").apply(base.config), base)
    measure(store, s, cg, 1021, 1021)
    store.update_experiment(store.get_experiment(cg.id).model_copy(update={"verdict": "no_gain"}))
    tp = add(store, s, ["07"], plan.item("07").apply(base.config), base)
    measure(store, s, tp, 1300, 1300)
    store.update_experiment(store.get_experiment(tp.id).model_copy(update={"verdict": "adopted"}))
    method = Method.read(store, s.id)
    step = search.next_step(method, decision(method), validate)
    assert step is not None and step.action == "launch" and step.items == ("06",)
    assert step.candidate is not None and step.candidate.kind == "retest"
    assert step.candidate.gain == pytest.approx(6.6, abs=0.1) and "retest of 06" in step.reason
    head, sentence = offers.option_text(method, step.candidate)
    assert "retest" in head and "+6.6%" in sentence
    # bounded: after its retest on this best, 06 is not proposed again
    again = add(store, s, ["06"], plan.item("06").apply(tp.config), tp)
    measure(store, s, again, 1301, 1301)
    store.update_experiment(store.get_experiment(again.id).model_copy(update={"verdict": "no_gain"}))
    method = Method.read(store, s.id)
    assert search.next_step(method, decision(method), validate) is None


def test_combined_experiment_counts_for_every_item(store, paths, fake_twin) -> None:
    plan = make_plan(["01", "02"])
    s = session_for(store, paths, plan)
    base = baseline(store, s)
    both = add(store, s, ["01", "02"], plan.item("02").apply(plan.item("01").apply(base.config)), base)
    measure(store, s, both, 1160, 1160)
    store.update_experiment(store.get_experiment(both.id).model_copy(update={"verdict": "adopted"}))
    method = Method.read(store, s.id)
    assert method.done(plan.item("01")) and method.done(plan.item("02"))
    assert [e.id for e in method.final(plan.item("02"))] == [both.id]
    assert search.next_step(method, decision(method), validate) is None


def test_adoption_is_confirmed_by_a_second_run(store, paths, fake_twin) -> None:
    plan = make_plan(["07"])
    for searched, first in ((True, "rerun"), (False, "adopted")):
        s = session_for(store, paths, plan, search=searched)
        base = baseline(store, s)
        e = add(store, s, ["07"], plan.item("07").apply(base.config), base)
        measure(store, s, e, 1100)
        j = Method.read(store, s.id).judge(e)
        assert j.suggestion == first
        if searched:
            assert "confirms" in j.text
            measure(store, s, e, 1050)  # the mean, 1,075, beats the band (and the runs' own 4.7% spread): adopted
            assert Method.read(store, s.id).judge(e).suggestion == "adopted"
            lucky = add(store, s, ["07"], plan.item("07").apply(base.config), base)
            measure(store, s, lucky, 1040, 1000)  # +4% once, then nothing: the mean (+2%) is inside the band,
            j = Method.read(store, s.id).judge(lucky)  # by less than its standard error on runs this scattered
            assert j.suggestion == "rerun" and "within its standard error" in j.text
            measure(store, s, lucky, 1000, 1005)  # two more runs (NEAR_BAND_RUNS): their mean (+1.1%) is no gain
            assert Method.read(store, s.id).judge(lucky).suggestion == "no_gain"


def test_search_off_is_the_greedy_path(store, paths, fake_twin) -> None:
    s = session_for(store, paths, make_plan(["01", "02"]), search=False)
    baseline(store, s)
    method = Method.read(store, s.id)
    assert search.next_step(method, decision(method), validate) is None
    assert offers.search_options(method, decision(method)) == []


def test_search_stays_inside_opened_tiers_and_options_name_every_item(store, paths, fake_twin) -> None:
    plan = make_plan(["08", "01", "02"], tiers={"08": 1, "01": 2, "02": 2})
    s = session_for(store, paths, plan)
    baseline(store, s)
    method = Method.read(store, s.id)
    d = decision(method)
    assert d.released == {1}
    assert all(c.items == ("08",) for c in search.candidates(method, d))
    opened = Decision(released={1, 2})
    (head, sentence), *_ = offers.search_options(method, opened)
    assert head == "test 01+02 together"
    assert "01 Raise the running cap + 02 More memory for the KV pool" in sentence
    assert "1 launch, 2 if it gains" in sentence and "+16.0%" in sentence
    # the answer "test 01+02 together" launches one experiment naming both items
    store.add_pivot(s.id, m.Pivot(question="q", options=[sentence, "stop"], answer="1", answered_at=m.utcnow()))
    method = Method.read(store, s.id)
    d = decision(method)
    (asked, since), *_ = d.asked()
    assert asked == "01"
    step = as_asked(method, plan.item("01"), since)
    assert step.launch_args() == {"plan_items": ["01", "02"]}


def test_retry_option_after_a_crash_under_load(store, paths, fake_twin) -> None:
    plan = make_plan(["07"])
    plan = plan.model_copy(update={"workload": m.BenchSpec(concurrency=[1, 256, TOP])})
    s = session_for(store, paths, plan)
    base = add(store, s, [], plan.target.base_config(), None)
    for _ in range(2):
        store.add_bench_result(
            base.id or 0,
            m.BenchResult(
                spec=plan.workload,
                engine="sim",
                source="simulated",
                levels=[bench_level(1, 10), bench_level(256, 500), bench_level(TOP, 1000)],
            ),
        )
    store.update_experiment(
        store.get_experiment(base.id).model_copy(update={"verdict": "baseline", "status": "finished"})
    )
    e = add(store, s, ["07"], plan.item("07").apply(base.config), store.get_experiment(base.id))
    store.add_bench_result(
        e.id or 0,
        m.BenchResult(
            spec=plan.workload,
            engine="sim",
            source="simulated",
            levels=[bench_level(1, 12), bench_level(256, 640), bench_level(TOP, 0, completed=0, failed=TOP)],
        ),
    )
    store.update_experiment(store.get_experiment(e.id).model_copy(update={"verdict": "crashed", "status": "finished"}))
    method = Method.read(store, s.id)
    offer = retry_offer(method, store.get_experiment(e.id))
    assert offer is not None
    head, option = offer
    assert option.startswith("retry 07") and head == "retry 07 TP2 instead of PP2 with --max-running-requests 256"
    assert "--max-running-requests 256" in option and "1 launch" in option and "the twin predicts" in option
    store.add_pivot(s.id, m.Pivot(question="q", options=[option, "stop"], answer="1", answered_at=m.utcnow()))
    method = Method.read(store, s.id)
    (_, since), *_ = decision(method).asked()
    assert as_asked(method, plan.item("07"), since).launch_args() == {
        "plan_item": "07",
        "flags": "--max-running-requests 256",
    }


def test_search_candidates_tool_gives_predictions_and_the_band(store, paths, fake_twin) -> None:
    from types import SimpleNamespace

    from tools.docs import search_candidates

    s = session_for(store, paths, make_plan(["01", "02", "08"]))
    baseline(store, s)
    out = search_candidates(SimpleNamespace(deps=s), limit=3)
    assert out["band_pct"] == pytest.approx(3.0)
    first = out["candidates"][0]
    assert first["plan_items"] == ["01", "02"] and first["kind"] == "combined" and first["source"] == "twin"
    assert first["predicted_change_pct"] == pytest.approx(16.0, abs=0.1)


def test_reports_name_every_item_of_a_combined_step_and_the_predictions(store, paths, fake_twin) -> None:
    from tools import reports
    from tools.docs import _predicted_item

    plan = make_plan(["01", "02", "08"])
    s = session_for(store, paths, plan)
    base = baseline(store, s)
    config = plan.item("02").apply(plan.item("01").apply(base.config))
    both = add(store, s, ["01", "02"], config, base, predicted_change_pct=16.0, prediction="the twin predicts 1,160")
    measure(store, s, both, 1158, 1162)
    store.update_experiment(store.get_experiment(both.id).model_copy(update={"verdict": "adopted", "reason": "r"}))
    _predicted_item(s, Method.read(store, s.id), "08", "not launched: predicted +0.4%")
    ledger = reports.Ledger.read(store, s.id)
    text = reports.render_status(ledger, 1, "q?", ["stop"]).markdown
    row = next(line for line in text.splitlines() if line.startswith(f"| #{both.id} "))
    assert "| 01+02 |" in row and "[predicted +16.0%]" in row and "adopted" in row
    assert "one experiment that combined those items" in text
    predicted_row = next(line for line in text.splitlines() if "| 08 |" in line)
    assert "not launched" in predicted_row and "predicted +0.4%" in predicted_row
    assert "Not launched: when experiment #" in text and "the twin predicted +0.4% against experiment #" in text
    doc, _, _ = reports.render_improvement(ledger, plan.item("02"))
    assert "together with 01 Raise the running cap as one step (01+02)" in doc
    assert "the search's prediction: the twin predicts 1,160" in doc
    doc8, status8, _ = reports.render_improvement(ledger, plan.item("08"))
    assert status8.startswith("not launched") and "prediction, not a measurement" in doc8


def test_an_item_the_twin_says_would_not_start_is_not_launched(store, paths, monkeypatch) -> None:
    def reading(config, level):
        if "--mem-fraction-static 0.9" in str(config):
            return Prediction(crashed=True, error="the server would not start: out of memory")
        return Prediction(bench_level(level, fake_tok(config)))

    monkeypatch.setattr(search, "predictor_for", lambda method: FakePredictor(reading))
    s = session_for(store, paths, make_plan(["02"]))
    baseline(store, s)
    method = Method.read(store, s.id)
    step = search.next_step(method, decision(method), validate)
    assert step is not None and step.action == "predicted" and step.items == ("02",)
    assert "predicted a crash" in step.reason and "would not start: out of memory" in step.reason


def test_no_search_on_the_command_line_is_the_greedy_setting() -> None:
    from agent.defaults import session_settings as _settings

    method = {"min_gain": 3.0, "reruns": 1, "stall_after": 3, "seed": 0, "request_limit": 400}
    target = make_plan(["01"]).target
    greedy = _settings(target, "sim", {}, None, {**method, "no_search": True})
    assert (greedy.search, greedy.proposer) == (False, "plan-order")
    assert _settings(target, "sim", {}, None, {**method, "search_kind": "plan-order"}).search is False
    peer = _settings(target, "sim", {}, None, {**method, "search_kind": "optuna-tpe"})
    assert (peer.search, peer.proposer) == (True, "optuna-tpe")  # a peer under the method's confirmed adoptions
    assert _settings(target, "sim", {}, None, method).search is True  # the default: the search


def test_a_change_at_the_band_is_judged_with_the_twins_record(store, paths, fake_twin) -> None:
    """The measured change and the twin's prediction, weighted by their precision: a change the twin predicted
    beyond the band, measured just inside it, is adopted when the twin's record in this campaign is good; judged on
    the measurement alone without a prediction or with a twin the campaign showed to be off; never adopted when the
    twin puts it inside the band too. The measured change stays the measured one."""
    plan = make_plan(["07", "06", "08"])

    def campaign(
        predicted_07: float, predicted_06: float | None, measured_06: float, runs: int = 2
    ) -> tuple[Method, m.Experiment]:
        s = session_for(store, paths, plan)
        base = add(store, s, [], plan.target.base_config(), None)
        base = store.update_experiment(measure(store, s, base, 1000, 1010).model_copy(update={"verdict": "baseline"}))
        first = add(store, s, ["07"], plan.item("07").apply(base.config), base, predicted_change_pct=predicted_07)
        first = measure(store, s, first, 1300, 1315)  # +30.3% measured
        first = store.update_experiment(first.model_copy(update={"verdict": "adopted"}))
        b = 1307.5 * (1 + measured_06 / 100)
        e = add(store, s, ["06"], plan.item("06").apply(first.config), first, predicted_change_pct=predicted_06)
        e = measure(store, s, e, *[b - 5, b + 5] * (runs // 2))
        return Method.read(store, s.id), e

    method, e = campaign(30.0, 3.6, 2.4)  # the twin within noise of its one measured change
    j = method.judge(e)  # within its standard error of the band on two runs: measured again (NEAR_BAND_RUNS)
    assert j.suggestion == "rerun" and "within its standard error" in j.text, j.text
    method, e = campaign(30.0, 3.6, 2.4, runs=4)
    j = method.judge(e)
    assert j.change_pct == pytest.approx(2.4, abs=0.01), j.text  # the measurement, as measured
    assert 3.0 < (j.judged_pct or 0) < 3.6 and j.suggestion == "adopted"
    assert "measured +2.4% (4 runs) and predicted +3.6% (the twin, within 0.5% of 1 measured change" in j.text
    assert f"{j.judged_pct:+.1f}%, beyond the 3.0% noise band" in j.text

    method, e = campaign(30.0, None, 2.4, runs=4)  # no prediction: today's rule (on 4 runs: none near the band)
    j = method.judge(e)
    assert j.judged_pct == j.change_pct and j.suggestion == "no_gain" and "predicted" not in j.text

    method, e = campaign(20.0, 3.6, 2.4, runs=4)  # the twin was 10% off on the campaign's one measured change
    j = method.judge(e)
    assert j.judged_pct == j.change_pct and j.suggestion == "no_gain"
    assert "off by" in j.text and "judged on the measurement alone" in j.text

    method, e = campaign(30.0, 9.0, 2.4, runs=4)  # the measurement contradicts the prediction: the measurement alone
    j = method.judge(e)
    assert j.judged_pct == j.change_pct and j.suggestion == "no_gain" and "contradicts" in j.text

    method, e = campaign(30.0, 2.0, 2.9)  # both inside the band: never adopted
    j = method.judge(e)
    assert 2.0 < (j.judged_pct or 0) < 2.9 and j.suggestion == "no_gain"
