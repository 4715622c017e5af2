"""A sweep of concurrency levels, from async code (`run_sweep`) or synchronous code (`benchmark`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.models import BenchResult, BenchSpec, utcnow
from tools.loadgen.level import LevelProgress, _Sweep
from tools.metrics import DEFAULT_VOCAB_SIZE


async def run_sweep(
    base_url: str,
    spec: BenchSpec,
    *,
    backend: str = "sglang",
    model: str | None = None,
    on_progress: Callable[[LevelProgress], None] | None = None,
    output_file: Path | None = None,
    vocab_size: int | None = DEFAULT_VOCAB_SIZE,
    warmup_pause_s: float = 1.0,
    headers: dict[str, str] | None = None,
    first_level: bool = True,
) -> BenchResult:
    """Run `spec`'s concurrency levels one after another against base_url: one BenchLevel each, source "measured".

    Raises PivotError before any load when base_url does not answer, or when every warmup request of
    the first level fails (`first_level` false: the caller measured this server at an earlier level, so a failed
    warmup is the level's, counted as its failures, not a wrong endpoint). Failed requests are counted in their level, never raised. When cancelled
    (Ctrl-C), stops at once and returns the levels already finished with `interrupted=True`; each
    finished level is appended to `output_file` (JSONL, bench_serving's keys) as soon as it is done.
    `model` names the model in OpenAI requests (default: the first of `GET /v1/models`, if any);
    `vocab_size` bounds random token ids (None: the served model's vocabulary when `model`, or the name
    `/v1/models` gives, is a folder or a hub id this host has the files of; else DEFAULT_VOCAB_SIZE); `warmup_pause_s` is the pause after warmup (bench_serving: 1 s).
    `headers` go with every request; None sends bench_serving's Authorization (auth_headers: $OPENAI_API_KEY,
    else $API_KEY), which `pivot bench` keeps; an engine's deployment passes its own (none unless opted in).
    """
    sweep = _Sweep(base_url, spec, backend, model, on_progress, output_file, vocab_size, warmup_pause_s, headers,
                   first_level)  # fmt: skip
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
