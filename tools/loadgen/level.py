"""One concurrency level of a sweep: warmup, the load on its schedule, progress, the measured `BenchLevel`."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from agent.errors import RequestsRefused
from agent.models import BenchLevel, BenchResult, BenchSpec, utcnow
from tools.httpstream import HttpStreamClient
from tools.loadgen.check import _LoopLag, client_check, client_warnings
from tools.loadgen.connect import _accept_length, _normalize_base_url, _raise_open_files, auth_headers, probe
from tools.loadgen.output import append_jsonl
from tools.loadgen.stream import _Counters, send_request
from tools.loadgen.workload import (
    _BACKEND_SUFFIX,
    ENDPOINT_PATHS,
    WARMUP_OUTPUT_LEN,
    Workload,
    request_body,
    sample_workload,
)
from tools.metrics import DEFAULT_VOCAB_SIZE, RequestRecord, compute_level

# how servers word a prompt id beyond their vocabulary (vLLM: "Token id 11465 is out of vocabulary")
_VOCAB_ERROR = re.compile(r"out of vocabulary|token id[s]? .*(out of range|exceed|invalid)|vocab", re.IGNORECASE)
PROGRESS_INTERVAL_S = 0.5
DISPATCH_BATCH = 32  # workers started per event-loop turn at the start of a level
PREBUILD_BYTES = 256 * 2**20  # request bodies built ahead of a level, at most (about 8 bytes per prompt token)


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


@dataclass(slots=True)
class _LevelLoad:
    """What a level's load left: one record per request sent (None if never sent), and the client's own numbers."""

    records: list[RequestRecord | None]
    counters: _Counters
    t0: float
    wall_s: float
    cpu_s: float
    lag_p99_ms: float | None


@dataclass
class _Sweep:
    """One sweep in progress; `result` always holds the levels finished so far."""

    base_url: str
    spec: BenchSpec
    backend: str
    model: str | None
    on_progress: Callable[[LevelProgress], None] | None
    output_file: Path | None
    vocab_size: int | None  # None: the served model's, read from its files when this host has them, else the default
    warmup_pause_s: float
    headers: dict[str, str] | None = None  # None: bench_serving's (auth_headers); {} sends no Authorization
    # the first level this server is measured at: its warmup failing whole means a wrong endpoint or workload (the
    # sweep is refused); a later level's (a deployment sweeping one level at a time) only warns, its level counts it
    first_level: bool = True
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
        if self.vocab_size is None:  # /v1/models names a local folder (or a hub id cached here): its vocabulary
            from tools.profiles.generated import model_vocab_size

            name = self.model or served
            self.vocab_size = (model_vocab_size(name) if name else None) or DEFAULT_VOCAB_SIZE
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
        client = HttpStreamClient(self.base_url, headers=self.auth)
        try:
            if spec.warmup_requests:
                self._report(LevelProgress(phase="warmup", **base))
                warmup_len = min(int(workload.output_lens[0]), WARMUP_OUTPUT_LEN)
                await self._warmup(client, body(0, warmup_len), index)
                await asyncio.sleep(self.warmup_pause_s)
            load = await self._load(client, workload, body, min(concurrency, n), base)
        finally:
            client.close()
        accept_length = await _accept_length(self.base_url, self.auth) if self.backend == "sglang" else None
        level = self._measured_level(load, workload, concurrency, accept_length)
        self._report(
            LevelProgress(
                phase="done",
                requests_done=n,
                requests_failed=level.failed,
                output_tokens=level.total_output_tokens,
                elapsed_s=load.wall_s,
                output_tok_s=level.output_throughput,
                level=level,
                **base,
            )
        )
        return level

    async def _load(
        self,
        client: HttpStreamClient,
        workload: Workload,
        body: Callable[[int], bytes],
        workers: int,
        base: dict[str, int],
    ) -> _LevelLoad:
        """The level's requests, sent by `workers` workers on the workload's schedule, with progress reports."""
        spec = self.spec
        n = base["requests_total"]
        timeout_s = spec.request_timeout_s
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
        return _LevelLoad(records, counters, t0, wall_s, cpu_s, lag_p99_ms)

    def _measured_level(
        self, load: _LevelLoad, workload: Workload, concurrency: int, accept_length: float | None
    ) -> BenchLevel:
        """bench_serving's metrics of the level's requests, with what the client itself did and its warnings."""
        spec = self.spec
        records = load.records
        done = [r for r in records if r is not None]
        arrived = [load.t0 + float(a) for a, r in zip(workload.arrivals_s, records, strict=True) if r is not None]
        level = compute_level(
            done,
            max_concurrency=concurrency,
            request_rate=spec.request_rate,
            backend=self.backend + _BACKEND_SUFFIX[spec.endpoint],
            dataset_name=spec.dataset_name,
            random_input_len=spec.random_input_len,
            random_output_len=spec.random_output_len,
            random_range_ratio=spec.random_range_ratio,
            goodput_slos_ms=spec.goodput_slos_ms,
        )
        check = client_check(done, arrived)
        warnings = client_warnings(
            level,
            check,
            target=min(concurrency, len(records)),
            cpu_s=load.cpu_s,
            wall_s=load.wall_s,
            loop_lag_p99_ms=load.lag_p99_ms,
            no_usage=load.counters.no_usage,
        )
        return level.model_copy(
            update={
                "accept_length": accept_length,
                "mean_in_flight": check.mean_in_flight,
                "max_in_flight": check.max_in_flight,
                "mean_dispatch_delay_ms": check.mean_dispatch_delay_ms,
                "max_dispatch_delay_ms": check.max_dispatch_delay_ms,
                "client_cpu_s": load.cpu_s,
                "warnings": [*level.warnings, *self._warmup_warnings, *warnings],
            }
        )

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
        if index == 0 and self.first_level:  # nothing has worked yet: most likely a wrong endpoint or workload
            hint = warmup_hint(spec.endpoint, spec.dataset_name, errors[0], self.vocab_size)
            if _VOCAB_ERROR.search(errors[0]):
                hint = (
                    f"the prompts' token ids are drawn below {self.vocab_size:,}, more than the served model knows: "
                    "set vocab_size in the plan's [workload] (pivot bench: --vocab-size) to the model's vocabulary, "
                    "or serve it from a directory pivot can read (its config.json and tokenizer.json say it)"
                )
            raise RequestsRefused(
                f"warmup failed: every warmup request to {self.base_url}{ENDPOINT_PATHS[spec.endpoint]} failed "
                f"({errors[0]})",
                hint=hint,
                detail=errors[0],
            )
        self._warmup_warnings = [f"every warmup request failed ({errors[0]})"]


_VOCAB_WORDS = ("vocab", "token id", "out of range", "index out of", "input_ids")


def warmup_hint(endpoint: str, dataset: str, error: str, vocab_size: int) -> str:
    """What to check when every warmup request failed: the endpoint, and for random token ids the vocabulary they
    are drawn from (`--vocab-size`, first when the server's error speaks of token ids)."""
    endpoint_hint = "--endpoint (generate is SGLang's native API; completions and chat are the OpenAI ones)"
    if endpoint == "chat" or dataset != "random-ids":
        return f"check {endpoint_hint} and that the server accepts this workload"
    vocab_hint = (
        f"--vocab-size (the random token ids are drawn below {vocab_size:,}; give the model's vocabulary size, "
        "`vocab_size` in its config.json, so every id is one the model knows)"
    )
    if any(w in error.lower() for w in _VOCAB_WORDS):
        return f"check {vocab_hint}, then {endpoint_hint}"
    return f"check {endpoint_hint} and {vocab_hint}"
