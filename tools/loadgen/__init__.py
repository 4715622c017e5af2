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

from tools.httpstream import StreamError
from tools.loadgen.check import (
    CPU_SHARE,
    DISPATCH_DELAY_MS,
    DISPATCH_DELAY_SHARE,
    LOOP_LAG_MS,
    PENDING_GRACE_S,
    SUSTAIN_SHARE,
    ClientCheck,
    client_check,
    client_warnings,
)
from tools.loadgen.connect import (
    auth_headers,
    check_open_files,
    probe,
)
from tools.loadgen.level import DISPATCH_BATCH, PREBUILD_BYTES, PROGRESS_INTERVAL_S, LevelProgress
from tools.loadgen.output import append_jsonl, read_jsonl
from tools.loadgen.reference import has_sglang_benchmark, reference_sweep, sglang_argv
from tools.loadgen.stream import _SSE, _Counters, send_request
from tools.loadgen.sweep import benchmark, run_sweep
from tools.loadgen.workload import (
    ENDPOINT_PATHS,
    WARMUP_OUTPUT_LEN,
    WORDS,
    Workload,
    request_body,
    sample_workload,
)

__all__ = [
    "CPU_SHARE",
    "DISPATCH_BATCH",
    "DISPATCH_DELAY_MS",
    "DISPATCH_DELAY_SHARE",
    "ENDPOINT_PATHS",
    "LOOP_LAG_MS",
    "PENDING_GRACE_S",
    "PREBUILD_BYTES",
    "PROGRESS_INTERVAL_S",
    "SUSTAIN_SHARE",
    "WARMUP_OUTPUT_LEN",
    "WORDS",
    "_SSE",
    "ClientCheck",
    "LevelProgress",
    "StreamError",
    "Workload",
    "_Counters",
    "append_jsonl",
    "auth_headers",
    "benchmark",
    "check_open_files",
    "client_check",
    "client_warnings",
    "has_sglang_benchmark",
    "probe",
    "read_jsonl",
    "reference_sweep",
    "request_body",
    "run_sweep",
    "sample_workload",
    "send_request",
    "sglang_argv",
]
