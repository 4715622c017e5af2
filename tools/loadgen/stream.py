"""One streamed request: sent on a pooled connection, its SSE answer read the way bench_serving reads it."""

from __future__ import annotations

import json
import time
from array import array

from agent.errors import redact
from tools.httpstream import HttpStreamClient, StreamError
from tools.loadgen.workload import ENDPOINT_PATHS
from tools.metrics import RequestRecord

# ---------------------------------------------------------------------------------------------- one request


class _Counters:
    """Live numbers of the level running now, read by the progress reporter."""

    __slots__ = ("done", "failed", "in_flight", "no_usage", "tokens")

    def __init__(self) -> None:
        self.done = self.failed = self.in_flight = self.tokens = self.no_usage = 0


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


MAX_SSE_LINE_BYTES = 16 * 2**20  # a /generate line carries the whole text so far: 16 MiB is millions of tokens


MAX_COUNT = 2**31 - 1  # no request streams more tokens; a larger "count" (10**30) is a broken or hostile server


def _count(value: object) -> bool:
    """Whether a token count from the server is one: a whole number from 0 to MAX_COUNT (JSON true is no count)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


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
        if b"\n" not in data:  # a line still arriving: appended in place (a copy per read would be quadratic)
            if self.rest:
                self.rest += data
            else:
                self.rest = bytearray(data)
            if len(self.rest) > MAX_SSE_LINE_BYTES:
                raise StreamError(f"an SSE line longer than {MAX_SSE_LINE_BYTES // 2**20} MiB without a newline")
            return
        if self.rest:
            data = bytes(self.rest) + data  # once per line, not per read
        lines = data.split(b"\n")
        last = lines.pop()
        self.rest = bytearray(last) if last else b""
        if len(last) > MAX_SSE_LINE_BYTES:
            raise StreamError(f"an SSE line longer than {MAX_SSE_LINE_BYTES // 2**20} MiB without a newline")
        for line in lines:
            if line and line != b"\r":  # half the lines are the blank ones between events
                self._line(line, now)

    def end(self) -> None:
        """The answer is complete: a last line without its newline still counts."""
        if self.rest.strip():
            line, self.rest = bytes(self.rest), b""
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
        except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError, and JSON nested past the stack
            raise StreamError("malformed SSE line") from None
        if (end != len(text) and text[end:].strip()) or not isinstance(obj, dict):
            raise StreamError("malformed SSE line")
        if obj.get("error"):
            err = obj["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise StreamError(f"server error: {_short(str(message), 60)}")
        if self.generate:
            meta = obj.get("meta_info") or {}
            if not isinstance(meta, dict):
                raise StreamError("malformed SSE line: meta_info is not an object")
            if meta.get("finish_reason"):
                self.finished = True
            completion = meta.get("completion_tokens")
            if completion is not None and not _count(completion):
                raise StreamError("malformed SSE line: meta_info.completion_tokens is not a count")
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
        if usage is not None and not isinstance(usage, dict):
            raise StreamError("malformed SSE line: usage is not an object")
        if usage and usage.get("completion_tokens") is not None:
            if not _count(usage["completion_tokens"]):
                raise StreamError("malformed SSE line: usage.completion_tokens is not a count")
            self.output_len = usage["completion_tokens"]
        choices = obj.get("choices")
        if not choices:
            return
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise StreamError("malformed SSE line: choices is not a list of objects")
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finished = True
        if self.chat:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise StreamError("malformed SSE line: delta is not an object")
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
