"""The roofline and bottleneck analysis on twin ledgers: the seeds' setting and a dense model on one H200."""

from __future__ import annotations

import json

import pytest

from agent import models as m
from agent.plans import load_plan
from tests.twin_ledger import glm5_campaign, llama_campaign
from tools.analysis import Roofline, analyze, best_experiment, check_plan, layout
from tools.engines.sglang import SGLangEngine
from tools.profiles import load_hardware, load_model
from tools.reports import SessionRef


@pytest.fixture
def glm5(store, paths):
    """The seeds' setting, baseline only: GLM-5-NVFP4 on 8x RTX PRO 6000, --tp-size 8, levels 1-2048."""
    return SessionRef(store, paths, glm5_campaign(store, paths, items=[]))


@pytest.fixture
def llama(store, paths):
    """Llama 3.3 70B FP8 on one H200, baseline only."""
    return SessionRef(store, paths, llama_campaign(store, paths, items=[]))


def _values(findings, kind=None, category=None):
    return [
        f.values for f in findings if (kind is None or f.kind == kind) and (category is None or f.category == category)
    ]


def test_glm5_on_the_twin_is_bound_by_small_batch_expert_gemms_with_low_power(glm5, store):
    a = analyze(glm5)
    assert a.levels and [lv.max_concurrency for lv in a.levels] == [1, 256, 512, 1024, 2048]
    assert (a.tp, a.pp, a.ep, a.dense) == (8, 1, 1, False)
    assert a.bottleneck == "small_batch_expert_gemm"
    assert a.reference_concurrency == 2048
    top = a.levels[-1]
    # rows per expert: the requests that actually decode x k / E (about 1,600 of 2048 in a burst, so about 50,
    # not 2048 x 8 / 256 = 64); each GPU holds every expert at 1/8 width
    assert 1000 < top.running_decodes < 2048
    assert top.rows_per_expert == pytest.approx(top.running_decodes * 8 / 256)
    assert top.gemm_n == pytest.approx(2048 / 8)
    assert top.gemm_bound == "memory" and top.arithmetic_intensity_flop_per_byte < top.ridge_flop_per_byte
    assert top.share_of_peak_pct < 10
    # low power while throughput grows sublinearly
    assert top.power_share_pct is not None and top.power_share_pct < 50
    assert top.scaling_exponent is not None and 0 < top.scaling_exponent < 0.8
    texts = [f.text for f in a.evidence]
    assert any(
        f"{top.rows_per_expert:,.0f} rows per decode step ({top.running_decodes:,.0f} x 8 / 256)" in t for t in texts
    )
    # low power, and the step far from its bandwidth floor: not "waiting on memory"
    assert any("of their power limit" in t and "sublinearly" in t and "neither the memory" in t for t in texts)
    assert not any("waiting on memory" in t for t in texts)
    assert any("below the ridge point" in t for t in texts)
    power = next(f for f in a.evidence if "power_share_pct" in f.values)
    assert power.values["power_share_pct"] == pytest.approx(100 * top.power_w_mean / top.power_limit_w)
    # the numbers in each evidence line are its recorded values, as printed
    for f in a.evidence:
        assert f.values and f.category == "small_batch_expert_gemm"
    # concurrency 1 is far from the bandwidth floor: host overhead, recorded as a secondary finding
    assert a.levels[0].tpot_over_floor > 10
    assert any(f.category == "host_overhead" for f in a.secondary)
    # everything went to the ledger
    rows = store.findings(glm5.id, experiment_id=a.experiment_id)
    assert {f.kind for f in rows} >= {"level", "scaling", "bottleneck", "evidence", "note"}
    assert next(f for f in rows if f.kind == "bottleneck").category == "small_batch_expert_gemm"


