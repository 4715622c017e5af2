"""The digital twin: calibrated to the seeds' table, and the seeds' other lessons from the same constants."""

from __future__ import annotations

import json
import statistics
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import models as m
from agent.cli import cli
from agent.plans import load_plan
from tools.engines.catalog import CatalogError
from tools.engines.sim.twin import Twin, TwinStartupError
from tools.profiles import load_hardware, load_model

ROOT = Path(__file__).resolve().parent.parent
TABLE = tomllib.loads((ROOT / "scripts/calibration/seeds-glm5-nvfp4-rtxpro6000x8.toml").read_text())
WORKLOAD = load_plan("glm5-nvfp4-rtxpro6000x8").workload


def twin(flags: str) -> Twin:
    model = load_model("glm-5-nvfp4")
    return Twin.build(
        model, "rtx-pro-6000-blackwell", 8, m.ServerConfig.parse(f"--model-path {model.model_path} {flags}")
    )


# The seeds' KV and pipeline lessons are about sustained throughput, but a level of the calibration workload is
# one burst (a prompt per concurrent request) whose first half is the pool filling and whose reservations never
# settle. Those lessons are measured on the same workload sent four times over: the first wave fills the pool,
# three more run at steady state. (On single bursts: test_a_single_burst_does_not_fill_the_pool.)
STEADY = WORKLOAD.model_copy(update={"prompts_per_concurrency": 4.0})


def sweep(flags: str, levels: list[int], workload: m.BenchSpec = WORKLOAD, **kw) -> list[m.BenchLevel]:
    spec = workload.model_copy(update={"concurrency": levels})
    return [level for level, _ in twin(flags).predict(spec, **kw)]


@pytest.fixture(scope="module")
def calibrated() -> dict[int, m.BenchLevel]:
    levels = [lv["concurrency"] for lv in TABLE["levels"]]
    return {lv.max_concurrency: lv for lv in sweep(TABLE["flags"], levels)}


@pytest.mark.parametrize("row", TABLE["levels"], ids=lambda r: f"c{r['concurrency']}")
def test_calibration_within_15_percent_of_the_seeds(calibrated, row):
    level = calibrated[row["concurrency"]]
    assert level.output_throughput == pytest.approx(row["output_tok_s"], rel=0.15)
    assert level.mean_tpot_ms == pytest.approx(row["tpot_ms"], rel=0.15)


def test_peak_and_power_at_2048(calibrated):
    top = calibrated[2048]
    assert top.max_output_tokens_per_s == pytest.approx(7216, rel=0.25)
    assert top.mean_gpu_power_w == pytest.approx(TABLE["power_w_per_gpu_at"]["watts"], rel=0.15)


@pytest.mark.parametrize(
    ("model", "hardware", "gpus", "flags"),
    [
        ("glm-5-nvfp4", "rtx-pro-6000-blackwell", 8, TABLE["flags"]),
        ("glm-5-nvfp4", "rtx-pro-6000-blackwell", 8, "--tp-size 4 --pp-size 2"),
        ("llama-3.3-70b-fp8", "h200", 1, "--tp-size 1"),
    ],
    ids=["glm5-tp8", "glm5-tp4pp2", "llama70b-h200"],
)
def test_power_never_falls_while_throughput_rises_at_a_fixed_config(model, hardware, gpus, flags):
    t = Twin.build(model, hardware, gpus, m.ServerConfig.parse(flags))
    spec = WORKLOAD.model_copy(update={"concurrency": [1, 16, 64, 256, 512, 1024, 2048]})
    results = t.predict(spec)
    hw, cal = t.hw, t.hw.calibration
    previous = None
    for level, sim in results:
        watts = level.mean_gpu_power_w
        # the power is the cost model's own use of the tensor cores and the memory over the level's wall time
        use = cal.power_compute_weight * sim.tensor_s / sim.wall_s + sim.memory_s / sim.wall_s
        assert watts == pytest.approx(hw.idle_w + (hw.tdp_w - hw.idle_w) * min(cal.power_activity * use, 1), abs=0.1)
        assert hw.idle_w < watts <= hw.tdp_w
        if previous is not None and level.output_throughput > previous[0]:
            assert watts >= previous[1] - 0.5, (level.max_concurrency, watts, previous)
        previous = (level.output_throughput, watts)


