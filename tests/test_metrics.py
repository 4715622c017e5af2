"""tools/metrics.py against bench_serving's formulas, written out here the way bench_serving's code has them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tools.metrics import RequestRecord, compute_level


def reference(records: list[RequestRecord]) -> dict[str, float]:
    """bench_serving's calculate_metrics, loop by loop (lists, per-chunk ITL split, np summaries)."""
    ok = [r for r in records if r.error is None and len(r.chunk_times_s) > 0]
    dur = max(r.end_s for r in records) - min(r.start_s for r in records)
    ttfts, tpots, itls, e2es, outs, ins, stamps = [], [], [], [], [], [], []
    for r in ok:
        ttft = r.chunk_times_s[0] - r.start_s
        latency = r.end_s - r.start_s
        out = r.output_len if r.output_len is not None else sum(r.chunk_tokens)
        itl = []
        for k in range(1, len(r.chunk_times_s)):
            n = r.chunk_tokens[k]
            if n == 0:
                continue
            itl += [(r.chunk_times_s[k] - r.chunk_times_s[k - 1]) / n] * n
        ttfts.append(ttft)
        e2es.append(latency)
        outs.append(out)
        ins.append(r.prompt_len)
        itls += itl
        if out > 1:
            tpots.append((latency - ttft) / (out - 1))
        t = r.start_s + ttft
        stamps.append(t)
        for x in itl:
            t += x
            stamps.append(t)
    t0 = min(r.start_s for r in records)
    counts: dict[int, int] = {}
    for s in stamps:
        bucket = math.floor(s - t0)
        counts[bucket] = counts.get(bucket, 0) + 1
    res = {
        "completed": len(ok),
        "duration": dur,
        "total_input_tokens": sum(ins),
        "total_output_tokens": sum(outs),
        "output_throughput": sum(outs) / dur,
        "total_throughput": (sum(ins) + sum(outs)) / dur,
        "request_throughput": len(ok) / dur,
        "concurrency": sum(e2es) / dur,
        "max_output_tokens_per_s": max(counts.values()) if counts else 0,
    }
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2e_latency", e2es)):
        res[f"mean_{name}_ms"] = np.mean(vals or 0) * 1000
        res[f"median_{name}_ms"] = np.median(vals or 0) * 1000
        res[f"std_{name}_ms"] = np.std(vals or 0) * 1000
        for p in (90, 95, 99):
            res[f"p{p}_{name}_ms"] = np.percentile(vals or 0, p) * 1000
    return res


@st.composite
def records(draw):
    out = []
    for _ in range(draw(st.integers(1, 12))):
        start = draw(st.floats(0, 5, allow_nan=False))
        n_chunks = draw(st.integers(0, 20))
        gaps = draw(st.lists(st.floats(0.0001, 0.5, allow_nan=False), min_size=n_chunks, max_size=n_chunks))
        times = list(start + np.cumsum(gaps)) if gaps else []
        tokens = draw(st.lists(st.integers(0, 4), min_size=n_chunks, max_size=n_chunks))
        if tokens:
            tokens[0] = max(tokens[0], 1)
        failed = draw(st.booleans()) and draw(st.booleans())
        end = (times[-1] if times else start) + draw(st.floats(0.001, 0.1, allow_nan=False))
        reported = draw(st.one_of(st.none(), st.integers(1, 80)))
        out.append(
            RequestRecord(
                start_s=start,
                prompt_len=draw(st.integers(1, 2048)),
                chunk_times_s=times,
                chunk_tokens=tokens,
                output_len=reported,
                end_s=end,
                error="HTTP 500" if failed else None,
            )
        )
    return out


@settings(max_examples=200, deadline=None)
@given(records())
def test_matches_bench_serving_formulas(recs):
    level = compute_level(recs, max_concurrency=8)
    ref = reference(recs)
    for key, value in ref.items():
        assert getattr(level, key) == pytest.approx(value, rel=1e-9, abs=1e-9), key
    assert level.completed + level.failed == len(recs)