def test_the_dense_model_on_one_h200_has_a_different_bottleneck(llama, store):
    a = analyze(llama)
    assert a.dense and a.bottleneck != "small_batch_expert_gemm"
    assert a.bottleneck == "kv_capacity"
    assert all(lv.rows_per_expert is None for lv in a.levels)
    assert all(lv.gemm_m == lv.running_decodes for lv in a.levels)  # the dense GEMM's M is the decoding batch
    notes = [f.text for f in store.findings(llama.id, kind="note")]
    assert any("rows per expert do not apply" in t for t in notes)
    kv = a.evidence[0]
    assert kv.values["kv_usage_pct"] >= 90 and a.stops_scaling_at == kv.values["max_concurrency"]
    # low concurrency sits near the memory-bandwidth floor: a different picture from GLM-5's 18x
    assert a.levels[0].tpot_over_floor < 2
    assert any(f.category == "memory_bandwidth" for f in a.secondary)


def test_reanalysis_replaces_the_findings_it_wrote(glm5, store):
    first = analyze(glm5)
    second = analyze(glm5)
    rows = store.findings(glm5.id, experiment_id=first.experiment_id)
    assert len(rows) == len(second.findings) == len(first.findings)
    assert [f.text for f in rows] == [f.text for f in first.findings]


def test_a_recorded_micro_benchmark_replaces_the_profile_fit(glm5, store):
    store.add_microbench(
        m.MicrobenchResult(
            device="rtx-pro-6000-blackwell",
            dtype="nvfp4",
            m=64,
            n=256,
            k=6144,
            groups=256,
            rows_per_expert=64,
            tflops=55.0,
            share_of_peak=55 / 1850,
            share_of_roofline=0.19,
            backend="flashinfer_cutlass",
        )
    )
    a = analyze(glm5)
    top = a.levels[-1]
    assert top.achieved_tflops == pytest.approx(55.0)
    assert top.achieved_source.startswith("micro-benchmark #1")
    assert any("55 TFLOPS" in f.text for f in a.evidence)
    assert a.bottleneck == "small_batch_expert_gemm"


def test_a_profile_breakdown_decides_the_component_and_survives_reanalysis(glm5):
    profile = m.ProfileSummary(
        source="measured",
        categories={
            "expert_gemm": m.ProfileCategory(seconds=1.0, share=0.2),
            "other_gemm": m.ProfileCategory(seconds=1.0, share=0.2),
            "attention": m.ProfileCategory(seconds=0.5, share=0.1),
            "communication": m.ProfileCategory(seconds=2.5, share=0.5),
        },
        max_concurrency=2048,
    )
    a = analyze(glm5, profile=profile)
    assert a.bottleneck == "communication"
    assert any("communication 50%" in f.text for f in a.evidence)
    again = analyze(glm5)  # no profile given: the recorded one is used
    assert again.bottleneck == "communication"


def test_plan_checks_catch_the_seeds_wrong_memory_fraction_direction(glm5):
    claims = check_plan(glm5)
    by_item = {}
    for c in claims:
        by_item.setdefault(c.plan_item, []).append(c)
    (mem,) = [c for c in by_item["05"] if "mem-fraction-static" in c.text]
    assert mem.severity == "error" and "higher fraction gives more KV cache" in mem.text
    assert mem.values["mem_fraction_new"] < mem.values["mem_fraction_old"]
    assert mem.values["kv_pool_tokens_new"] < mem.values["kv_pool_tokens_old"]
    hw, model = load_hardware("rtx-pro-6000-blackwell"), load_model("glm-5-nvfp4")
    weights_gib, pool = Roofline(model, hw, 8, 1, 1, None).kv_pool_tokens(0.78)
    assert pool == pytest.approx(mem.values["kv_pool_tokens_new"])
    assert pool == pytest.approx((hw.memory_gib * 0.78 - weights_gib) * 2**30 / model.kv_bytes("auto"))
    # the seeds' own numbers that hold up are confirmed
    assert any(c.severity == "info" and "64 rows per expert" in c.text for c in by_item["10"])
    assert any(c.severity == "info" and "156 all-reduces" in c.text for c in by_item["03"])
    assert "07" not in by_item  # the plan's EP item says rows stay the same: nothing to flag