def test_3072_gains_nothing_because_the_kv_pool_is_full():
    (at2048,) = sweep(TABLE["flags"], [2048], STEADY)
    (at3072,) = sweep(TABLE["flags"].replace("2048", "3072"), [3072], STEADY)
    assert at3072.output_throughput <= 1.03 * at2048.output_throughput
    assert at3072.model_extra["max_token_usage"] >= 0.95


def test_a_single_burst_does_not_fill_the_pool():
    """SGLang holds back new_token_ratio x the output still owed (0.7, decaying over 600 decode steps); one burst
    of 3072 requests is over before the ratio has decayed, and before the reservations let the pool fill."""
    t = twin(TABLE["flags"].replace("2048", "3072"))
    burst, steady = t.simulate(WORKLOAD, 3072), t.simulate(STEADY, 3072)
    assert burst.decode_steps < 600 < steady.decode_steps
    assert burst.retractions == steady.retractions == 0  # the reservations keep decode from running out
    assert burst.max_token_usage < 0.9 < 0.95 <= steady.max_token_usage


def test_tp4_pp2_is_about_twice_as_slow():
    (tp8,) = sweep(TABLE["flags"], [2048], STEADY)
    at2048, at1 = sweep("--tp-size 4 --pp-size 2 --max-running-requests 2048", [2048, 1], STEADY)
    (tp8_at1,) = sweep(TABLE["flags"], [1], STEADY)
    assert 1.6 <= tp8.output_throughput / at2048.output_throughput <= 2.4
    assert 1.6 <= at1.mean_tpot_ms / tp8_at1.mean_tpot_ms <= 2.4


def test_kv_is_allocated_in_pages_of_the_models_default_size():
    t = twin("--tp-size 8")
    assert t.limits.page_size == 64 and t.resolved["page_size"] == 64  # DSA on CUDA (facts)
    assert twin("--tp-size 8 --page-size 1").limits.page_size == 1
    paged = t.simulate(WORKLOAD, 1024)
    unpaged = twin("--tp-size 8 --page-size 1").simulate(WORKLOAD, 1024)
    # same requests, same tokens: whole pages hold more slots than the tokens they contain
    assert paged.max_token_usage > unpaged.max_token_usage


def test_ignore_eos_requests_can_be_given_a_full_reservation():
    """SGLang 0.5.23's rule for ignore_eos requests admits fewer at once than the decaying ratio."""
    from dataclasses import replace

    from tools.engines.sim.scheduler import simulate_level

    t = twin("--tp-size 8 --max-running-requests 2048")
    inputs, outputs, _ = t.workload(WORKLOAD, 2048)

    def run(full: bool):
        limits = replace(t.limits, full_reservation_for_ignore_eos=full)
        return simulate_level(t.cost, limits, max_concurrency=2048, input_lens=inputs, output_lens=outputs)

    ratio, full = run(False), run(True)
    assert full.max_token_usage < ratio.max_token_usage
    assert full.retractions == 0  # never over-admits


def test_sglangs_same_step_reservation_admits_fewer_at_2048():
    """The scheduler's docstring says why the twin charges a just-admitted request ratio x its output."""
    from dataclasses import replace

    from tools.engines.sim.scheduler import simulate_level

    t = twin(TABLE["flags"])
    inputs, outputs, _ = t.workload(WORKLOAD, 2048)
    level = {}
    for strict in (False, True):
        limits = replace(t.limits, full_reservation_when_admitted=strict)
        sim = simulate_level(t.cost, limits, max_concurrency=2048, input_lens=inputs, output_lens=outputs)
        level[strict] = t.level(WORKLOAD, sim, 2048)
    assert level[True].output_throughput < 0.95 * level[False].output_throughput
    assert level[True].mean_tpot_ms > 1.05 * level[False].mean_tpot_ms


