"""The HTTP load generator behind `pivot bench` and the HTTP engines: bench_serving's workload and metrics, from a client that checks itself.

What it sends is `sglang.bench_serving`'s workload: lengths drawn with the same seeded numpy calls
(`randint(max(int(L * ratio), 1), L + 1)`, input lengths first, then output lengths), random-ids
prompts built the same way (`(offset + i + j) % vocab_size`), Poisson gaps from the same stream,
`ignore_eos`, temperature 0, warmup requests before each level that are not counted, then a pause.
What it reports is bench_serving's metrics, computed by `tools.metrics`, with bench_serving's keys.

Endpoints and prompts:
- `generate`: SGLang's native `/generate`, `input_ids` for random-ids (exact prompt lengths, no
  tokenizer needed), `text` for random text; SSE chunks carry cumulative `text` and
  `meta_info.completion_tokens`, so new tokens per chunk are the difference of the latter.
- `completions`: `/v1/completions`, with the token ids as `prompt` for random-ids (the endpoint
  accepts a list of ints, so lengths stay exact) and text for random text.
- `chat`: `/v1/chat/completions`, always text (a chat message cannot be token ids): words drawn
  from a list of common English words that are one token each in the usual BPE tokenizers, so a
  prompt of L words is about L tokens, plus the chat template's own tokens.
  OpenAI endpoints ask for `stream_options.include_usage`, so output_len is the server's count;
  a server that sends no usage gets its chunks counted instead, and the level says so.
As bench_serving does, a chunk counts once the (cumulative) text is non-empty, TTFT is the first
such chunk, and E2E latency runs to the last line of the stream (`data: [DONE]`). A stream that ends cleanly
without `[DONE]` counts when a chunk carried a `finish_reason` (transformers serve ends its streams so, and
bench_serving accepts them); one with neither was cut short and fails.

The client is `tools.httpstream` (asyncio protocols, not aiohttp or httpx: see there and
benchmarks/client_ceiling.py for why): one pool of keep-alive connections per level, opened before
the level's clock starts, one worker per concurrency slot (so nothing queues inside the client),
the request written in the call that stamps its start, chunks timestamped as the socket is read. Each level also reports what the client itself did: requests really in flight
(mean over the level, peak), dispatch delay (from the moment a request was due and a slot was free
to the moment it was sent), the process's CPU time, and warnings when it did not hold the requested
concurrency, delayed dispatch, ran its event loop late or used a whole core.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import numpy as np
from pydantic import BaseModel, ConfigDict
from yarl import URL

from agent.errors import PivotError, redact
from agent.models import BenchLevel, BenchResult, BenchSpec, utcnow
from agent.servers import fault_point
from tools.httpstream import HttpStreamClient, StreamError
from tools.metrics import DEFAULT_VOCAB_SIZE, RequestRecord, compute_level, workload_draws

ENDPOINT_PATHS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}
_BACKEND_SUFFIX = {"generate": "", "completions": "-oai", "chat": "-oai-chat"}  # sglang, sglang-oai, sglang-oai-chat
WARMUP_OUTPUT_LEN = 32  # bench_serving's warmup asks for min(output_len, 32) tokens
PROGRESS_INTERVAL_S = 0.5
DISPATCH_BATCH = 32  # workers started per event-loop turn at the start of a level
PREBUILD_BYTES = 256 * 2**20  # request bodies built ahead of a level, at most (about 8 bytes per prompt token)

# Thresholds of the client's self-check (see `client_check` and `client_warnings`).
PENDING_GRACE_S = 0.002  # a due request still unsent after this (asyncio timers wake up to 1 ms late) is a backlog
SUSTAIN_SHARE = 0.9  # concurrency x time actually used while requests waited, as a share of what was asked for
DISPATCH_DELAY_MS = 10.0  # mean dispatch delay above max(this, DISPATCH_DELAY_SHARE x mean TTFT) is large
DISPATCH_DELAY_SHARE = 0.05
LOOP_LAG_MS = 5.0  # p99 lateness of the event loop above max(this, 5% of mean ITL) is reported
CPU_SHARE = 0.9  # client CPU seconds per wall second: one event loop cannot use more than one core

# Common English words that are one token each (with their leading space) in GPT-2, Llama, Qwen and
# GLM tokenizers; random text is drawn from them so that L words are about L tokens.
_WORDS_TEXT = """the of and to in is that for it as was with be by on not he this are or his from at which but have
    an had they you were their one all we can her has there been if more when will would who so no time
    out up use made new like now very first may such only over other some these two then them into its
    than most could what way about many people work year years day part state same long after where
    well good back great still know world place under own find any make both take even life down
    just house being old water three give each high small much same last think also our before here
    home never while right another might found through off take left end why must group need line
    every number city large name open change point light order side read war book child play turn
    move case form word plan run real hand road best four land full late help face mind body early
    area kind near game half body top close past free power table stay voice"""
WORDS = tuple(dict.fromkeys(_WORDS_TEXT.split()))


class LevelProgress(BaseModel):
    """Where a sweep stands: sent to `on_progress` at each phase change and every half second while a level runs."""

    model_config = ConfigDict(frozen=True)

    phase: Literal["warmup", "running", "done"]
    level_index: int
    levels_total: int
    max_concurrency: int
    requests_total: int
    requests_done: int = 0
    requests_failed: int = 0
    in_flight: int = 0
    output_tokens: int = 0
    elapsed_s: float = 0.0
    output_tok_s: float = 0.0
    level: BenchLevel | None = None

    def __str__(self) -> str:
        head = f"level {self.level_index + 1}/{self.levels_total} (concurrency {self.max_concurrency})"
        if self.phase == "warmup":
            return f"{head}: warming up"
        if self.phase == "done" and self.level is not None:
            lv = self.level
            return (
                f"{head}: done, {lv.completed} completed, {lv.failed} failed, "
                f"{lv.output_throughput:,.0f} output tok/s, mean TTFT {lv.mean_ttft_ms:,.1f} ms, "
                f"mean TPOT {lv.mean_tpot_ms:,.2f} ms"
            )
        if self.requests_done == 0 and self.in_flight == 0:
            return f"{head}: sending {self.requests_total} requests"
        failed = f", {self.requests_failed} failed" if self.requests_failed else ""
        return (
            f"{head}: {self.requests_done}/{self.requests_total} done{failed}, {self.in_flight} in flight, "
            f"{self.output_tok_s:,.0f} tok/s"
        )


# ---------------------------------------------------------------------------------------------- workload


@dataclass(slots=True)
class Workload:
    """One level's prompts as bench_serving draws them for random-ids (same seed, same numbers), and when each is due."""

    input_lens: np.ndarray
    output_lens: np.ndarray
    offsets: np.ndarray
    arrivals_s: np.ndarray  # seconds after the level starts; all 0 when the request rate is infinite
    vocab_size: int
    seed: int
    _words: np.ndarray | None = None  # word indices of every text prompt, drawn on first use
    _word_starts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.input_lens)

    def ids(self, i: int) -> list[int]:
        """bench_serving's random-ids prompt i: consecutive ids from a random offset, modulo the vocabulary."""
        return ((np.arange(int(self.input_lens[i])) + (int(self.offsets[i]) + i)) % self.vocab_size).tolist()

    def text(self, i: int) -> str:
        """Random text of input_lens[i] common words (about that many tokens)."""
        if self._words is None or self._word_starts is None:
            # a generator of its own, so that bench_serving's sequence of draws above stays untouched
            rng = np.random.default_rng(self.seed)
            self._words = rng.integers(0, len(WORDS), size=int(self.input_lens.sum()), dtype=np.int16)
            self._word_starts = np.concatenate(([0], np.cumsum(self.input_lens)))
        start = int(self._word_starts[i])
        return " ".join(map(WORDS.__getitem__, self._words[start : start + int(self.input_lens[i])].tolist()))