def test_plan_checks_catch_an_ep_claim_of_more_rows(store, paths):
    plan = load_plan("glm5-nvfp4-rtxpro6000x8")
    item = plan.item("07").model_copy(update={"hypothesis": "Whole experts per GPU give 8x the rows per GPU."})
    plan = plan.model_copy(update={"items": [item if it.id == "07" else it for it in plan.items]})
    from agent.session import Session

    with Session.create(store, paths, plan) as s:
        claims = check_plan(SessionRef(store, paths, s.id))
    (ep,) = [c for c in claims if c.plan_item == "07"]
    assert ep.severity == "error" and ep.values["rows_per_expert"] == pytest.approx(64)
    assert ep.values["width_tp"] == 256 and ep.values["width_ep"] == 2048


def test_plan_checks_use_the_audits_and_the_measured_kv_usage(store, paths):
    sid = glm5_campaign(store, paths, items=["01", "02"])
    ref = SessionRef(store, paths, sid)
    analyze(ref)
    claims = {c.plan_item: c for c in check_plan(ref) if c.severity == "warning" and "audit" in c.text}
    assert "read nowhere" in claims["01"].text and "--num-continuous-decode-steps" in claims["01"].text
    assert "not accepted" in claims["02"].text
    kv = [c for c in store.findings(sid, plan_level=True) if c.plan_item == "05" and "KV pool peaked" in c.text]
    assert kv and kv[0].values["kv_usage_pct"] < 90


def test_the_best_experiment_prefers_configurations_that_stand(store, paths):
    sid = glm5_campaign(store, paths, items=["05", "06"])
    verdicts = {e.plan_item: e.verdict for e in store.experiments(sid)}
    best = best_experiment(store, sid)
    assert store.get_experiment(best).verdict in ("baseline", "adopted")
    assert verdicts["05"] == "regressed"


def test_layout_reads_any_spelling_and_falls_back_to_server_info():
    sglang = SGLangEngine()
    assert layout(m.ServerConfig.parse("--tp 4 --pp-size 2"), engine=sglang) == {"tp": 4, "pp": 2, "ep": 1}
    assert layout(m.ServerConfig.parse("--tensor-parallel-size=8 --ep 8"), engine=sglang) == {"tp": 8, "pp": 1, "ep": 8}
    assert layout(m.ServerConfig(), {"tp_size": 8, "pp_size": 1}, engine=sglang)["tp"] == 8
    assert layout(m.ServerConfig(), {"tp_size": 8}, engine=None)["tp"] == 8  # no engine here: the server's report


def test_findings_round_trip_through_the_ledger(store, small_plan):
    store.create_session(m.Session(id="abc123", name="s", plan=small_plan, engine="sim"))
    f = m.Finding(kind="claim", plan_item="01", text="A claim.", values={"x_ms": 1.5}, severity="warning")
    (saved,) = store.replace_findings("abc123", None, [f])
    assert saved.id and store.findings("abc123", plan_level=True) == [saved]
    row = next(store.db.query("select values_json from findings where id = ?", [saved.id]))
    assert json.loads(row["values_json"]) == {"x_ms": 1.5}
    store.replace_findings("abc123", None, [])
    assert store.findings("abc123") == []