def test_pipeline_parallel_turns_the_overlap_scheduler_off_and_spreads_requests_over_micro_batches():
    t = twin("--tp-size 4 --pp-size 2 --max-running-requests 2048")
    assert "Pipeline parallelism is incompatible with overlap schedule." in t.warnings
    assert t.resolved["disable_overlap_schedule"] is True
    assert t.par.pp_micro_batch == 1024
    # each micro-batch admits up to its cap, so pp x the cap bounds the running requests
    assert twin("--tp-size 4 --pp-size 2 --pp-max-micro-batch-size 64").limits.max_running_requests == 128
    assert twin("--tp-size 8 --pp-max-micro-batch-size 64").limits.max_running_requests == 64  # pp 1 too
    # new requests join the micro-batch whose turn it is: two requests run as two micro-batches of one
    one, two = t.cost.decode(1, 200), t.cost.decode(2, 400)
    assert two.busy_s == pytest.approx(2 * one.busy_s)  # each GPU works on both in a round
    # one micro-batch waits for both stages in turn; two are paced by the slower stage, twice: a little longer
    assert one.total_s < two.total_s < 1.05 * one.total_s


def test_pipeline_stages_hold_sglangs_layer_split():
    from tools.engines.sim.costmodel import pp_layer_ranges

    assert pp_layer_ranges(78, 2) == [(0, 39), (39, 78)]
    assert pp_layer_ranges(80, 3) == [(0, 26), (26, 53), (53, 80)]  # the last stages take the remainder
    pp = twin("--tp-size 4 --pp-size 2")
    first, last = pp.cost.stages
    assert (first.moe_layers, last.moe_layers) == (36, 39)  # GLM-5's 3 dense layers come first
    assert last.weight_bytes > first.weight_bytes  # 3 more MoE layers and the lm_head
    # the pool is sized on the heavier stage; every stage holds half the layers' KV per token
    budget = pp.hw.memory_gib * pp.resolved["mem_fraction_static"] * 2**30
    per_token = pp.cost.kv_bytes_per_token_per_gpu(last)
    assert pp.limits.kv_capacity_tokens == int((budget - last.weight_bytes) / per_token)
    tp8 = twin("--tp-size 8")
    assert per_token == pytest.approx(tp8.cost.kv_bytes_per_token_per_gpu() / 2)
    # experts and TP-sharded parts: TP8's GPU holds what the two TP4 stages hold between them, halved
    assert sum(st.weight_bytes for st in pp.cost.stages) / 2 < tp8.cost.weight_bytes_per_gpu()  # replicated: halved


def test_ep8_starts_then_fails_under_load():
    light, heavy, after = sweep("--tp-size 8 --ep-size 8 --max-running-requests 2048", [1, 2048, 256])
    assert light.failed == 0 and light.completed > 0
    assert heavy.failed > 0 and any("illegal memory access" in reason for reason in heavy.errors)
    assert after.completed == 0 and after.failed > 0  # the server is down after the crash


def test_the_noop_flag_changes_nothing():
    base = sweep("--tp-size 8", [256])
    noop = sweep("--tp-size 8 --num-continuous-decode-steps 8", [256])
    assert noop[0].model_dump() == base[0].model_dump()
    assert twin("--tp-size 8 --num-continuous-decode-steps 8").no_effect == ["num_continuous_decode_steps"]


def test_accepted_but_unmodelled_flags_are_listed():
    t = twin("--tp-size 8 --enable-torch-compile --schedule-policy lpm")
    assert t.not_modelled == ["enable_torch_compile", "schedule_policy"]
    assert t.server_info()["not_modelled"] == t.not_modelled


def test_sglang_refusals_happen_here_too():
    with pytest.raises(CatalogError, match="unrecognized arguments: --enable-piecewise-cuda-graph"):
        twin("--tp-size 8 --enable-piecewise-cuda-graph")
    with pytest.raises(CatalogError, match="ambiguous option: --cuda-graph-max-bs could match"):
        twin("--tp-size 8 --cuda-graph-max-bs 512")
    with pytest.raises(TwinStartupError, match="two-batch overlap") as info:
        twin("--tp-size 8 --enable-two-batch-overlap")
    assert info.value.classify == "argument-validation"


def test_out_of_memory_at_startup_is_declared_data():
    with pytest.raises(TwinStartupError) as info:
        twin("--tp-size 8 --mem-fraction-static 0.5")
    fault = next(f for f in load_hardware("rtx-pro-6000-blackwell").faults if f.name == "oom-at-startup")
    assert info.value.log == fault.log and info.value.classify == "oom"


def test_more_kv_memory_fraction_means_more_kv_tokens():
    low, high = twin("--tp-size 8 --mem-fraction-static 0.80"), twin("--tp-size 8 --mem-fraction-static 0.88")
    assert high.limits.kv_capacity_tokens > low.limits.kv_capacity_tokens