def sample_workload(spec: BenchSpec, num_prompts: int, *, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Workload:
    """The prompts of one level: bench_serving's random-ids draws with `spec.seed`, in bench_serving's order."""
    input_lens, output_lens, offsets, arrivals = workload_draws(spec, num_prompts, vocab_size)
    return Workload(input_lens, output_lens, offsets, arrivals, vocab_size, spec.seed)


def request_body(
    endpoint: str,
    prompt: list[int] | str,
    output_len: int,
    *,
    ignore_eos: bool = True,
    model: str | None = None,
) -> bytes:
    """The JSON body of one streaming request to `endpoint`, as bench_serving builds it."""
    body: dict[str, Any]
    if endpoint == "generate":
        body = {
            ("input_ids" if isinstance(prompt, list) else "text"): prompt,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": ignore_eos},
            "stream": True,
        }
    else:
        body = {} if model is None else {"model": model}
        if endpoint == "completions":
            body["prompt"] = prompt
        else:
            text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
            body["messages"] = [{"role": "user", "content": text}]
            body["max_completion_tokens"] = output_len  # the current name; max_tokens for older servers
        body.update(max_tokens=output_len, temperature=0.0)
        if ignore_eos:  # false is every server's default; strict OpenAI servers (transformers serve) refuse the key
            body["ignore_eos"] = True
        body.update(stream=True, stream_options={"include_usage": True})
    return json.dumps(body, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------------------- one request


class _Counters:
    """Live numbers of the level running now, read by the progress reporter."""

    __slots__ = ("done", "failed", "in_flight", "no_usage", "tokens")

    def __init__(self) -> None:
        self.done = self.failed = self.in_flight = self.tokens = self.no_usage = 0


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_raw_decode = json.JSONDecoder().raw_decode  # half the cost of json.loads on bytes, which this path runs per chunk


class _SSE:
    """One streamed answer read the way bench_serving reads its endpoint: which chunks carry tokens, and when."""

    __slots__ = (
        "chat",
        "counted",
        "counters",
        "done",
        "finished",
        "generate",
        "last_line_s",
        "output_len",
        "rest",
        "text_seen",
        "times",
        "tokens",
    )

    def __init__(self, endpoint: str, counters: _Counters) -> None:
        self.generate = endpoint == "generate"
        self.chat = endpoint == "chat"
        self.counters = counters
        self.times = array("d")  # 8 bytes a chunk rather than a float object's 32: long sweeps keep millions
        self.tokens = array("l")
        self.output_len: int | None = None
        self.done = False  # saw data: [DONE]
        self.finished = False  # saw a finish_reason (transformers serve ends its streams there, without [DONE])
        self.last_line_s = 0.0
        self.counted = 0  # /generate: completion tokens already given to a chunk
        self.text_seen = False  # /generate: the cumulative text is non-empty
        self.rest = b""

    def feed(self, data: bytes, now: float) -> None:
        if self.rest:
            data = self.rest + data
        lines = data.split(b"\n")
        self.rest = lines.pop()
        for line in lines:
            if line and line != b"\r":  # half the lines are the blank ones between events
                self._line(line, now)

    def end(self) -> None:
        """The answer is complete: a last line without its newline still counts."""
        if self.rest.strip():
            line, self.rest = self.rest, b""
            self._line(line, self.last_line_s)

    def _line(self, line: bytes, now: float) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            return
        if line.startswith(b"data:"):
            payload = line[5:].lstrip(b" ")
        elif line.startswith((b":", b"event:", b"id:", b"retry:")):
            return  # SSE comments and fields other than data
        else:
            payload = line  # bench_serving also takes a line without the data: prefix
        self.last_line_s = now
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            text = payload.decode()
            obj, end = _raw_decode(text)
        except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
            raise StreamError("malformed SSE line") from None
        if (end != len(text) and text[end:].strip()) or not isinstance(obj, dict):
            raise StreamError("malformed SSE line")
        if obj.get("error"):
            err = obj["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise StreamError(f"server error: {_short(str(message), 60)}")
        if self.generate:
            meta = obj.get("meta_info") or {}
            if meta.get("finish_reason"):
                self.finished = True
            completion = meta.get("completion_tokens")
            if obj.get("text"):
                self.text_seen = True
            if completion is None:  # a /generate without meta_info: one token per chunk with text
                if obj.get("text"):
                    self._chunk(now, 1)
                return
            self.output_len = completion
            if self.text_seen and completion > self.counted:
                self._chunk(now, completion - self.counted)
                self.counted = completion
            return
        usage = obj.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            self.output_len = usage["completion_tokens"]
        choices = obj.get("choices")
        if not choices:
            return
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finished = True
        if self.chat:
            delta = choice.get("delta") or {}
            content = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
        else:
            content = choice.get("text")
        if content:  # bench_serving appends one ITL per content chunk on the OpenAI endpoints
            self._chunk(now, 1)

    def _chunk(self, now: float, tokens: int) -> None:
        self.times.append(now)
        self.tokens.append(tokens)
        self.counters.tokens += tokens


async def send_request(
    client: HttpStreamClient,
    endpoint: str,
    body: bytes,
    *,
    prompt_len: int,
    timeout_s: float,
    counters: _Counters | None = None,
    queued_s: float = 0.0,
) -> tuple[RequestRecord, bool]:
    """Send one streaming request and read it to the end; returns its record and whether the server reported usage.

    Never raises for a failed request (the record carries the reason); cancellation propagates.
    """
    counters = counters if counters is not None else _Counters()
    sse = _SSE(endpoint, counters)
    counters.in_flight += 1
    start_s = time.perf_counter()  # as bench_serving stamps it: right before the request goes out
    try:
        outcome = await client.post(ENDPOINT_PATHS[endpoint], body, sse, timeout_s=timeout_s)
    finally:
        counters.in_flight -= 1
    error = outcome.error
    if outcome.cut:
        error = f"stream cut after {len(sse.times)} chunks"
    elif error is None:
        if outcome.content_type.startswith("application/json"):
            error = "not an event stream (Content-Type application/json)"
        else:
            try:
                sse.end()
            except StreamError as e:
                error = str(e)
            if error is None and not sse.done and not sse.finished:
                error = f"stream ended without [DONE] or a finish_reason after {len(sse.times)} chunks"
    usage_seen = sse.generate or sse.output_len is not None
    if error is None:
        counters.done += 1
        if not usage_seen:
            counters.no_usage += 1
    else:
        counters.failed += 1
    record = RequestRecord(
        start_s=start_s,
        prompt_len=prompt_len,
        chunk_times_s=sse.times,
        chunk_tokens=sse.tokens,
        output_len=sse.output_len,
        end_s=sse.last_line_s if error is None else outcome.end_s,
        error=redact(error) if error is not None else None,  # a server may echo a key back
        queued_s=queued_s,
    )
    return record, usage_seen


# ---------------------------------------------------------------------------------------------- self-check


@dataclass(slots=True)
class ClientCheck:
    """What the client did during one level, from its own records."""

    mean_in_flight: float
    max_in_flight: int
    backlog_in_flight: float | None  # mean in flight while some request had arrived but was not yet sent
    mean_dispatch_delay_ms: float
    max_dispatch_delay_ms: float
    backlog_s: float = 0.0  # how long some request was waiting inside the client
    span_s: float = 0.0  # the level, first send to last answer

    def unused_share(self, target: int) -> float:
        """Share of the concurrency x time asked for that went unused while requests were waiting to be sent."""
        if self.backlog_in_flight is None or target <= 0 or self.span_s <= 0:
            return 0.0
        return (target - self.backlog_in_flight) * self.backlog_s / (target * self.span_s)


def client_check(records: Sequence[RequestRecord], arrivals_s: Sequence[float]) -> ClientCheck:
    """In-flight requests over time (mean over the level, peak, and mean while requests waited), and dispatch delay."""
    events: list[tuple[float, int, int]] = []  # (time, change in flight, change waiting)
    for rec, arrived in zip(records, arrivals_s, strict=True):
        # A request counts as waiting once it is PENDING_GRACE_S past due: sending takes a moment, and
        # counting that moment would make every lone Poisson arrival look like a backlog.
        pending_from = arrived + PENDING_GRACE_S
        if rec.start_s > pending_from:
            events.append((pending_from, 0, 1))
            events.append((rec.start_s, 1, -1))
        else:
            events.append((rec.start_s, 1, 0))
        events.append((rec.finished_s(), -1, 0))
    if not records:
        return ClientCheck(0.0, 0, None, 0.0, 0.0)
    events.sort(key=lambda e: (e[0], e[1]))  # at equal times an end frees its slot before a start takes it
    t_first = min(r.start_s for r in records)
    t_last = max(r.finished_s() for r in records)
    in_flight = waiting = peak = 0
    area = backlog_area = backlog_time = 0.0
    prev = events[0][0]
    for t, d_flight, d_wait in events:
        dt = t - prev
        if dt > 0:
            if prev >= t_first:
                area += in_flight * dt
            if waiting > 0:
                backlog_area += in_flight * dt
                backlog_time += dt
        prev = t
        in_flight += d_flight
        waiting += d_wait
        peak = max(peak, in_flight)
    span = max(t_last - t_first, 1e-9)
    delays = np.fromiter((r.queued_s for r in records), dtype=np.float64, count=len(records))
    return ClientCheck(
        mean_in_flight=area / span,
        max_in_flight=peak,
        backlog_in_flight=backlog_area / backlog_time if backlog_time > 0 else None,
        mean_dispatch_delay_ms=float(delays.mean()) * 1000,
        max_dispatch_delay_ms=float(delays.max()) * 1000,
        backlog_s=backlog_time,
        span_s=span,
    )


def client_warnings(
    level: BenchLevel,
    check: ClientCheck,
    *,
    target: int,
    cpu_s: float,
    wall_s: float,
    loop_lag_p99_ms: float | None,
    no_usage: int,
) -> list[str]:
    """Plain sentences for each way the client fell short of the load it was asked to put on the server."""
    warnings = []
    unused = check.unused_share(target)
    if check.backlog_in_flight is not None and unused > 1 - SUSTAIN_SHARE:
        warnings.append(
            f"while requests were waiting to be sent ({check.backlog_s:,.2f} s of {check.span_s:,.2f} s), the client "
            f"held {check.backlog_in_flight:,.1f} of the {target} requests in flight asked for, leaving {unused:.0%} "
            "of the level's concurrency unused: the server saw less load than this level's label says"
        )
    elif check.backlog_in_flight is not None and check.max_in_flight < target:
        warnings.append(f"the client never had more than {check.max_in_flight} of {target} requests in flight")
    delay_limit_ms = max(DISPATCH_DELAY_MS, DISPATCH_DELAY_SHARE * level.mean_ttft_ms)
    if check.mean_dispatch_delay_ms > delay_limit_ms:
        warnings.append(
            f"requests waited {check.mean_dispatch_delay_ms:,.1f} ms on average (at most "
            f"{check.max_dispatch_delay_ms:,.1f} ms) inside the client before being sent, outside their TTFT"
        )
    lag_limit_ms = max(LOOP_LAG_MS, 0.05 * level.mean_itl_ms)
    if loop_lag_p99_ms is not None and loop_lag_p99_ms > lag_limit_ms:
        warnings.append(
            f"the client's event loop ran {loop_lag_p99_ms:,.1f} ms late at p99: chunk timestamps carry up to that "
            "much error"
        )
    if wall_s > 0 and cpu_s / wall_s > CPU_SHARE:
        warnings.append(
            f"the client used {cpu_s / wall_s:.0%} of a CPU core: it may have been the bottleneck, not the server"
        )
    if no_usage:
        warnings.append(
            f"the server reported no usage for {no_usage} requests: their output tokens were counted as chunks"
        )
    return warnings


class _LoopLag:
    """Samples how late the event loop wakes a sleeper: the error on every timestamp the client takes."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.samples = array("d")
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        perf_counter = time.perf_counter
        while True:
            t = perf_counter()
            await asyncio.sleep(self.interval_s)
            self.samples.append(perf_counter() - t - self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> float | None:
        """Stop sampling; the p99 lateness in ms, or None with too few samples."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if len(self.samples) < 10:
            return None
        return float(np.percentile(self.samples, 99)) * 1000


# ---------------------------------------------------------------------------------------------- the sweep


def _normalize_base_url(base_url: str) -> str:
    url = base_url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    try:
        parsed = URL(url)
    except ValueError as e:
        raise PivotError(f"bad base URL {base_url!r}: {e}", hint="write it like http://127.0.0.1:30000") from e
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise PivotError(f"bad base URL {base_url!r}", hint="write it like http://127.0.0.1:30000")
    return url


def _raise_open_files(needed: int) -> None:
    """Raise the soft limit on open files (as bench_serving does); fail clearly when the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = hard if hard == resource.RLIM_INFINITY else min(hard, max(needed, 65535))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            raise PivotError(
                f"concurrency needs about {needed} open files but this process may open only {soft}",
                hint="raise the limit (ulimit -n) or lower the concurrency",
            )


def check_open_files(max_concurrency: int) -> None:
    """Before anything is launched: raise PivotError when this process cannot open the sockets a level of
    `max_concurrency` needs (the limit is raised as far as the hard limit allows, as bench_serving does)."""
    _raise_open_files(max_concurrency + 256)


async def probe(base_url: str, *, connect_timeout_s: float = 5.0, headers: dict[str, str] | None = None) -> str | None:
    """Fail fast when nothing answers at base_url; the served model's name from `GET /v1/models`, if it has one."""
    timeout = aiohttp.ClientTimeout(total=max(10.0, connect_timeout_s * 2), sock_connect=connect_timeout_s)
    hint = "is the server running and listening there? check the scheme, host and port of --base-url"
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, headers=auth_headers() if headers is None else headers) as session,
            session.get(base_url + "/v1/models") as resp,
        ):
            if resp.status != 200:
                return None
            data = await resp.json(content_type=None)
            models = data.get("data") if isinstance(data, dict) else None
            if models and isinstance(models[0], dict) and models[0].get("id"):
                return str(models[0]["id"])
            return None
    except aiohttp.ClientConnectorError as e:
        reason = e.os_error.strerror if e.os_error and e.os_error.strerror else str(e)
        raise PivotError(f"cannot reach {base_url}: {reason}", hint=hint) from e
    except aiohttp.ConnectionTimeoutError as e:
        raise PivotError(f"cannot reach {base_url}: no answer within {connect_timeout_s:g} s", hint=hint) from e
    except aiohttp.InvalidURL as e:
        raise PivotError(f"bad base URL {base_url!r}", hint="write it like http://127.0.0.1:30000") from e
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None  # it answered the connection; /v1/models is optional


def auth_headers() -> dict[str, str]:
    """bench_serving's authentication: `Bearer $OPENAI_API_KEY`, else `$API_KEY` as it is, read from the environment."""
    if key := os.environ.get("OPENAI_API_KEY"):
        return {"Authorization": f"Bearer {key}"}
    if key := os.environ.get("API_KEY"):
        return {"Authorization": key}
    return {}


async def _accept_length(base_url: str, headers: dict[str, str]) -> float | None:
    """bench_serving's accept_length (speculative decoding) from SGLang's /server_info, when the server has it."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5), headers=headers) as session,
            session.get(base_url + "/server_info") as resp,
        ):
            if resp.status != 200:
                return None
            info = await resp.json(content_type=None)
        if isinstance(info, dict) and "decode" in info:
            info = info["decode"][0]
        states = info.get("internal_states") if isinstance(info, dict) else None
        value = states[0].get("avg_spec_accept_length") if states else None
        return float(value) if value is not None else None
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def append_jsonl(path: Path, level: BenchLevel) -> None:
    """Append one level as a JSON line with bench_serving's keys (and ours after them), as bench_serving appends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(level.model_dump()) + "\n")
    fault_point("raw-level-written")


def read_jsonl(path: Path) -> list[BenchLevel]:
    """Levels from a JSONL file written by pivot or by bench_serving."""
    levels = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            levels.append(BenchLevel.model_validate(json.loads(line)))
        except ValueError as e:
            raise PivotError(f"{path}:{n}: not a benchmark result line: {_short(str(e), 200)}") from e
    return levels


@dataclass
class _Sweep:
    """One sweep in progress; `result` always holds the levels finished so far."""

    base_url: str
    spec: BenchSpec
    backend: str
    model: str | None
    on_progress: Callable[[LevelProgress], None] | None
    output_file: Path | None
    vocab_size: int
    warmup_pause_s: float
    headers: dict[str, str] | None = None  # None: bench_serving's (auth_headers); {} sends no Authorization
    result: BenchResult = field(init=False)
    _warmup_warnings: list[str] = field(default_factory=list, init=False)
    auth: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.result = BenchResult(
            spec=self.spec,
            engine=self.backend,
            source="measured",
            raw_path=str(self.output_file) if self.output_file is not None else None,
        )

    def _report(self, progress: LevelProgress) -> None:
        if self.on_progress is not None:
            self.on_progress(progress)

    async def run(self) -> BenchResult:
        self.base_url = _normalize_base_url(self.base_url)
        _raise_open_files(max(self.spec.concurrency) + 256)
        self.auth = auth_headers() if self.headers is None else dict(self.headers)
        served = await probe(self.base_url, headers=self.auth)
        if self.model is None and self.spec.endpoint != "generate":
            self.model = served
        try:
            for index, concurrency in enumerate(self.spec.concurrency):
                level = await self._level(index, concurrency)
                self.result.levels.append(level)
                if self.output_file is not None:
                    append_jsonl(self.output_file, level)
        except (asyncio.CancelledError, KeyboardInterrupt):
            self.result.interrupted = True
        self.result.finished_at = utcnow()
        return self.result

    async def _level(self, index: int, concurrency: int) -> BenchLevel:
        spec = self.spec
        n = spec.prompts_for(concurrency)
        workload = sample_workload(spec, n, vocab_size=self.vocab_size)
        use_ids = spec.dataset_name == "random-ids" and spec.endpoint != "chat"

        def body(i: int, output_len: int | None = None) -> bytes:
            prompt = workload.ids(i) if use_ids else workload.text(i)
            out = int(workload.output_lens[i]) if output_len is None else output_len
            return request_body(spec.endpoint, prompt, out, ignore_eos=spec.ignore_eos, model=self.model)

        base = dict(
            level_index=index,
            levels_total=len(spec.concurrency),
            max_concurrency=concurrency,
            requests_total=n,
        )
        timeout_s = spec.request_timeout_s
        client = HttpStreamClient(self.base_url, headers=self.auth)
        try:
            if spec.warmup_requests:
                self._report(LevelProgress(phase="warmup", **base))
                warmup_len = min(int(workload.output_lens[0]), WARMUP_OUTPUT_LEN)
                await self._warmup(client, body(0, warmup_len), index)
                await asyncio.sleep(self.warmup_pause_s)
            workers = min(concurrency, n)
            # Bodies are built before the clock starts: all of them when they fit in PREBUILD_BYTES, else the first wave.
            prebuilt = n if int(workload.input_lens.sum()) * 8 <= PREBUILD_BYTES else workers
            ready = {i: body(i) for i in range(prebuilt)}
            await client.open(workers, timeout_s=min(timeout_s, 30.0))  # and its connections opened
            counters = _Counters()
            records: list[RequestRecord | None] = [None] * n
            next_index = 0
            lag = _LoopLag()
            cpu0, t0 = time.process_time(), time.perf_counter()

            async def worker() -> None:
                nonlocal next_index
                slot_free = t0
                while next_index < n:
                    i = next_index
                    next_index += 1
                    due = t0 + float(workload.arrivals_s[i])
                    wait = due - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    eligible = max(due, slot_free)
                    data = ready.pop(i, None) or body(i)
                    record, _ = await send_request(
                        client,
                        spec.endpoint,
                        data,
                        prompt_len=int(workload.input_lens[i]),
                        timeout_s=timeout_s,
                        counters=counters,
                        queued_s=time.perf_counter() - eligible,
                    )
                    records[i] = record
                    slot_free = record.finished_s()  # the slot was free from the answer's end, not from our wakeup

            async def reporter() -> None:
                last_t, last_tokens = t0, 0
                while True:
                    await asyncio.sleep(PROGRESS_INTERVAL_S)
                    now = time.perf_counter()
                    rate = (counters.tokens - last_tokens) / max(now - last_t, 1e-9)
                    last_t, last_tokens = now, counters.tokens
                    self._report(
                        LevelProgress(
                            phase="running",
                            requests_done=counters.done + counters.failed,
                            requests_failed=counters.failed,
                            in_flight=counters.in_flight,
                            output_tokens=counters.tokens,
                            elapsed_s=now - t0,
                            output_tok_s=rate,
                            **base,
                        )
                    )

            self._report(LevelProgress(phase="running", **base))
            lag.start()
            report_task = asyncio.create_task(reporter())
            tasks: list[asyncio.Task[None]] = []
            try:
                for first in range(0, workers, DISPATCH_BATCH):
                    tasks += [asyncio.create_task(worker()) for _ in range(min(DISPATCH_BATCH, workers - first))]
                    await asyncio.sleep(0)  # between batches of first sends, read the answers already arriving
                await asyncio.gather(*tasks)
            finally:
                for task in (*tasks, report_task):
                    task.cancel()
                await asyncio.gather(*tasks, report_task, return_exceptions=True)
                lag_p99_ms = await lag.stop()
            wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
        finally:
            client.close()
        accept_length = await _accept_length(self.base_url, self.auth) if self.backend == "sglang" else None

        done = [r for r in records if r is not None]
        arrived = [t0 + float(a) for a, r in zip(workload.arrivals_s, records, strict=True) if r is not None]
        level = compute_level(
            done,
            max_concurrency=concurrency,
            request_rate=spec.request_rate,
            backend=self.backend + _BACKEND_SUFFIX[spec.endpoint],
            dataset_name=spec.dataset_name,
            random_input_len=spec.random_input_len,
            random_output_len=spec.random_output_len,
            random_range_ratio=spec.random_range_ratio,
        )
        check = client_check(done, arrived)
        warnings = client_warnings(
            level,
            check,
            target=min(concurrency, n),
            cpu_s=cpu_s,
            wall_s=wall_s,
            loop_lag_p99_ms=lag_p99_ms,
            no_usage=counters.no_usage,
        )
        level = level.model_copy(
            update={
                "accept_length": accept_length,
                "mean_in_flight": check.mean_in_flight,
                "max_in_flight": check.max_in_flight,
                "mean_dispatch_delay_ms": check.mean_dispatch_delay_ms,
                "max_dispatch_delay_ms": check.max_dispatch_delay_ms,
                "client_cpu_s": cpu_s,
                "warnings": [*level.warnings, *self._warmup_warnings, *warnings],
            }
        )
        self._report(
            LevelProgress(
                phase="done",
                requests_done=n,
                requests_failed=level.failed,
                output_tokens=level.total_output_tokens,
                elapsed_s=wall_s,
                output_tok_s=level.output_throughput,
                level=level,
                **base,
            )
        )
        return level

    async def _warmup(self, client: HttpStreamClient, data: bytes, index: int) -> None:
        """bench_serving's warmup: the first prompt (at most 32 output tokens), warmup_requests times at once."""
        spec = self.spec
        outcomes = await asyncio.gather(
            *(
                send_request(client, spec.endpoint, data, prompt_len=0, timeout_s=spec.request_timeout_s)
                for _ in range(spec.warmup_requests)
            )
        )
        errors = [record.error for record, _ in outcomes if record.error is not None]
        self._warmup_warnings = []
        if len(errors) < len(outcomes):
            return
        if index == 0:  # nothing has worked yet: most likely a wrong endpoint or a wrong workload
            raise PivotError(
                f"warmup failed: every warmup request to {self.base_url}{ENDPOINT_PATHS[spec.endpoint]} failed "
                f"({errors[0]})",
                hint=(
                    "check --endpoint (generate is SGLang's native API; completions and chat are the OpenAI ones) "
                    "and that the server accepts this workload"
                ),
            )
        self._warmup_warnings = [f"every warmup request failed ({errors[0]})"]


async def run_sweep(
    base_url: str,
    spec: BenchSpec,
    *,
    backend: str = "sglang",
    model: str | None = None,
    on_progress: Callable[[LevelProgress], None] | None = None,
    output_file: Path | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    warmup_pause_s: float = 1.0,
    headers: dict[str, str] | None = None,
) -> BenchResult:
    """Run `spec`'s concurrency levels one after another against base_url: one BenchLevel each, source "measured".

    Raises PivotError before any load when base_url does not answer, or when every warmup request of
    the first level fails. Failed requests are counted in their level, never raised. When cancelled
    (Ctrl-C), stops at once and returns the levels already finished with `interrupted=True`; each
    finished level is appended to `output_file` (JSONL, bench_serving's keys) as soon as it is done.
    `model` names the model in OpenAI requests (default: the first of `GET /v1/models`, if any);
    `vocab_size` bounds random token ids; `warmup_pause_s` is the pause after warmup (bench_serving: 1 s).
    `headers` go with every request; None sends bench_serving's Authorization (auth_headers: $OPENAI_API_KEY,
    else $API_KEY), which `pivot bench` keeps; an engine's deployment passes its own (none unless opted in).
    """
    sweep = _Sweep(base_url, spec, backend, model, on_progress, output_file, vocab_size, warmup_pause_s, headers)
    return await sweep.run()


def benchmark(base_url: str, spec: BenchSpec, **kw: Any) -> BenchResult:
    """`run_sweep` from synchronous code; Ctrl-C returns the finished levels with `interrupted=True`."""
    sweep = _Sweep(
        base_url,
        spec,
        kw.pop("backend", "sglang"),
        kw.pop("model", None),
        kw.pop("on_progress", None),
        kw.pop("output_file", None),
        kw.pop("vocab_size", DEFAULT_VOCAB_SIZE),
        kw.pop("warmup_pause_s", 1.0),
    )
    if kw:
        raise TypeError(f"benchmark() got unexpected keyword arguments: {', '.join(kw)}")
    try:
        return asyncio.run(sweep.run())
    except KeyboardInterrupt:  # a second Ctrl-C, or one that arrived outside the event loop
        sweep.result.interrupted = True
        sweep.result.finished_at = utcnow()
        return sweep.result


# ---------------------------------------------------------------------------------------------- --via sglang


def sglang_argv(
    base_url: str,
    spec: BenchSpec,
    concurrency: int,
    output_file: Path,
    *,
    python: str = sys.executable,
    model: str | None = None,
    tokenizer: str | None = None,
) -> list[str]:
    """The `python -m sglang.benchmark.serving` command line for one level of `spec`."""
    backend = {"generate": "sglang", "completions": "sglang-oai", "chat": "sglang-oai-chat"}[spec.endpoint]
    argv = [
        python,
        "-m",
        "sglang.benchmark.serving",
        "--backend",
        backend,
        "--base-url",
        _normalize_base_url(base_url),
        # bench_serving's "random" samples ShareGPT text (a download); random-ids is its download-free twin
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        str(spec.random_input_len),
        "--random-output-len",
        str(spec.random_output_len),
        "--random-range-ratio",
        repr(spec.random_range_ratio),
        "--num-prompts",
        str(spec.prompts_for(concurrency)),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf" if math.isinf(spec.request_rate) else repr(spec.request_rate),
        "--seed",
        str(spec.seed),
        "--warmup-requests",
        str(spec.warmup_requests),
        "--output-file",
        str(output_file),
        "--disable-tqdm",
    ]
    if spec.endpoint == "generate" and spec.dataset_name == "random-ids":
        argv.append("--tokenize-prompt")  # send input_ids, as pivot does, instead of decoded text
    if not spec.ignore_eos:
        argv.append("--disable-ignore-eos")
    if model:
        argv += ["--model", model]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    return argv


def has_sglang_benchmark(python: str = sys.executable) -> bool:
    """Whether `python` can import SGLang's benchmark module."""
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('sglang.benchmark.serving') else 1)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def reference_sweep(
    base_url: str,
    spec: BenchSpec,
    *,
    python: str = sys.executable,
    model: str | None = None,
    tokenizer: str | None = None,
    output_file: Path | None = None,
    on_progress: Callable[[LevelProgress], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> BenchResult:
    """The same sweep run by SGLang's own benchmark module, one process per level; its JSONL read back.

    Raises PivotError when `python` has no SGLang or a level's process fails. Ctrl-C stops the
    running level and returns the finished ones with `interrupted=True`. Each level's client_cpu_s
    is its whole bench_serving process (start-up and imports included).
    """
    if not has_sglang_benchmark(python):
        raise PivotError(
            f"SGLang's benchmark module (sglang.benchmark.serving) is not installed for {python}",
            hint="install sglang (pip install 'pivot[sglang]'), or name an interpreter that has it with --sglang-python",
        )
    result = BenchResult(
        spec=spec, engine="sglang", source="measured", raw_path=str(output_file) if output_file else None
    )
    with tempfile.TemporaryDirectory(prefix="pivot-bench-") as tmp:
        target = output_file if output_file is not None else Path(tmp) / "bench_serving.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        for index, concurrency in enumerate(spec.concurrency):
            base = dict(
                level_index=index,
                levels_total=len(spec.concurrency),
                max_concurrency=concurrency,
                requests_total=spec.prompts_for(concurrency),
            )
            if on_progress:
                on_progress(LevelProgress(phase="running", **base))
            before = len(read_jsonl(target)) if target.exists() else 0
            argv = sglang_argv(base_url, spec, concurrency, target, python=python, model=model, tokenizer=tokenizer)
            cpu0 = os.times()
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                assert proc.stdout is not None
                lines = []
                for line in proc.stdout:
                    lines.append(line.rstrip("\n"))
                    if log:
                        log(line.rstrip("\n"))
                code = proc.wait()
            except KeyboardInterrupt:
                with contextlib.suppress(Exception):
                    proc.terminate()
                    proc.wait(timeout=10)
                result.interrupted = True
                break
            cpu1 = os.times()
            levels = read_jsonl(target) if target.exists() else []
            if code != 0 or len(levels) <= before:
                tail = "\n".join(lines[-15:])
                raise PivotError(
                    f"sglang.benchmark.serving failed at concurrency {concurrency} (exit {code})",
                    hint=f"its last lines:\n{tail}",
                )
            level = levels[-1].model_copy(
                update={
                    "client_cpu_s": (cpu1.children_user + cpu1.children_system)
                    - (cpu0.children_user + cpu0.children_system)
                }
            )
            result.levels.append(level)
            if on_progress:
                on_progress(LevelProgress(phase="done", requests_done=level.completed, level=level, **base))
    result.finished_at = utcnow()
    return result