def test_the_root_cause_is_one_set_of_numbers_each_derived_figure_recomputed(glm5, store):
    """Every derived figure of the summary's root cause is recomputed from the figures printed beside it."""
    import re

    from tools import reports

    analyze(glm5)
    check_plan(glm5)
    ledger = reports.Ledger.read(store, glm5.id)
    text = reports.render_status(ledger, 1, "q?", ["a"]).markdown
    root = text.split("## Root cause", 1)[1].split("## Next steps", 1)[0]

    def num(s: str) -> float:
        return float(s.replace(",", ""))

    # the table: rows per expert, TFLOPS, % of peak, bandwidth floor, TPOT / floor, from their neighbours
    table = next(t for t in reports.tables(root) if t[0][:2] == ["concurrency", "running requests"])
    col = {name: i for i, name in enumerate(table[0])}
    caption = re.search(
        r"rows per expert = running requests x (\d+) / (\d+);.*% of peak = TFLOPS / ([\d,]+); bandwidth floor = GB "
        r"per step / ([\d,]+) GB/s",
        root,
    )
    assert caption, root
    k, experts, peak, bw = (num(g) for g in caption.groups())
    for row in table[1:]:
        running = num(row[col["running requests"]])
        rows_pe = num(row[col["rows per expert"]])
        assert rows_pe == pytest.approx(running * k / experts, abs=0.5 + 0.5 * k / experts)  # both printed rounded
        tflop, ms, tflops = num(row[col["GEMM TFLOP per step"]]), num(row[col["GEMM ms"]]), num(row[col["TFLOPS"]])
        assert tflops == pytest.approx(tflop / (ms / 1000), rel=0.02, abs=0.1)
        assert num(row[col["% of peak"]]) == pytest.approx(100 * tflops / peak, abs=0.06)
        floor = num(row[col["bandwidth floor ms"]])
        assert floor == pytest.approx(num(row[col["GB per step"]]) / bw * 1000, rel=0.01, abs=0.06)
        assert num(row[col["TPOT / floor"]]) == pytest.approx(num(row[col["TPOT ms"]]) / floor, abs=0.06)

    # the evidence: rows per expert from the running requests it names, TFLOPS from the TFLOP and ms it names
    rows_line = re.search(r"each expert sees ([\d.,]+) rows per decode step \(([\d,]+) x (\d+) / (\d+)\)", root)
    assert rows_line, root
    rows_pe, running, k, experts = (num(g) for g in rows_line.groups())
    assert rows_pe == pytest.approx(running * k / experts, abs=0.5)
    gemm = re.search(
        r"at about ([\d,]+) TFLOPS \(([\d.]+) TFLOP per GPU in ([\d,]+) ms\), ([\d.]+)% of the ([\d,]+)", root
    )
    assert gemm, root
    tflops, tflop, ms, share, peak = (num(g) for g in gemm.groups())
    assert tflops == pytest.approx(tflop / ms * 1000, rel=0.01, abs=0.5)
    assert share == pytest.approx(100 * tflops / peak, abs=0.1)
    # the table's top row is the same set of numbers as the evidence
    top = table[-1]
    assert num(top[col["running requests"]]) == running and num(top[col["GEMM ms"]]) == pytest.approx(ms, abs=0.5)
    # shares of the estimated step
    step = re.search(
        r"Estimated decode step at concurrency \d+ \([\d,]+ running requests\): (.*?) \(sum ([\d,]+) ms", root
    )
    assert step, root
    parts = re.findall(r"([a-zA-Z ]+?) ([\d,]+) ms \((\d+)%\)", step.group(1))
    total = num(step.group(2))
    assert len(parts) >= 3
    for _, ms_text, pct in parts:
        assert num(pct) == pytest.approx(100 * num(ms_text) / total, abs=1.0)
    assert sum(num(ms_text) for _, ms_text, _ in parts) == pytest.approx(total, abs=len(parts))
    # no contradiction: far from the bandwidth floor, the power line does not say the GPUs wait on memory
    far = re.search(r"the decode step itself is ([\d.]+)x its bandwidth floor", root)
    assert far and num(far.group(1)) > 2 and "waiting on memory" not in root
    # and one derivation per figure
    derived = [line for line in root.splitlines() if line.startswith("- rows per expert =")]
    assert len(derived) == 1


def test_a_profile_of_the_same_configuration_is_what_the_root_cause_uses(glm5, store):
    """A profile item profiles the best configuration on a server of its own: the best's analysis uses it."""
    best = best_experiment(store, glm5.id)
    base = store.get_experiment(best)
    twin_run = store.add_experiment(
        glm5.id,
        base.model_copy(update={"id": None, "plan_item": "08", "kind": "change", "base_experiment_id": best}),
    )
    for result in store.bench_results(best):
        store.add_bench_result(twin_run.id, result)
    profile = m.ProfileSummary(
        source="measured",
        categories={
            "expert_gemm": m.ProfileCategory(seconds=1.0, share=0.2),
            "communication": m.ProfileCategory(seconds=4.0, share=0.8),
        },
        max_concurrency=2048,
    )
    analyze(glm5, twin_run.id, profile=profile)
    a = analyze(glm5, best)  # no profile of its own: the same configuration's measured one
    assert a.bottleneck == "communication"
    assert any("communication 80%" in f.text for f in a.evidence)
    said = f"Profile (measured, on experiment {twin_run.id}: the same configuration"
    assert any(f.text.startswith(said) for f in a.findings)
    again = analyze(glm5, best)  # re-analysed: its copy still says where the profile was measured
    assert any(f.text.startswith(said) for f in again.findings)


