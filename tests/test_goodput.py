"""Goodput and SLO attainment, by SGLang 0.5.23's definitions: the metric code on requests of known timing, and
`pivot bench --goodput` against a server whose every TTFT, TPOT and E2E latency is known in advance."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from agent import models as m
from agent.cli import cli
from tests.timed_server import spawn
from tools.metrics import RequestRecord, compute_level


def record(ttft_s: float, latency_s: float, tokens: int, ok: bool = True) -> RequestRecord:
    """A request sent at 0 whose tokens arrive evenly from ttft to latency."""
    if not ok:
        return RequestRecord(start_s=0.0, prompt_len=1, chunk_times_s=[], chunk_tokens=[], end_s=0.0, error="HTTP 500")
    times = [ttft_s] + [ttft_s + (latency_s - ttft_s) * (i + 1) / (tokens - 1) for i in range(tokens - 1)]
    return RequestRecord(start_s=0.0, prompt_len=1, chunk_times_s=times, chunk_tokens=[1] * tokens, end_s=latency_s)


# SGLang's own unit cases (test_bench_serving_goodput.py): ttft / tpot / e2el in ms 100/100/900, 500/100/900,
# 200/200/2200, 200/0/200 (one token), then a failed request.
SGLANG_CASES = [record(0.1, 0.9, 9), record(0.5, 0.9, 5), record(0.2, 2.2, 11), record(0.2, 0.2, 1),
                record(0, 0, 0, ok=False)]  # fmt: skip


def test_a_request_is_good_only_when_it_succeeded_and_met_every_slo():
    level = compute_level(SGLANG_CASES, max_concurrency=1, goodput_slos_ms={"ttft": 300, "tpot": 150, "e2el": 1000})
    assert level.goodput_slos_ms == {"ttft": 300.0, "tpot": 150.0, "e2el": 1000.0}
    assert level.slo_attainment == 2 / 5  # the first and the one-token request; the failed one counts against
    assert level.slo_attainment_by_metric == {"ttft": 3 / 5, "tpot": 3 / 5, "e2el": 3 / 5}
    assert level.request_goodput == 2 / level.duration
    assert level.token_goodput_tok_s == (9 + 1) / level.duration
    only_ttft = compute_level(SGLANG_CASES, max_concurrency=1, goodput_slos_ms={"ttft": 300})
    assert (only_ttft.slo_attainment, only_ttft.slo_attainment_by_metric) == (3 / 5, {"ttft": 3 / 5})


def test_without_slos_a_level_has_exactly_bench_servings_keys():
    level = compute_level(SGLANG_CASES, max_concurrency=1)
    dumped = level.model_dump()
    for key in m.bench.OPTIONAL_LEVEL_KEYS:
        assert key not in dumped
    assert m.BenchLevel.model_validate_json(level.model_dump_json()) == level


def test_slo_pairs_are_checked_as_sglang_checks_them():
    assert m.parse_slos("ttft:500 tpot:50.5 e2el:20000") == {"ttft": 500.0, "tpot": 50.5, "e2el": 20000.0}
    assert m.parse_slos(["tpot:50,ttft:500"]) == {"ttft": 500.0, "tpot": 50.0}  # SGLang's order
    for bad in ("itl:10", "ttft", "ttft:", "ttft:fast", "ttft:0", "ttft:-5", "ttft:inf", "ttft:100 ttft:200"):
        with pytest.raises(ValueError):
            m.parse_slos(bad)


# ---------------------------------------------------------------------------------------------- against a server
# The server: TTFT = 20 ms + 240 ms per prompt token, then one token every 160 ms. The workload (seed 7, input
# lengths uniform in [1, 3], outputs in [1, 4], bench_serving's draws) gives each request a known TTFT, TPOT and
# E2E latency; every SLO below sits 40 ms or more from every request's value, so a loaded host cannot move a
# request across it.
TTFT_MS, PER_TOKEN_MS, ITL_MS = 20.0, 240.0, 160.0
WORKLOAD = ["--input-len", "3", "--output-len", "4", "--range-ratio", "0", "--num-prompts", "6", "--seed", "7"]


def expected(slos: dict[str, float], failed: set[int] = frozenset()) -> tuple[list[bool], dict[str, float], int]:
    """From the definitions alone: which requests are good, attainment per SLO, and the good requests' tokens."""
    rs = np.random.RandomState(7)  # bench_serving: np.random.seed(seed), input lengths first, then output lengths
    inputs, outputs = rs.randint(1, 4, 6), rs.randint(1, 5, 6)
    ttft = TTFT_MS + PER_TOKEN_MS * inputs
    e2el = ttft + ITL_MS * (outputs - 1)
    tpot = np.where(outputs > 1, ITL_MS, 0.0)  # a one-token answer has TPOT 0
    values = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
    ok = np.array([i not in failed for i in range(6)])
    met = {k: ok & (values[k] <= v) for k, v in slos.items()}
    good = ok.copy()
    for v in met.values():
        good &= v
    return list(good), {k: int(v.sum()) / 6 for k, v in met.items()}, int(outputs[good].sum())


