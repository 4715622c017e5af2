"""bench_serving's definitions, shared by the load generator and the twin: the workload it draws, and its metrics.

Workload: random-ids lengths, prompt offsets and arrival gaps come from the same seeded numpy calls, in
the same order, as bench_serving's (`workload_draws`), so pivot bench and the twin send the same requests.

The definitions are those of `sglang.bench_serving` (`calculate_metrics` and the peak figures), so
pivot's numbers can be put next to the reference tool's:

- duration: from the first request sent to the last one finished (failed ones included).
- completed: successful requests. total_input_tokens: the client-side prompt lengths of those;
  total_output_tokens: the server-reported completion tokens of those.
- request/input/output/total throughput: the totals above divided by duration.
- TTFT_i: first chunk carrying a token minus send time. E2E latency_i: end minus send time.
- TPOT_i = (latency_i - ttft_i) / (output_len_i - 1), only for requests with output_len > 1.
- ITL: each gap between consecutive token-carrying chunks, split evenly over the new tokens in the
  later chunk (`[gap / n] * n`). bench_serving counts tokens per chunk this way for SGLang's native
  /generate; for the OpenAI endpoints it appends one gap per content chunk, so a client records
  chunk_tokens = 1 per chunk there to get the same numbers.
- mean, median, std (population), p90, p95, p99 (numpy's linear percentiles) of each, in ms.
- concurrency = sum of E2E latencies / duration (Little's law).
- max_output_tokens_per_s: the most token timestamps in any 1-second bucket since the first send,
  where a request's token timestamps are send + ttft, then + cumsum(itl).
- max_concurrent_requests: the most successful requests in flight during any such 1-second bucket.
Goodput, with SLOs (SGLang 0.5.23's `--goodput ttft:500 tpot:50 e2el:...`, in ms): a request is good when it
succeeded and its TTFT, TPOT and E2E latency each met the SLO given for it (value <= SLO; a one-token answer has
TPOT 0); `request_goodput` = good requests / duration, `slo_attainment` = good / requests sent (failed ones count
against it), `slo_attainment_by_metric` = per SLO, requests that succeeded and met it / requests sent, and pivot's
`token_goodput_tok_s` = output tokens of the good requests / duration.
Failed requests are counted in `failed` and `errors` (reason -> count) and never raise. Two choices of
our own: duration runs from the first send to the last end (bench_serving also counts its final
/server_info call), and a stream that carried no token is a failure (bench_serving counts it as a
success with TTFT 0).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.models import BenchLevel, BenchSpec

PERCENTILES = (90, 95, 99)
MAX_ERROR_KINDS = 10  # distinct failure reasons kept per level; the rest are counted together
DEFAULT_VOCAB_SIZE = 32000  # random-ids stay below this: every common tokenizer has at least this many ids


def random_lens(full_len: int, range_ratio: float, num: int, rs: np.random.RandomState) -> np.ndarray:
    """bench_serving's `compute_random_lens`: uniform integers in [max(int(L * ratio), 1), L]."""
    return rs.randint(max(int(full_len * range_ratio), 1), full_len + 1, size=num)