def test_the_first_rule_whose_condition_holds_gives_the_verdict(glm5):
    """tools/analysis/bottlenecks.py on the baseline's levels, reshaped so that one more rule's condition holds
    each time: the verdict follows RULES (KV capacity, host overhead, prefill interference, then the largest part
    of the decode step), and the verdict's evidence carries its category."""
    from tools.analysis.bottlenecks import RULES, _decide

    assert [r.__name__ for r in RULES[:3]] == ["kv_capacity", "host_overhead", "prefill_interference"]
    a = analyze(glm5)
    roof = Roofline(load_model("glm-5-nvfp4"), load_hardware(a.hardware), a.tp, a.pp, a.ep, None)
    rows = list(a.levels)
    i = next(k for k, r in enumerate(rows) if r.max_concurrency == a.reference_concurrency)
    assert i > 0 and rows[0].max_concurrency <= 2

    def decide(ref=None, low=None, kv=False):
        shaped = list(rows)
        shaped[i] = shaped[i].model_copy(update=ref or {})
        shaped[0] = shaped[0].model_copy(update=low or {})
        if kv:  # the reference level: KV pool full and throughput flat against the level before
            shaped[i] = shaped[i].model_copy(update={"kv_usage_pct": 95.0, "scaling_exponent": 0.1})
        category, evidence, _ = _decide(roof, shaped, shaped[i], None, [], None, load_hardware(a.hardware))
        assert evidence and all(f.category == category for f in evidence)
        return category

    ref = rows[i]
    gpu_ms = sum(ref.estimate_ms.values())
    assert decide() == a.bottleneck == "small_batch_expert_gemm"
    slow_tokens = {"mean_tpot_ms": 100 * ref.decode_step_ms}  # TPOT far above the decode step: prefill in between
    host_bound = {"mean_tpot_ms": 10 * gpu_ms}  # at concurrency 1 the host adds more than the GPU work at R
    assert decide(ref=slow_tokens) == "prefill_interference"
    assert decide(ref=slow_tokens, low=host_bound) == "host_overhead"
    assert decide(ref=slow_tokens, low=host_bound, kv=True) == "kv_capacity"
    # a plan whose lowest level is 4 (the H100 campaign's, docs/gpu-campaign.md) still shows the host; one of 16 not
    assert decide(ref=slow_tokens, low={**host_bound, "max_concurrency": 4}) == "host_overhead"
    assert decide(ref=slow_tokens, low={**host_bound, "max_concurrency": 16}) == "prefill_interference"
    fast_gemm = {"gemm_bound": "compute", "share_of_peak_pct": 60.0}
    assert decide(ref=fast_gemm) == "compute"
    for largest, category in (("attention", "memory_bandwidth"), ("communication", "communication")):
        estimate = {**ref.estimate_ms, largest: 10 * gpu_ms}
        assert decide(ref={"estimate_ms": estimate}) == category


def test_an_audited_flag_is_named_in_the_words_of_the_plans_engine(small_plan):
    from types import SimpleNamespace

    from tools.analysis.plan_checks import ItemView, audited_flags

    item = next(i for i in small_plan.items if i.flags)
    flag = next(a for a in str(item.flags).split() if a.startswith("--"))
    e = m.Experiment(id=5, number=2, kind="change", plan_item=item.id, config=small_plan.target.base_config(),
                     workload=small_plan.workload, audit=[m.FlagIssue(flag=flag, status="unknown", message="no")])  # fmt: skip
    for engine, words in (("vllm", "in vLLM 0.32.0"), ("sglang", "in SGLang 0.32.0"), ("mine", "in mine 0.32.0")):
        target = small_plan.target.model_copy(update={"engine": engine, "engine_version": "0.32.0"})
        ctx = SimpleNamespace(plan=small_plan.model_copy(update={"target": target}), experiments=[e])
        [f] = audited_flags(ctx, ItemView(item, "", e.config))
        assert f"{flag} is not accepted {words} (audit of experiment 2)" in f.text