def test_same_seed_same_numbers_and_noise_gives_a_few_percent():
    a = sweep("--tp-size 8", [512], noise=0.02)
    b = sweep("--tp-size 8", [512], noise=0.02)
    assert a[0].model_dump() == b[0].model_dump()
    outs = []
    for seed in range(12):
        spec = WORKLOAD.model_copy(update={"concurrency": [512], "seed": seed})
        ((level, _),) = twin("--tp-size 8").predict(spec, noise=0.02)
        outs.append(level.output_throughput)
    cv = statistics.stdev(outs) / statistics.mean(outs)
    assert 0.01 <= cv <= 0.03, cv


def test_breakdown_names_expert_gemms_as_the_largest_part_at_high_concurrency():
    t = twin("--tp-size 8 --max-running-requests 2048")
    sim = t.simulate(WORKLOAD, 2048)
    parts = sim.breakdown_s
    assert max(parts, key=parts.get) == "expert_gemm"
    assert set(parts) == {"expert_gemm", "dense_gemm", "attention", "communication", "host_overhead"}


def test_profiles_match_the_facts():
    glm = load_model("glm-5-nvfp4")
    assert glm.total_params / 1e9 == pytest.approx(743.9, abs=0.5)
    assert glm.active_params / 1e9 == pytest.approx(40.8, abs=0.2)
    t = twin("--tp-size 8")
    assert t.resolved["weights_gib_per_gpu"] == pytest.approx(55.4, abs=0.3)  # facts: 55.4 GiB without MTP
    assert t.limits.max_running_requests == 2048  # SGLang's automatic value on this box (facts 4d)


def test_predict_cli_json_has_bench_serving_keys():
    result = CliRunner().invoke(cli, ["sim", "predict", "--concurrency", "1,64", "--json", "--", "--tp-size", "8"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["max_concurrency"] for r in rows] == [1, 64]
    for key in ("completed", "duration", "output_throughput", "total_throughput", "max_output_tokens_per_s",
                "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2e_latency_ms", "p99_tpot_ms",
                "mean_gpu_power_w", "max_token_usage"):  # fmt: skip
        assert key in rows[0], key


def test_predict_cli_bad_flag_is_a_clear_error():
    result = CliRunner().invoke(cli, ["sim", "predict", "--", "--tp-size", "8", "--enable-piecewise-cuda-graph"])
    assert result.exit_code == 1
    assert "unrecognized arguments: --enable-piecewise-cuda-graph" in result.stderr
    assert "breakable" in result.stderr


def test_a_step_costs_the_same_from_the_per_row_memo_as_worked_out_afresh():
    """The cost model works out a row count's GEMMs and communication once (tools/engines/sim/costmodel.py
    `_rows_part`); a step priced from that memo is the same float as one priced with the memo empty."""
    from tools.engines.sim import costmodel

    twin = Twin.build("glm-5-nvfp4", "rtx-pro-6000-blackwell", 8, m.ServerConfig.parse("--tp-size 4 --pp-size 2"))
    cost = twin.cost
    steps = [(b, c) for b in (1, 7, 64, 513, 2048) for c in (0.0, 900.0, 123_456.0)]
    warm = [(cost.decode(b, c), cost.prefill(b * 8, c, b)) for b, c in steps]
    again = [(cost.decode(b, c), cost.prefill(b * 8, c, b)) for b, c in steps]  # every row count from the memo
    slow = costmodel.CostModel(cost.model, cost.hw, cost.par, clock=0.6)  # a power limit's clock: a memo of its own
    limited = [(slow.decode(b, c), slow.prefill(b * 8, c, b)) for b, c in steps]
    costmodel._ROWS_MEMOS.clear()
    fresh = costmodel.CostModel(cost.model, cost.hw, cost.par, clock=cost.clock)
    cold = [(fresh.decode(b, c), fresh.prefill(b * 8, c, b)) for b, c in steps]
    fresh_slow = costmodel.CostModel(cost.model, cost.hw, cost.par, clock=0.6)
    assert again == warm == cold
    assert limited == [(fresh_slow.decode(b, c), fresh_slow.prefill(b * 8, c, b)) for b, c in steps] != warm