def test_a_known_schedule():
    # 4 requests sent at t=0, first token after 100 ms, then a token every 10 ms, 11 tokens each
    recs = [
        RequestRecord(
            start_s=0.0,
            prompt_len=100,
            chunk_times_s=[0.1 + 0.01 * k for k in range(11)],
            chunk_tokens=[1] * 11,
            end_s=0.2,
        )
        for _ in range(4)
    ]
    level = compute_level(recs, max_concurrency=4, backend="sglang", random_input_len=100)
    assert level.duration == pytest.approx(0.2)
    assert level.mean_ttft_ms == pytest.approx(100)
    assert level.mean_tpot_ms == pytest.approx(10) and level.mean_itl_ms == pytest.approx(10)
    assert level.output_throughput == pytest.approx(44 / 0.2)
    assert level.total_throughput == pytest.approx(444 / 0.2)
    assert level.concurrency == pytest.approx(4.0)
    assert level.max_output_tokens_per_s == 44 and level.max_concurrent_requests == 4
    assert level.backend == "sglang" and level.random_input_len == 100 and math.isinf(level.request_rate)


def test_chunks_of_several_tokens_split_the_gap_evenly():
    rec = RequestRecord(start_s=0.0, prompt_len=1, chunk_times_s=[0.05, 0.09], chunk_tokens=[1, 4], end_s=0.09)
    level = compute_level([rec], max_concurrency=1)
    assert level.mean_itl_ms == pytest.approx(10.0) and level.p99_itl_ms == pytest.approx(10.0)
    assert level.total_output_tokens == 5 and level.mean_tpot_ms == pytest.approx(10.0)


def test_failures_are_counted_with_reasons_and_never_raise():
    ok = RequestRecord(start_s=0.0, prompt_len=10, chunk_times_s=[0.1, 0.2], chunk_tokens=[1, 1], end_s=0.2)
    bad = [
        RequestRecord(start_s=0.0, prompt_len=10, chunk_times_s=[], chunk_tokens=[], end_s=0.05, error="HTTP 500"),
        RequestRecord(
            start_s=0.0,
            prompt_len=10,
            chunk_times_s=[0.1],
            chunk_tokens=[1],
            end_s=3.0,
            error="stream cut after 1 chunk",
        ),
        RequestRecord(start_s=0.1, prompt_len=10, chunk_times_s=[], chunk_tokens=[], end_s=0.3, error="HTTP 500"),
        RequestRecord(start_s=0.1, prompt_len=10, chunk_times_s=[], chunk_tokens=[], end_s=0.3),
    ]
    level = compute_level([ok, *bad], max_concurrency=5)
    assert level.completed == 1 and level.failed == 4
    assert level.errors == {"HTTP 500": 2, "stream cut after 1 chunk": 1, "no tokens received": 1}
    assert level.duration == pytest.approx(3.0)  # failed requests still take time
    assert level.total_input_tokens == 10  # only successful requests' prompts count
    assert level.max_concurrent_requests == 1  # successful requests only, as bench_serving counts them


def test_all_failed_or_empty_gives_zeros():
    dead = RequestRecord(start_s=1.0, prompt_len=10, chunk_times_s=[], chunk_tokens=[], end_s=1.5, error="timeout")
    level = compute_level([dead], max_concurrency=1)
    assert (level.completed, level.failed, level.output_throughput, level.mean_ttft_ms) == (0, 1, 0.0, 0.0)
    assert compute_level([], max_concurrency=1).completed == 0


def test_token_stamps_are_added_one_after_another_as_bench_serving_adds_them():
    """A stamp on a 1-second bucket's edge lands where bench_serving's t += itl puts it (a case hypothesis found:
    0.5 + 3 x (0.5 / 3) is 0.9999999999999999 added in turn, 1.0 when the ITLs are summed first)."""
    rec = RequestRecord(start_s=0.0, prompt_len=1, chunk_times_s=[0.5, 1.0, 1.5, 2.0, 2.5], chunk_tokens=[1, 0, 0, 0, 3],
                        output_len=None, end_s=2.5625, error=None, queued_s=0.0)  # fmt: skip
    assert (
        compute_level([rec], max_concurrency=1).max_output_tokens_per_s == reference([rec])["max_output_tokens_per_s"]
    )