def workload_draws(
    spec: BenchSpec, num_prompts: int, vocab_size: int = DEFAULT_VOCAB_SIZE
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """bench_serving's random-ids draws with `spec.seed`, in its order: input lengths, output lengths,
    prompt offsets, then the arrival times (seconds; all 0 at an infinite request rate)."""
    rs = np.random.RandomState(spec.seed)  # the legacy generator, as `np.random.seed(args.seed)` gives
    input_lens = random_lens(spec.random_input_len, spec.random_range_ratio, num_prompts, rs)
    output_lens = random_lens(spec.random_output_len, spec.random_range_ratio, num_prompts, rs)
    offsets = rs.randint(0, vocab_size, size=num_prompts)
    if math.isinf(spec.request_rate):
        arrivals = np.zeros(num_prompts)
    else:  # bench_serving yields a request, then sleeps an exponential gap before the next
        gaps = rs.exponential(1.0 / spec.request_rate, size=max(num_prompts - 1, 0))
        arrivals = np.concatenate(([0.0], np.cumsum(gaps)))
    return input_lens, output_lens, offsets, arrivals


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it; all times in seconds on one monotonic clock (time.perf_counter)."""

    start_s: float  # when the request was sent (after any wait inside the client)
    prompt_len: int  # input tokens as the client sampled them (bench_serving's prompt_len)
    chunk_times_s: Sequence[float]  # absolute arrival time of each streamed chunk that carried >= 1 new token
    chunk_tokens: Sequence[int]  # new tokens in each of those chunks
    output_len: int | None = None  # server-reported completion tokens; None -> sum(chunk_tokens)
    end_s: float | None = None  # when the response finished (or failed); None -> last chunk time
    error: str | None = None  # None on success, else a short reason such as "HTTP 500"
    queued_s: float = 0.0  # time spent waiting inside the client before it was sent (dispatch delay)

    @property
    def ok(self) -> bool:
        return self.error is None and len(self.chunk_times_s) > 0

    def finished_s(self) -> float:
        """When the request ended, as well as the record knows it."""
        if self.end_s is not None:
            return self.end_s
        return float(self.chunk_times_s[-1]) if len(self.chunk_times_s) else self.start_s

    def tokens_out(self) -> int:
        return int(self.output_len) if self.output_len is not None else int(np.sum(self.chunk_tokens))


def _stats(name: str, values: np.ndarray) -> dict[str, float]:
    """bench_serving's summary of a list of seconds, in ms; an empty list gives zeros, as `np.mean(x or 0)` does."""
    v = values if values.size else np.zeros(1)
    out = {
        f"mean_{name}_ms": float(np.mean(v)) * 1000,
        f"median_{name}_ms": float(np.median(v)) * 1000,
        f"std_{name}_ms": float(np.std(v)) * 1000,
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(v, p)) * 1000
    return out


def _token_times(rec: RequestRecord) -> tuple[np.ndarray, np.ndarray]:
    """(token timestamps, ITL values) of one successful request, as bench_serving derives them."""
    times = np.asarray(rec.chunk_times_s, dtype=np.float64)
    counts = np.asarray(rec.chunk_tokens, dtype=np.int64)
    if times.size <= 1:
        return times[:1], np.empty(0)
    gaps = np.diff(times)
    later = counts[1:]
    keep = later > 0
    itl = np.repeat(gaps[keep] / later[keep], later[keep])
    # send + ttft, then + each ITL in turn, added one after another as bench_serving adds them (t += itl): summing
    # the ITLs first and adding the sum rounds differently, which can move a stamp across a 1-second bucket's edge
    stamps = np.cumsum(np.concatenate(([times[0]], itl)))
    return stamps, itl


def compute_level(
    records: Sequence[RequestRecord],
    *,
    max_concurrency: int | None,
    request_rate: float = math.inf,
    backend: str | None = None,
    dataset_name: str | None = None,
    random_input_len: int | None = None,
    random_output_len: int | None = None,
    random_range_ratio: float | None = None,
    check: Callable[[], None] | None = None,
    goodput_slos_ms: Mapping[str, float] | None = None,
) -> BenchLevel:
    """bench_serving's metrics for one level, plus failures by reason; client-check fields are left unset.
    `check` is called every few thousand records; it raises to stop (the sim engine on SIGTERM). With
    `goodput_slos_ms`, SGLang's goodput keys and pivot's token goodput too."""
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    reasons = Counter(r.error or "no tokens received" for r in failed)
    errors = Counter(dict(reasons.most_common(MAX_ERROR_KINDS)))  # servers' words can differ per request (token ids)
    if len(reasons) > MAX_ERROR_KINDS:
        errors[f"{len(reasons) - MAX_ERROR_KINDS} other reasons"] = sum(reasons.values()) - sum(errors.values())
    if records:
        t0 = min(r.start_s for r in records)
        t1 = max(r.finished_s() for r in records)
        duration = max(t1 - t0, 1e-9)
    else:
        t0, duration = 0.0, 1e-9

    starts = np.fromiter((r.start_s for r in done), dtype=np.float64, count=len(done))
    ends = np.fromiter((r.finished_s() for r in done), dtype=np.float64, count=len(done))
    first = np.fromiter((r.chunk_times_s[0] for r in done), dtype=np.float64, count=len(done))
    out_lens = np.fromiter((r.tokens_out() for r in done), dtype=np.int64, count=len(done))
    total_input = int(sum(r.prompt_len for r in done))
    total_output = int(out_lens.sum())
    ttft = first - starts
    e2e = ends - starts
    multi = out_lens > 1
    tpot = (e2e[multi] - ttft[multi]) / (out_lens[multi] - 1)

    itl_parts, stamp_parts = [], []
    for i, r in enumerate(done):
        if check is not None and i % 2048 == 0:
            check()
        stamps, itl = _token_times(r)
        itl_parts.append(itl)
        stamp_parts.append(stamps)
    itl_all = np.concatenate(itl_parts) if itl_parts else np.empty(0)
    stamps_all = np.concatenate(stamp_parts) if stamp_parts else np.empty(0)
    n_buckets = math.floor(duration) + 1
    if stamps_all.size:
        buckets = np.clip(np.floor(stamps_all - t0).astype(np.int64), 0, n_buckets - 1)
        max_tok_s = float(np.bincount(buckets, minlength=n_buckets).max())
    else:
        max_tok_s = 0.0
    max_conc = _peak_in_flight_per_second([(r.start_s, r.finished_s()) for r in done], t0, n_buckets)

    return BenchLevel(
        backend=backend,
        dataset_name=dataset_name,
        request_rate=request_rate,
        max_concurrency=max_concurrency,
        random_input_len=random_input_len,
        random_output_len=random_output_len,
        random_range_ratio=random_range_ratio,
        duration=duration,
        completed=len(done),
        total_input_tokens=total_input,
        total_output_tokens=total_output,
        request_throughput=len(done) / duration,
        input_throughput=total_input / duration,
        output_throughput=total_output / duration,
        total_throughput=(total_input + total_output) / duration,
        **_stats("e2e_latency", e2e),
        **_stats("ttft", ttft),
        **_stats("tpot", tpot),
        **_stats("itl", itl_all),
        concurrency=float(e2e.sum()) / duration,
        max_output_tokens_per_s=max_tok_s,
        max_concurrent_requests=max_conc,
        failed=len(failed),
        errors=dict(errors),
        **goodput_fields(ttft, e2e, out_lens, len(records), duration, goodput_slos_ms),
    )


def goodput_fields(
    ttft_s: np.ndarray,
    e2e_s: np.ndarray,
    out_lens: np.ndarray,
    sent: int,
    duration_s: float,
    slos_ms: Mapping[str, float] | None,
) -> dict[str, Any]:
    """SGLang's goodput keys and pivot's token goodput for the successful requests' TTFT, E2E latency (seconds)
    and output lengths, out of `sent` requests (failed ones count against attainment); {} without SLOs."""
    if not slos_ms:
        return {}
    tpot_s = np.where(out_lens > 1, (e2e_s - ttft_s) / np.maximum(out_lens - 1, 1), 0.0)
    observed = {"ttft": ttft_s * 1000, "tpot": tpot_s * 1000, "e2el": e2e_s * 1000}
    good = np.ones(out_lens.size, dtype=bool)
    by_metric: dict[str, float] = {}
    for name, slo in slos_ms.items():
        met = observed[name] <= slo
        good &= met
        by_metric[name] = int(met.sum()) / sent if sent else 0.0
    n_good = int(good.sum())
    return {
        "goodput_slos_ms": {k: float(v) for k, v in slos_ms.items()},
        "request_goodput": n_good / duration_s,
        "slo_attainment": n_good / sent if sent else 0.0,
        "slo_attainment_by_metric": by_metric,
        "token_goodput_tok_s": int(out_lens[good].sum()) / duration_s,
    }


def failed_goodput(slos_ms: Mapping[str, float] | None) -> dict[str, Any]:
    """The goodput keys of a level whose every request failed (the server was down): nothing good."""
    empty = np.empty(0)
    return goodput_fields(empty, empty, np.empty(0, dtype=np.int64), 1, 1.0, slos_ms)


def _peak_in_flight_per_second(spans: list[tuple[float, float]], t0: float, n_buckets: int) -> int:
    """The most requests that were in flight at some point of any 1-second bucket since t0."""
    if not spans:
        return 0
    first = np.clip(np.floor(np.array([s for s, _ in spans]) - t0).astype(np.int64), 0, n_buckets - 1)
    last = np.clip(np.floor(np.array([e for _, e in spans]) - t0).astype(np.int64), 0, n_buckets - 1)
    delta = np.zeros(n_buckets + 1, dtype=np.int64)
    np.add.at(delta, first, 1)
    np.add.at(delta, last + 1, -1)
    return int(np.cumsum(delta)[:n_buckets].max())
