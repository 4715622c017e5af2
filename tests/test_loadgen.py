"""The load generator against servers with exactly known timing: fidelity, bench_serving's workload, faults, Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import time

import numpy as np
import pytest

from agent.errors import PivotError
from agent.models import BenchLevel, BenchSpec
from tests.timed_server import TimedServer, spawn, stats
from tools import loadgen
from tools.loadgen import (
    _SSE,
    WORDS,
    LevelProgress,
    _Counters,
    benchmark,
    client_check,
    client_warnings,
    request_body,
    run_sweep,
    sample_workload,
)
from tools.metrics import RequestRecord

# The schedule of the fidelity server: first token after T ms, then one every I ms.
T_MS, I_MS, OUT_LEN, IN_LEN = 100.0, 10.0, 40, 32


@pytest.fixture(scope="module")
def timed_url():
    """A timed server in a process of its own, as a real server would be."""
    with spawn("--ttft-ms", str(T_MS), "--itl-ms", str(I_MS)) as url:
        yield url


# ------------------------------------------------------------------------------------------ fidelity


def _reported_loop_lag_ms(level: BenchLevel) -> float:
    """The p99 lateness of the client's event loop that the level's warnings report, 0 when they report none."""
    for warning in level.warnings:
        found = re.search(r"event loop ran ([0-9,.]+) ms late", warning)
        if found:
            return float(found.group(1).replace(",", ""))
    return 0.0


@pytest.mark.parametrize("concurrency", [1, 8, 64])
@pytest.mark.parametrize("endpoint", ["generate", "completions", "chat"])
def test_ttft_tpot_and_throughput_match_the_servers_schedule(timed_url, endpoint, concurrency):
    stats(timed_url, reset=True)
    waves = 2
    spec = BenchSpec(
        endpoint=endpoint,
        random_input_len=IN_LEN,
        random_output_len=OUT_LEN,
        random_range_ratio=1.0,  # every request exactly OUT_LEN tokens
        concurrency=[concurrency],
        num_prompts=waves * concurrency,
        warmup_requests=0,
    )
    result = benchmark(timed_url, spec, warmup_pause_s=0)
    server = stats(timed_url)
    (level,) = result.levels

    assert result.source == "measured" and not result.interrupted
    assert level.completed == waves * concurrency and level.failed == 0
    assert level.total_output_tokens == waves * concurrency * OUT_LEN
    assert level.total_input_tokens == waves * concurrency * IN_LEN
    assert level.max_in_flight == concurrency
    # The server keeps its schedule to within a few ms (its timer, and a host whose two cores run the suite's two
    # workers), and says what it did; what the client measures must match what the server did, within 1 ms + 3%,
    # plus the lateness of its own event loop when it reported one (a starved host: its timestamps carry that much).
    # TTFT, as bench_serving times it, starts before the request is sent and the server's starts when it has read it:
    # a burst of `concurrency` requests opened at once waits in the server's accept queue and parser between the two
    # (up to 1 ms a request on two shared cores), never less than the server's own TTFT.
    assert server["mean_first_token_late_ms"] < 15.0 and abs(server["mean_tpot_ms"] - I_MS) < 1.0
    lag_ms = _reported_loop_lag_ms(level)
    burst_ms = 1.0 * concurrency
    assert level.mean_ttft_ms >= server["mean_ttft_ms"] - 1.0
    assert level.mean_ttft_ms <= server["mean_ttft_ms"] + 1.0 + 0.03 * T_MS + lag_ms + burst_ms
    assert level.mean_tpot_ms == pytest.approx(server["mean_tpot_ms"], abs=1.0 + 0.03 * I_MS + lag_ms)
    assert level.mean_itl_ms == pytest.approx(server["mean_tpot_ms"], abs=1.0 + 0.03 * I_MS + lag_ms)
    # Each slot serves `waves` requests back to back, each lasting TTFT + (n - 1) x TPOT.
    per_request_s = (server["mean_ttft_ms"] + (OUT_LEN - 1) * server["mean_tpot_ms"]) / 1000
    implied = waves * concurrency * OUT_LEN / (waves * per_request_s)
    assert level.output_throughput == pytest.approx(implied, rel=0.03)
    assert level.backend == {"generate": "sglang", "completions": "sglang-oai", "chat": "sglang-oai-chat"}[endpoint]


def test_a_sweep_gives_one_level_per_concurrency_with_bench_servings_labels(timed_url):
    spec = BenchSpec(
        random_input_len=8, random_output_len=4, concurrency=[1, 3], num_prompts=3, warmup_requests=1, seed=7
    )
    seen: list[LevelProgress] = []
    result = benchmark(timed_url, spec, warmup_pause_s=0, on_progress=seen.append)
    assert [lv.max_concurrency for lv in result.levels] == [1, 3]
    for level in result.levels:
        assert level.dataset_name == "random-ids" and math.isinf(level.request_rate)
        assert (level.random_input_len, level.random_output_len, level.random_range_ratio) == (8, 4, 0.0)
        assert level.completed == 3 and level.client_cpu_s is not None and level.mean_dispatch_delay_ms is not None
    phases = [(p.level_index, p.phase) for p in seen if p.phase != "running"]
    assert phases == [(0, "warmup"), (0, "done"), (1, "warmup"), (1, "done")]
    assert all(str(p) for p in seen)


# ------------------------------------------------------------------------------------------ workload


def _bench_serving_workload(spec: BenchSpec, n: int, vocab: int):
    """What sglang.benchmark.serving draws for random-ids with --tokenize-prompt, written out as it does it."""
    np.random.seed(spec.seed)
    lo = lambda full: max(int(full * spec.random_range_ratio), 1)  # noqa: E731
    input_lens = np.random.randint(lo(spec.random_input_len), spec.random_input_len + 1, size=n).tolist()
    output_lens = np.random.randint(lo(spec.random_output_len), spec.random_output_len + 1, size=n).tolist()
    offsets = np.random.randint(0, vocab, size=n)
    prompts = [[int((offsets[i] + i + j) % vocab) for j in range(input_lens[i])] for i in range(n)]
    gaps = [np.random.exponential(1.0 / spec.request_rate) for _ in range(n - 1)]
    return input_lens, output_lens, prompts, gaps


@pytest.mark.parametrize("ratio", [0.0, 0.25, 1.0])
def test_the_workload_is_bench_servings_draw_for_draw(ratio):
    spec = BenchSpec(random_input_len=50, random_output_len=20, random_range_ratio=ratio, request_rate=4.0, seed=3)
    n, vocab = 40, 1000
    input_lens, output_lens, prompts, gaps = _bench_serving_workload(spec, n, vocab)
    w = sample_workload(spec, n, vocab_size=vocab)
    assert w.input_lens.tolist() == input_lens
    assert w.output_lens.tolist() == output_lens
    assert [w.ids(i) for i in range(n)] == prompts
    assert np.allclose(np.diff(w.arrivals_s), gaps) and w.arrivals_s[0] == 0.0
    assert min(input_lens) >= max(int(50 * ratio), 1) and max(input_lens) <= 50


def test_infinite_rate_sends_everything_at_once_and_text_prompts_have_the_sampled_length():
    spec = BenchSpec(random_input_len=30, random_output_len=5)
    w = sample_workload(spec, 10)
    assert not w.arrivals_s.any()
    for i in range(10):
        words = w.text(i).split()
        assert len(words) == w.input_lens[i] and set(words) <= set(WORDS)
    assert w.text(3) == sample_workload(spec, 10).text(3)  # deterministic


def test_request_bodies_follow_each_endpoint():
    gen = json.loads(request_body("generate", [1, 2, 3], 7))
    assert gen == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 7, "ignore_eos": True},
        "stream": True,
    }
    assert json.loads(request_body("generate", "hi there", 7))["text"] == "hi there"
    comp = json.loads(request_body("completions", [1, 2], 5, model="m", ignore_eos=False))
    assert comp["prompt"] == [1, 2] and comp["max_tokens"] == 5 and comp["model"] == "m"
    assert "ignore_eos" not in comp  # false is every server's default; strict OpenAI servers refuse the key
    assert comp["stream"] and comp["stream_options"] == {"include_usage": True}
    chat = json.loads(request_body("chat", "hello", 5))
    assert chat["messages"] == [{"role": "user", "content": "hello"}] and "model" not in chat
    assert chat["max_completion_tokens"] == chat["max_tokens"] == 5


async def test_a_finite_request_rate_sends_each_request_when_it_is_due():
    spec = BenchSpec(
        random_input_len=4,
        random_output_len=3,
        random_range_ratio=1.0,
        concurrency=[4],
        num_prompts=12,
        request_rate=40.0,
        warmup_requests=0,
    )
    arrivals = sample_workload(spec, 12).arrivals_s
    async with TimedServer(ttft_ms=2, itl_ms=1) as server:
        result = await run_sweep(server.base_url, spec, warmup_pause_s=0)
    (level,) = result.levels
    service_s = (2 + 2 * 1) / 1000
    assert level.completed == 12 and level.request_rate == 40.0
    assert level.duration == pytest.approx(arrivals[-1] + service_s, abs=0.02)
    assert level.mean_dispatch_delay_ms < 5 and not [w for w in level.warnings if "unused" in w]


# ------------------------------------------------------------------------------------------ reading streams


def _feed(endpoint: str, *events: bytes, split: int | None = None) -> _SSE:
    sse = _SSE(endpoint, _Counters())
    data = b"".join(events)
    pieces = [data] if split is None else [data[i : i + split] for i in range(0, len(data), split)]
    for t, piece in enumerate(pieces):
        sse.feed(piece, float(t))
    sse.end()
    return sse


def _gen(text: str, tokens: int) -> bytes:
    return b"data: " + json.dumps({"text": text, "meta_info": {"completion_tokens": tokens}}).encode() + b"\n\n"


@pytest.mark.parametrize("split", [None, 1, 7])
def test_generate_chunks_count_new_completion_tokens_once_text_appears(split):
    sse = _feed(
        "generate",
        b": keep-alive comment\n\n",
        _gen("", 1),  # a token that decodes to nothing yet: bench_serving waits for text
        _gen("ab", 3),
        _gen("ab", 3),  # no new token: not a chunk
        _gen("abcd", 4),
        b"data: [DONE]\r\n\r\n",
        split=split,
    )
    assert list(sse.tokens) == [3, 1] and sse.output_len == 4 and sse.done
    assert sse.counters.tokens == 4


def test_openai_chunks_are_one_token_each_and_usage_gives_the_output_length():
    comp = _feed(
        "completions",
        b'data: {"choices":[{"text":" a"}]}\n\n',
        b'data: {"choices":[{"text":""}]}\n\n',
        b'data: {"choices":[{"text":" b"}],"usage":null}\n\n',
        b'data: {"choices":[],"usage":{"completion_tokens":5}}\n\n',
        b"data: [DONE]",  # the last line may come without its newline
    )
    assert list(comp.tokens) == [1, 1] and comp.output_len == 5 and comp.done
    chat = _feed(
        "chat",
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
        b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n',
        b"data: [DONE]\n\n",
    )
    assert list(chat.tokens) == [1, 1] and chat.output_len is None


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'data: {"text": "cut', "malformed SSE line"),
        (b"data: [1, 2]", "malformed SSE line"),
        (b'data: {"a": 1} trailing', "malformed SSE line"),
        (b"data: \xff\xfe", "malformed SSE line"),
        (b'data: {"error": {"message": "out of memory"}}', "server error: out of memory"),
    ],
)
def test_bad_lines_fail_the_request_with_a_reason(line, reason):
    with pytest.raises(loadgen.StreamError, match=reason):
        _feed("generate", line + b"\n\n")


# ------------------------------------------------------------------------------------------ faults


async def test_failures_are_counted_with_their_reasons_and_the_sweep_goes_on():
    faults = {2: "500", 3: "stall", 4: "cut", 5: "malformed", 6: "nofinish", 7: "drop"}
    async with TimedServer(ttft_ms=2, itl_ms=1, faults=faults) as server:
        spec = BenchSpec(
            random_input_len=8,
            random_output_len=8,
            random_range_ratio=1.0,
            concurrency=[1, 2],
            num_prompts=8,
            warmup_requests=0,
            request_timeout_s=0.5,
        )
        result = await run_sweep(server.base_url, spec, warmup_pause_s=0)
    first, second = result.levels
    assert first.completed == 2 and first.failed == 6
    assert first.errors == {
        "HTTP 500: injected failure": 1,  # the server's words, from its short error body
        "timeout after 0.5 s": 1,
        "stream cut after 4 chunks": 1,
        "malformed SSE line": 1,
        "stream ended without [DONE] or a finish_reason after 8 chunks": 1,
        "server closed the connection without answering": 1,
    }
    assert first.total_output_tokens == 2 * 8  # failed requests add nothing
    assert second.completed == 8 and second.failed == 0 and not second.errors


@pytest.mark.parametrize("endpoint", ["generate", "completions", "chat"])
async def test_a_stream_that_ends_cleanly_at_a_finish_reason_without_done_counts(endpoint):
    """transformers serve ends its streams after the chunk with finish_reason, without `data: [DONE]`."""
    async with TimedServer(ttft_ms=2, itl_ms=1, faults={2: "nodone", 3: "nodone"}) as server:
        spec = BenchSpec(endpoint=endpoint, random_input_len=8, random_output_len=8, random_range_ratio=1.0,
                         concurrency=[2], num_prompts=4, warmup_requests=0)  # fmt: skip
        result = await run_sweep(server.base_url, spec, warmup_pause_s=0)
    (level,) = result.levels
    assert level.completed == 4 and level.failed == 0 and level.total_output_tokens == 4 * 8


async def test_an_unreachable_server_fails_fast_with_a_clear_message():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.perf_counter()
    with pytest.raises(PivotError, match=rf"cannot reach http://127.0.0.1:{port}") as e:
        await run_sweep(f"http://127.0.0.1:{port}", BenchSpec(concurrency=[1]))
    assert time.perf_counter() - started < 5
    assert "--base-url" in (e.value.hint or "")


@pytest.mark.parametrize("url", ["127.0.0.1:30000", "ftp://host", "http://"])
async def test_a_malformed_base_url_is_refused(url):
    with pytest.raises(PivotError, match="bad base URL"):
        await run_sweep(url, BenchSpec(concurrency=[1]))


async def test_a_wrong_endpoint_fails_at_warmup_before_any_level():
    async with TimedServer(ttft_ms=1, itl_ms=1) as server:
        with pytest.raises(PivotError, match=r"warmup failed.*HTTP 404") as e:
            await run_sweep(server.base_url + "/nowhere", BenchSpec(concurrency=[1, 2]), warmup_pause_s=0)
    assert "--endpoint" in (e.value.hint or "")


async def test_the_model_name_comes_from_v1_models_for_openai_endpoints():
    async with TimedServer(ttft_ms=1, itl_ms=1, model="org/served-name") as server:
        spec = BenchSpec(endpoint="chat", random_input_len=4, random_output_len=2, concurrency=[1], num_prompts=1)
        await run_sweep(server.base_url + "/v1/", spec, warmup_pause_s=0)  # a trailing /v1 is forgiven
        assert {r["model"] for r in server.requests} == {"org/served-name"}
        server.requests.clear()
        await run_sweep(server.base_url, spec, model="mine", warmup_pause_s=0)
        assert {r["model"] for r in server.requests} == {"mine"}


async def test_servers_without_v1_models_or_usage_still_work_and_say_so():
    async with TimedServer(ttft_ms=1, itl_ms=1, models_endpoint=False, send_usage=False) as server:
        spec = BenchSpec(
            endpoint="completions",
            random_input_len=4,
            random_output_len=3,
            random_range_ratio=1.0,
            concurrency=[2],
            num_prompts=4,
            warmup_requests=0,
        )
        result = await run_sweep(server.base_url, spec, warmup_pause_s=0)
        assert all("model" not in r for r in server.requests)
    (level,) = result.levels
    assert level.completed == 4 and level.total_output_tokens == 12  # chunks counted instead
    assert any("reported no usage for 4 requests" in w for w in level.warnings)


# ------------------------------------------------------------------------------------------ Ctrl-C


async def test_cancelling_stops_at_once_and_keeps_the_finished_levels(tmp_path):
    out = tmp_path / "sweep.jsonl"
    async with TimedServer(ttft_ms=5, itl_ms=5) as server:
        first_done = asyncio.Event()

        def progress(p: LevelProgress) -> None:
            if p.phase == "done":
                first_done.set()

        spec = BenchSpec(
            random_input_len=8,
            random_output_len=60,
            random_range_ratio=1.0,
            concurrency=[2, 4, 8],
            num_prompts=4,
            warmup_requests=0,
        )
        task = asyncio.create_task(
            run_sweep(server.base_url, spec, on_progress=progress, output_file=out, warmup_pause_s=0)
        )
        await asyncio.wait_for(first_done.wait(), timeout=20)
        await asyncio.sleep(0.1)  # well into the second level's streams
        started = time.perf_counter()
        task.cancel()
        result = await task
        assert time.perf_counter() - started < 1.0
        await asyncio.sleep(0.05)
        assert server.stats.disconnects >= 1 and not server._conns  # nothing left open
    assert result.interrupted and [lv.max_concurrency for lv in result.levels] == [2]
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and BenchLevel.model_validate(json.loads(lines[0])).max_concurrency == 2
    assert result.raw_path == str(out) and result.finished_at is not None


# ------------------------------------------------------------------------------------------ self-check


def _rec(start: float, end: float, queued: float = 0.0) -> RequestRecord:
    return RequestRecord(
        start_s=start, prompt_len=1, chunk_times_s=[start + 0.01], chunk_tokens=[1], end_s=end, queued_s=queued
    )


def test_the_client_check_measures_in_flight_requests_and_dispatch_delay():
    # Two slots, four requests all due at 0: slot A serves 0-1 then 1-2; slot B starts late (0.5) then 1.5-2.5.
    records = [_rec(0.0, 1.0), _rec(0.5, 1.5, queued=0.5), _rec(1.0, 2.0), _rec(1.5, 2.5)]
    check = client_check(records, [0.0] * 4)
    assert check.max_in_flight == 2
    assert check.mean_in_flight == pytest.approx((1 * 0.5 + 2 * 1.5 + 1 * 0.5) / 2.5)
    # requests waited (past the grace) until 1.5; in flight meanwhile: 1 until 0.5, then 2 for 1 s
    grace = loadgen.PENDING_GRACE_S
    assert check.backlog_in_flight == pytest.approx(((0.5 - grace) * 1 + 1.0 * 2) / (1.5 - grace))
    assert check.mean_dispatch_delay_ms == pytest.approx(125.0) and check.max_dispatch_delay_ms == pytest.approx(500)


def test_the_client_warns_when_it_fell_short_of_the_load_asked_for():
    # slot B starts 0.9 s late: 15% of the concurrency x time asked for goes unused while requests wait
    records = [_rec(0.0, 1.0), _rec(0.9, 1.9, queued=0.9), _rec(1.0, 2.0), _rec(1.9, 2.9)]
    check = client_check(records, [0.0] * 4)
    assert check.unused_share(2) == pytest.approx(0.155, abs=0.005)
    level = BenchLevel.model_validate(
        {
            k: 1.0
            for k, f in BenchLevel.model_fields.items()
            if (k.endswith("_ms") or k.endswith("throughput")) and f.annotation in (float, float | None)
        }
        | {"duration": 2.5, "completed": 4, "total_input_tokens": 4, "total_output_tokens": 4}
        | {"concurrency": 1.6, "max_output_tokens_per_s": 4}
    )
    warnings = client_warnings(level, check, target=2, cpu_s=2.4, wall_s=2.5, loop_lag_p99_ms=40.0, no_usage=0)
    text = " | ".join(warnings)
    assert "of the level's concurrency unused" in text
    assert "inside the client before being sent" in text
    assert "event loop ran 40.0 ms late" in text
    assert "96% of a CPU core" in text
    quiet = client_check([_rec(0.0, 1.0), _rec(0.0, 1.0)], [0.0, 0.0])
    assert client_warnings(level, quiet, target=2, cpu_s=0.1, wall_s=1.0, loop_lag_p99_ms=0.5, no_usage=0) == []
    # Poisson arrivals at a low rate: one request at a time, each sent 0.2 ms after it was due
    lone = [_rec(t + 0.0002, t + 0.1, queued=0.0002) for t in (0.0, 0.5, 1.0)]
    sparse = client_check(lone, [0.0, 0.5, 1.0])
    assert sparse.backlog_in_flight is None and sparse.max_in_flight == 1
    assert client_warnings(level, sparse, target=64, cpu_s=0.1, wall_s=1.1, loop_lag_p99_ms=0.5, no_usage=0) == []
    # all sent at once, the last one 5 ms after the first: a start-up ramp, not a shortfall
    ramp = client_check([_rec(k * 0.0003, 1.0 + k * 0.0003) for k in range(16)], [0.0] * 16)
    assert ramp.backlog_in_flight is not None and ramp.unused_share(16) < 0.01
    assert client_warnings(level, ramp, target=16, cpu_s=0.1, wall_s=1.0, loop_lag_p99_ms=0.5, no_usage=0) == []