def run_bench(url: str, *args: str) -> list[dict]:
    result = CliRunner().invoke(cli, ["bench", "--base-url", url, *WORKLOAD, "--json", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_bench_goodput_against_a_server_of_known_timing_is_exactly_the_definition():
    # arrival 5 is the first level's fourth measured request (the warmup is arrival 1): an HTTP 500
    server = ["--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), "--ttft-per-prompt-token-ms", str(PER_TOKEN_MS)]
    with spawn(*server, "--fault", "5=500") as url:
        levels = run_bench(url, "--concurrency", "1,3", "--goodput", "ttft:620", "tpot:200", "e2el:860")
    slos = {"ttft": 620.0, "tpot": 200.0, "e2el": 860.0}
    for level, failed in zip(levels, ({3}, set()), strict=True):
        good, by_metric, tokens = expected(slos, failed)
        assert 0 < sum(good) < 6, good  # the SLOs split the requests: the check can fail
        assert level["failed"] == len(failed)
        assert level["goodput_slos_ms"] == slos
        assert level["slo_attainment"] == sum(good) / 6
        assert level["slo_attainment_by_metric"] == by_metric
        assert level["request_goodput"] == sum(good) / level["duration"]
        assert level["token_goodput_tok_s"] == tokens / level["duration"]
    assert levels[0]["slo_attainment"] == 3 / 6 and levels[1]["slo_attainment"] == 4 / 6


def test_a_one_token_answer_meets_any_tpot_slo(tmp_path):
    server = ["--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), "--ttft-per-prompt-token-ms", str(PER_TOKEN_MS)]
    raw = tmp_path / "runs.jsonl"
    with spawn(*server) as url:
        (level,) = run_bench(url, "--concurrency", "6", "--goodput", "tpot:100", "--output-file", str(raw))
    good, by_metric, tokens = expected({"tpot": 100.0})
    assert good == [False, True, False, False, False, False]  # every other request streams at 160 ms per token
    assert (level["slo_attainment"], level["slo_attainment_by_metric"]) == (1 / 6, by_metric)
    assert level["token_goodput_tok_s"] == tokens / level["duration"] == 1 / level["duration"]
    (line,) = raw.read_text().splitlines()  # the JSONL carries them, after bench_serving's own keys
    written = json.loads(line)
    assert list(written).index("goodput_slos_ms") > list(written).index("max_concurrent_requests")
    assert written["slo_attainment"] == level["slo_attainment"]


def test_bad_goodput_is_one_line():
    result = CliRunner().invoke(cli, ["bench", "--base-url", "http://127.0.0.1:9", "--goodput", "itl:5"])
    assert result.exit_code == 1
    assert "unknown SLO 'itl'" in result.stderr and "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["bench", "--base-url", "http://127.0.0.1:9", "tpot:5"])
    assert result.exit_code == 1 and "--slo ttft:500,tpot:50" in result.stderr
    result = CliRunner().invoke(cli, ["bench", "--base-url", "http://127.0.0.1:9", "--slo", "ttft:500,itl:5"])
    assert result.exit_code == 1 and "unknown SLO 'itl'" in result.stderr  # one spelling with `pivot run`'s


# ---------------------------------------------------------------------------------------------- the twin, imports


def test_sim_predict_goodput_is_the_definition_on_the_twins_own_requests():
    from tools.engines.sim.twin import Twin

    result = CliRunner().invoke(cli, ["sim", "predict", "--concurrency", "64", "--json", "--goodput", "ttft:3000",
                                      "tpot:150", "--", "--tp-size", "8"])  # fmt: skip
    assert result.exit_code == 0, result.output
    (shown,) = json.loads(result.stdout)
    twin = Twin.build("glm-5-nvfp4", "rtx-pro-6000-blackwell", 8, m.ServerConfig.parse("--tp-size 8"))
    spec = m.BenchSpec(random_input_len=256, random_output_len=256, concurrency=[64], prompts_per_concurrency=1)
    sim = twin.simulate(spec, 64)
    direct = compute_level(sim.records, max_concurrency=64, goodput_slos_ms={"ttft": 3000, "tpot": 150})
    for key in ("goodput_slos_ms", "slo_attainment", "slo_attainment_by_metric", "request_goodput"):
        assert shown[key] == pytest.approx(getattr(direct, key)), key
    assert 0 < shown["slo_attainment"] < 1


def test_the_twin_served_faster_judges_requests_by_slos_on_its_own_clock():
    """sim-http at time scale k: the load generator sees latencies k times shorter, so the SLOs it judges by are k
    times shorter, and the level converted back to simulated time reports the SLOs as given."""
    from tools.engines.http import HttpDeployment

    dep = HttpDeployment(server=None, engine="sim-http", source="simulated", time_scale=20.0)  # type: ignore[arg-type]
    spec = m.BenchSpec(goodput_slos_ms={"ttft": 500, "tpot": 50})
    assert dep._wall_clock_slos(spec) == {"goodput_slos_ms": {"ttft": 25.0, "tpot": 2.5}}
    wall = compute_level(SGLANG_CASES, max_concurrency=1, goodput_slos_ms={"ttft": 25.0, "tpot": 2.5})
    level = dep._scaled(wall)
    assert level.goodput_slos_ms == {"ttft": 500.0, "tpot": 50.0}
    assert level.slo_attainment == wall.slo_attainment
    assert level.request_goodput == pytest.approx(wall.request_goodput / 20)  # type: ignore[operator]


def test_import_reads_sglangs_goodput_keys(tmp_path, store, paths):
    from agent.imports import import_bench_serving

    level = compute_level(SGLANG_CASES, max_concurrency=4, goodput_slos_ms={"ttft": 300, "tpot": 150})
    data = level.model_dump()
    data.pop("token_goodput_tok_s")  # SGLang writes its own four keys, not pivot's token goodput
    bad = {**data, "max_concurrency": 8, "slo_attainment": 40.0}  # a percentage where SGLang writes a share
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps(data) + "\n" + json.dumps(bad) + "\n")
    plan = m.Plan.model_validate({"name": "p", "title": "p", "target": {"model": "x", "hardware": "h200", "gpus": 1},
                                  "items": [{"id": "01", "tier": 1, "title": "t", "kind": "code", "change": "c",
                                             "hypothesis": "h", "expected_impact": "e"}]})  # fmt: skip
    store.create_session(m.Session(id="imp", name="imp", plan=plan, engine="sim"))
    result = import_bench_serving(store, paths, "imp", path, label="by hand")
    assert [p.line for p in result.skipped] == [2] and "slo_attainment" in result.skipped[0].message
    e = store.get_experiment(result.experiment_id)
    assert e.workload.goodput_slos_ms == {"ttft": 300.0, "tpot": 150.0}
    ((imported,),) = [r.levels for r in store.bench_results(e.id or 0)]
    assert imported.slo_attainment == 2 / 5 and imported.slo_attainment_by_metric == {"ttft": 3 / 5, "tpot": 3 / 5}
