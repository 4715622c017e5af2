"""`pivot sim serve`: the twin behind SGLang's HTTP endpoints, token timing on the wall clock sped up by --time-scale.

One process, one asyncio loop: an aiohttp app takes requests and an engine task runs the twin's
continuous-batching scheduler (`EngineCore`) step by step, sleeping each step's simulated duration
divided by the time scale, then handing the step's tokens to the open streams. What the server
reports about itself (log lines, /metrics, /server_info, /stop_profile, /sim/telemetry) is in
simulated seconds, as SGLang on those GPUs would report it; what a client measures on the wall
clock is faster by `time_scale` (server_info says how much). When the host cannot keep up with the
scale, the simulated clock waits for it (`internal_states[0].wall_lag_s` says how much it lost).

Endpoints (SGLang 0.5.23's, see the facts): /health and /health_generate (503 while starting),
/server_info, /model_info, /v1/models, /metrics (with --enable-metrics), /start_profile and
/stop_profile (the step-time breakdown by component), /generate, /v1/completions and
/v1/chat/completions (streaming and not), /flush_cache, and /sim/telemetry (simulated GPU telemetry,
pivot's Telemetry model, since NVML does not exist here). Generated text is " tok" per token; the
twin does not model EOS, so every request generates its max_new_tokens.

Failures as SGLang shows them: refused flags print argparse's message and exit 2; a startup fault
(out of memory, an invalid combination) logs SGLang's line and exits 1; a fault under load logs the
crash, cuts every open stream and exits 1. SIGTERM and SIGINT stop the server and exit 0.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agent import models as m
from agent.errors import PivotError
from tools.engines.sim.scheduler import EngineCore, Req, Step
from tools.engines.sim.twin import Twin, TwinStartupError

SGLANG_VERSION = "0.5.23"
VERSION = f"{SGLANG_VERSION} (pivot twin)"
READY_LINE = "The server is fired up and ready to roll!"
TOKEN_TEXT = " tok"  # what every generated token decodes to
TOKEN_ID = 1000  # and its id
CHARS_PER_TOKEN = 4  # prompt text is "tokenized" as one token per 4 characters
DEFAULT_MAX_NEW_TOKENS = {"generate": 128, "completions": 16, "chat": 128}  # SGLang's, and 128 for chat (no EOS)
LOG_LINES_PER_S = 4.0  # per kind of step line, so a fast twin does not drown its log
WALL_LAG_TOLERANCE_S = 0.025  # behind the wall clock by more than this, the simulated clock waits
TELEMETRY_WINDOW_S = 1.0  # simulated seconds averaged by /sim/telemetry (NVML's power reading is a ~1 s average)
SHUTDOWN_TIMEOUT_S = 1.0

# SGLang's histogram buckets (seconds).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
               0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)  # fmt: skip
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800)

http_log = logging.getLogger("pivot.sim.http_server")
sched_log = logging.LoggerAdapter(logging.getLogger("pivot.sim.scheduler"), {"rank": " TP0"})


@dataclass(frozen=True)
class ServeOptions:
    """The twin's own knobs (SGLang's flags go to the catalog)."""

    time_scale: float = 1.0  # simulated seconds per wall-clock second
    startup_s: float = 2.0  # wall seconds of "loading" during which /health answers 503
    noise: float = 0.0  # run-to-run variation of step times (0.02 = about 2%)
    seed: int = 0


@dataclass(eq=False)
class Stream:
    """One request in flight: how many tokens the engine gave it, and the handler waiting for them."""

    rid: str
    req: Req
    endpoint: str  # generate | completions | chat
    max_new_tokens: int
    request: web.Request
    arrived_s: float  # simulated
    tokens: int = 0
    done: bool = False
    gone: bool = False  # the client left; the engine finishes it silently
    first_s: float | None = None
    last_s: float = 0.0
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def prompt_tokens(self) -> int:
        return self.req.input_len


class BadRequest(Exception):
    """A request SGLang would answer with 400."""


# ---------------------------------------------------------------------------------------------- metrics


class Histogram:
    """A Prometheus histogram kept as plain counts, so the engine can observe a step's tokens at once."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n

    def buckets(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out


class TwinCollector:
    """SGLang's metric names, read from the server's state at scrape time."""

    def __init__(self, server: TwinServer) -> None:
        self.server = server

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s = self.server
        labels, values = ["model_name"], [s.served_model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        def histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
            f = HistogramMetricFamily(name, doc, labels=labels)
            f.add_metric(values, h.buckets(), h.sum)
            return f

        core = s.core
        yield gauge("sglang:num_running_reqs", "The number of running requests.", len(core.running))
        yield gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", len(core.waiting))
        yield gauge("sglang:num_used_tokens", "The number of used tokens.", core.used_slots())
        yield gauge("sglang:token_usage", "The token usage.", core.token_usage())
        yield gauge("sglang:gen_throughput", "The generation throughput (token/s).", s.last_gen_throughput)
        yield gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", 0.0)
        yield gauge("sglang:max_total_num_tokens", "The KV pool size in tokens.", s.twin.limits.kv_capacity_tokens)
        yield gauge("sglang:max_running_requests", "The cap on running requests.", s.twin.limits.max_running_requests)
        yield counter("sglang:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total)
        yield counter("sglang:generation_tokens", "Number of generation tokens processed.", s.generation_tokens_total)
        yield counter("sglang:num_requests", "Number of requests processed.", s.requests_total)
        yield counter("sglang:num_aborted_requests", "Number of requests aborted.", s.aborted_total)
        yield histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft)
        yield histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl)
        yield histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                        s.e2e)  # fmt: skip


# ---------------------------------------------------------------------------------------------- profile


@dataclass
class ProfileWindow:
    """A /start_profile ... /stop_profile window: the engine's counters when it opened (and closed)."""

    start: dict[str, Any]
    num_steps: int | None = None
    end: dict[str, Any] | None = None


# ---------------------------------------------------------------------------------------------- the server


class TwinServer:
    """The twin served over HTTP: an aiohttp app plus the engine task that times tokens on the wall clock."""

    def __init__(self, twin: Twin, options: ServeOptions) -> None:
        if options.time_scale <= 0:
            raise PivotError("--time-scale must be > 0")
        self.twin, self.options = twin, options
        self.scale = float(options.time_scale)
        fault = twin.load_faults[0] if twin.load_faults else None
        self.core = EngineCore(twin.cost, twin.limits, noise=options.noise, seed=options.seed, fault=fault)
        self.args = twin.args
        resolved = resolved_args(twin)
        self.model_path, self.served_model_name = str(resolved["model_path"]), str(resolved["served_model_name"])
        self.decode_log_interval = max(int(twin.args.get("decode_log_interval") or 40), 1)
        self.enable_metrics = bool(twin.args.get("enable_metrics"))
        self.streams: dict[int, Stream] = {}
        self.status = "Starting"  # Starting | Up | Crashed | Stopping
        self.exit_code = 0
        self._next_rid = 0
        self._work = asyncio.Event()
        self._stop = asyncio.Event()
        self._engine_task: asyncio.Task[None] | None = None
        self._created = int(time.time())
        # the simulated clock: sim = sim_base + (wall - wall_base) * scale, rebased when the host falls behind
        self._sim_base = 0.0
        self._wall_base: float | None = None
        self._clock = 0.0  # simulated end of the last step
        self._busy = False
        self.wall_lag_s = 0.0
        # counters
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.aborted_total = 0
        self.ttft, self.itl, self.e2e = Histogram(TTFT_BUCKETS), Histogram(ITL_BUCKETS), Histogram(E2E_BUCKETS)
        self.last_gen_throughput = 0.0
        self._tp_window = (0.0, 0)  # (clock, decode tokens) at the last throughput window
        self._decode_tokens = 0
        self._next_log_wall = {"prefill": 0.0, "decode": 0.0}
        # (simulated step end, busy, tensor and memory seconds) of recent steps, for telemetry
        self._recent: deque[tuple[float, float, float, float]] = deque()
        self.profile: ProfileWindow | None = None

    # ---- clocks

    def _wall(self) -> float:
        return asyncio.get_running_loop().time()

    def sim_now(self) -> float:
        """Simulated seconds since the server was ready (never ahead of the step in flight)."""
        if self._wall_base is None:
            return 0.0
        now = self._sim_base + (self._wall() - self._wall_base) * self.scale
        return min(now, self._clock) if self._busy else now

    # ---- the app

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        for path in ("/health", "/health_generate", "/ready"):
            r.add_get(path, self.health)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.+}", self.model)
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_route("*", "/start_profile", self.start_profile)
        r.add_route("*", "/stop_profile", self.stop_profile)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/sim/telemetry", self.telemetry)
        if self.enable_metrics:
            r.add_get("/metrics", self.metrics)
        return app

    async def run(self, host: str, port: int) -> int:
        """Serve until stopped (0), a fault under load (1) or a port that cannot be bound (1)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)  # fmt: skip
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=4096)
        try:
            await site.start()
        except OSError as e:
            http_log.error(f"[Errno {e.errno}] {e.strerror or e}")  # asyncio words it as uvicorn prints it
            await runner.cleanup()
            return 1
        http_log.info(f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
        startup = asyncio.create_task(self._start_up())
        await self._stop.wait()
        startup.cancel()
        if self._engine_task is not None:
            self._engine_task.cancel()
        self._cut_streams()
        await runner.cleanup()
        for handler in logging.getLogger().handlers:
            handler.flush()
        return self.exit_code

    async def _start_up(self) -> None:
        await asyncio.sleep(max(self.options.startup_s, 0.0))
        self._wall_base, self._sim_base = self._wall(), 0.0
        http_log.info(READY_LINE)
        self.status = "Up"
        self._engine_task = asyncio.create_task(self._engine())

    def _on_signal(self, sig: signal.Signals) -> None:
        http_log.info(f"Received {signal.Signals(sig).name}. Shutting down.")
        if self.status != "Crashed":
            self.status = "Stopping"
        self._stop.set()

    def _cut_streams(self) -> None:
        """Close every open connection at once (the process is going away)."""
        for s in list(self.streams.values()):
            transport = s.request.transport
            if transport is not None and not s.done:
                transport.abort()
            s.wake.set()

    # ---- the engine

    async def _engine(self) -> None:
        try:
            await self._engine_loop()
        except Exception:
            sched_log.exception("Scheduler hit an exception:")
            self.status = "Crashed"
            self.exit_code = 1
            self._stop.set()

    async def _engine_loop(self) -> None:
        core = self.core
        while True:
            if not core.has_work:
                self._busy = False
                self._work.clear()
                await self._work.wait()
                continue
            if not self._busy:
                self._clock = self.sim_now()
                self._busy = True
            busy_before, tensor_before, memory_before = core.busy_s, core.tensor_s, core.memory_s
            step = core.step()
            if step is None:  # nothing can be admitted: wait for a change rather than spin
                self._busy = False
                self._work.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._work.wait(), 0.1)
                continue
            if step.fault is not None:
                self._crash(step)
                return
            # a prefill step gives its finished prompts a token; a decode step every request that ran in it,
            # those still running and those that finished
            got = step.token_rids if step.kind == "prefill" else [*core.running_rids(), *step.finished]
            self._clock += step.duration_s
            assert self._wall_base is not None
            deadline = self._wall_base + (self._clock - self._sim_base) / self.scale
            late = self._wall() - deadline
            if late > WALL_LAG_TOLERANCE_S:  # the host cannot keep up: the simulated clock waits for it
                self.wall_lag_s += late
                self._sim_base, self._wall_base = self._clock, self._wall()
            await asyncio.sleep(max(-late, 0.0))  # yields to the handlers even when late
            used = (core.busy_s - busy_before, core.tensor_s - tensor_before, core.memory_s - memory_before)
            self._finish_step(step, got, used)

    def _finish_step(self, step: Step, got: list[int], used: tuple[float, float, float]) -> None:
        t = self._clock
        for rid in got:
            s = self.streams.get(rid)
            if s is None:
                continue
            if s.first_s is None:
                s.first_s = t
                self.ttft.observe(t - s.arrived_s)
            else:
                self.itl.observe(t - s.last_s)
            s.last_s = t
            s.tokens += 1
            s.wake.set()
        self.generation_tokens_total += len(got)
        for rid in step.finished:
            s = self.streams.pop(rid, None)
            if s is None:
                continue
            s.done = True
            s.wake.set()
            self.requests_total += 1
            self.prompt_tokens_total += s.prompt_tokens
            self.e2e.observe(t - s.arrived_s)
        self._recent.append((t, *used))
        while self._recent and self._recent[0][0] < t - 10 * TELEMETRY_WINDOW_S:
            self._recent.popleft()
        if step.kind == "decode":
            self._decode_tokens += len(got)
            if self.core.decode_index % self.decode_log_interval == 0:
                clock0, tokens0 = self._tp_window
                if t > clock0:
                    self.last_gen_throughput = (self._decode_tokens - tokens0) / (t - clock0)
                self._tp_window = (t, self._decode_tokens)
                self._log_step(step)
        else:
            self._log_step(step)
        p = self.profile
        if (
            p is not None
            and p.end is None
            and p.num_steps is not None
            and self._steps() - p.start["steps"] >= p.num_steps
        ):
            p.end = self._profile_counters()

    def _log_step(self, step: Step) -> None:
        now = self._wall()
        if now < self._next_log_wall[step.kind]:
            return
        self._next_log_wall[step.kind] = now + 1.0 / LOG_LINES_PER_S
        core = self.core
        if step.kind == "prefill":
            sched_log.info(
                f"Prefill batch, #new-seq: {step.batch_size}, #new-token: {step.prefill_tokens}, #cached-token: 0, "
                f"token usage: {step.token_usage:.2f}, #running-req: {len(core.running)}, "
                f"#queue-req: {len(core.waiting)}"
            )
            return
        graph = self.twin.par.cuda_graph and step.batch_size <= self.twin.par.cuda_graph_max_bs
        sched_log.info(
            f"Decode batch, #running-req: {step.batch_size}, #token: {core.used_slots()}, "
            f"token usage: {step.token_usage:.2f}, cuda graph: {graph}, "
            f"gen throughput (token/s): {self.last_gen_throughput:.2f}, #queue-req: {len(core.waiting)}"
        )

    def _crash(self, step: Step) -> None:
        """A fault under load: SGLang's crash lines, every stream cut, and the process ends with 1."""
        fault = step.fault
        assert fault is not None
        sched_log.error(f"pivot twin: simulated fault {fault.name!r} at #running-req {step.batch_size}: "
                        f"{fault.description}")  # fmt: skip
        sched_log.error(f"Scheduler hit an exception: Traceback (most recent call last):\n{fault.log}")
        http_log.error("Received sigquit from a child process. It usually means the child failed.")
        self.status = "Crashed"
        self.exit_code = 1
        self._cut_streams()
        self._stop.set()

    # ---- requests

    def _admit(self, request: web.Request, endpoint: str, input_len: int, max_new_tokens: int) -> Stream:
        context = self.twin.model.context_length
        if input_len < 1:
            raise BadRequest("The input is empty: send at least one token.")
        if input_len >= context:
            raise BadRequest(
                f"The input ({input_len} tokens) is longer than the model's context length ({context} tokens)."
            )
        if max_new_tokens < 1:
            raise BadRequest("max_new_tokens must be at least 1 (the twin generates exactly max_new_tokens)")
        if input_len + max_new_tokens > context:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {context} tokens. You "
                f"requested a total of {input_len + max_new_tokens} tokens: {input_len} tokens from the input "
                f"messages and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in "
                "the input messages or the completion to fit within the limit."
            )
        rid = self._next_rid
        self._next_rid += 1
        req = Req(rid, input_len, max_new_tokens)
        s = Stream(uuid.uuid4().hex, req, endpoint, max_new_tokens, request, self.sim_now())
        self.streams[rid] = s
        self.core.add(req)
        self._work.set()
        return s

    def _abort(self, s: Stream) -> None:
        """The client left: drop it if it still waits; a running request finishes silently."""
        if s.done or s.gone:
            return
        s.gone = True
        self.aborted_total += 1
        with contextlib.suppress(ValueError):
            self.core.waiting.remove(s.req)
            self.streams.pop(s.req.rid, None)

    async def _serve(self, request: web.Request, endpoint: str, body: dict[str, Any], input_len: int,
                     max_new_tokens: int) -> web.StreamResponse:  # fmt: skip
        if self.status in ("Crashed", "Stopping"):
            raise web.HTTPServiceUnavailable(text="The server is shutting down.")
        try:
            s = self._admit(request, endpoint, input_len, max_new_tokens)
        except BadRequest as e:
            return _error(endpoint, str(e))
        try:
            if body.get("stream"):
                return await self._stream(request, s, body)
            while not s.done:
                await s.wake.wait()
                s.wake.clear()
                if self.status in ("Crashed", "Stopping"):
                    raise ConnectionResetError("the server went down")
            return web.json_response(self._final(s))
        finally:
            if not s.done and self.status not in ("Crashed", "Stopping"):
                self._abort(s)

    async def _stream(self, request: web.Request, s: Stream, body: dict[str, Any]) -> web.StreamResponse:
        usage = bool((body.get("stream_options") or {}).get("include_usage")) and s.endpoint != "generate"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if s.endpoint == "chat":
            await resp.write(self._chat_role(s))
        sent = 0
        while True:
            await s.wake.wait()
            s.wake.clear()
            if self.status in ("Crashed", "Stopping"):
                raise ConnectionResetError("the server went down")
            n = s.tokens
            out = [self._event(s, k, last=s.done and k == n) for k in range(sent + 1, n + 1)]
            sent = n
            if s.done:
                if usage:
                    out.append(self._usage_event(s))
                out.append(b"data: [DONE]\n\n")
                await resp.write(b"".join(out))
                break
            if out:
                await resp.write(b"".join(out))
        await resp.write_eof()
        return resp

    # ---- payloads

    def _meta(self, s: Stream, k: int, last: bool) -> dict[str, Any]:
        return {
            "id": s.rid,
            "finish_reason": {"type": "length", "length": s.max_new_tokens} if last else None,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": k,
            "cached_tokens": 0,
            "e2e_latency": round(self.sim_now() - s.arrived_s, 6),
        }

    def _event(self, s: Stream, k: int, last: bool) -> bytes:
        if s.endpoint == "generate":
            data: dict[str, Any] = {
                "text": TOKEN_TEXT * k,
                "output_ids": [TOKEN_ID] * k,
                "meta_info": self._meta(s, k, last),
            }
        elif s.endpoint == "completions":
            data = {
                "id": s.rid,
                "object": "text_completion",
                "created": self._created,
                "model": self.served_model_name,
                "choices": [{"index": 0, "text": TOKEN_TEXT, "logprobs": None,
                             "finish_reason": "length" if last else None, "matched_stop": None}],
                "usage": None,
            }  # fmt: skip
        else:
            data = {
                "id": s.rid,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self.served_model_name,
                "choices": [{"index": 0, "delta": {"role": None, "content": TOKEN_TEXT}, "logprobs": None,
                             "finish_reason": "length" if last else None, "matched_stop": None}],
                "usage": None,
            }  # fmt: skip
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    def _chat_role(self, s: Stream) -> bytes:
        data = {
            "id": s.rid,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self.served_model_name,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}],
            "usage": None,
        }  # fmt: skip
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    def _usage(self, s: Stream) -> dict[str, int]:
        return {
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.tokens,
            "total_tokens": s.prompt_tokens + s.tokens,
        }

    def _usage_event(self, s: Stream) -> bytes:
        data = {
            "id": s.rid,
            "object": "chat.completion.chunk" if s.endpoint == "chat" else "text_completion",
            "created": self._created,
            "model": self.served_model_name,
            "choices": [],
            "usage": self._usage(s),
        }
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    def _final(self, s: Stream) -> dict[str, Any]:
        text = TOKEN_TEXT * s.tokens
        if s.endpoint == "generate":
            return {"text": text, "output_ids": [TOKEN_ID] * s.tokens, "meta_info": self._meta(s, s.tokens, True)}
        common = {"id": s.rid, "created": self._created, "model": self.served_model_name, "usage": self._usage(s)}
        if s.endpoint == "completions":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "matched_stop": None}
            return {**common, "object": "text_completion", "choices": [choice]}
        message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length", "matched_stop": None}
        return {**common, "object": "chat.completion", "choices": [choice]}

    # ---- generation endpoints

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's native API: `text` or `input_ids`, `sampling_params.max_new_tokens`, `stream`."""
        body = await _body(request, "generate")
        if isinstance(body, web.Response):
            return body
        ids, text = body.get("input_ids"), body.get("text")
        if ids is not None:
            if not isinstance(ids, list) or (ids and isinstance(ids[0], list)):
                return _error("generate", "The twin serves one prompt per request: input_ids must be a list of ints.")
            input_len = len(ids)
        elif isinstance(text, list) and len(text) == 1 and isinstance(text[0], str):
            input_len = _text_tokens(text[0])
        elif isinstance(text, str):
            input_len = _text_tokens(text)
        else:
            return _error("generate", "Either text or input_ids should be provided (one prompt per request).")
        params = body.get("sampling_params") or {}
        max_new = params.get("max_new_tokens")
        max_new = DEFAULT_MAX_NEW_TOKENS["generate"] if max_new is None else max_new
        if not isinstance(max_new, int):
            return _error("generate", "sampling_params.max_new_tokens must be an integer")
        return await self._serve(request, "generate", body, input_len, max_new)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """OpenAI-compatible completions: `prompt` as text or token ids, `max_tokens`."""
        body = await _body(request, "completions")
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            input_len = _text_tokens(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            input_len = len(prompt)
        else:
            return _error("completions", "prompt must be a string or a list of token ids (one prompt per request)")
        max_new = body.get("max_tokens")
        max_new = DEFAULT_MAX_NEW_TOKENS["completions"] if max_new is None else max_new
        if not isinstance(max_new, int):
            return _error("completions", "max_tokens must be an integer")
        return await self._serve(request, "completions", body, input_len, max_new)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """OpenAI-compatible chat completions: `messages`, `max_completion_tokens` or `max_tokens`."""
        body = await _body(request, "chat")
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error("chat", "messages must be a non-empty list")
        chars = 0
        for msg in messages:
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            chars += len(str(content or "")) + 4 * CHARS_PER_TOKEN  # a few template tokens per message
        max_new = body.get("max_completion_tokens")
        if max_new is None:
            max_new = body.get("max_tokens")
        max_new = DEFAULT_MAX_NEW_TOKENS["chat"] if max_new is None else max_new
        if not isinstance(max_new, int):
            return _error("chat", "max_tokens must be an integer")
        return await self._serve(request, "chat", body, max(chars // CHARS_PER_TOKEN, 1), max_new)

    # ---- information endpoints

    async def health(self, request: web.Request) -> web.Response:
        """200 once the server is up; 503 while starting or going down (SGLang's /health)."""
        if self.status != "Up":
            return web.Response(status=503)
        return web.Response(status=200)

    def info(self) -> dict[str, Any]:
        """What /server_info reports: SGLang's args with their resolved values, the twin's view, the time scale."""
        args = resolved_args(self.twin)
        core = self.core
        return {
            **args,
            **self.twin.server_info(),
            "time_scale": self.scale,
            "max_total_num_tokens": self.twin.limits.kv_capacity_tokens,
            "max_req_input_len": self.twin.model.context_length - 1,
            "internal_states": [
                {
                    "last_gen_throughput": round(self.last_gen_throughput, 3),
                    "num_running_reqs": len(core.running),
                    "num_queue_reqs": len(core.waiting),
                    "token_usage": round(core.token_usage(), 4),
                    "sim_time_s": round(self.sim_now(), 6),
                    "wall_lag_s": round(self.wall_lag_s, 6),
                    "memory_usage": {
                        "weight": self.twin.resolved["weights_gib_per_gpu"],
                        "kvcache": self.twin.resolved["kv_pool_gib_per_gpu"],
                    },
                }
            ],
            "version": VERSION,
            "status": self.status,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        if request.path == "/get_server_info":
            http_log.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                             "Please use '/server_info' instead.")  # fmt: skip
        return web.json_response(self.info(), dumps=_dumps)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.args.get("tokenizer_path") or self.model_path,
                "served_model_name": self.served_model_name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "architectures": [self.twin.model.architecture],
            }
        )

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.served_model_name,
            "object": "model",
            "created": self._created,
            "owned_by": "sglang",
            "root": self.model_path,
            "parent": None,
            "max_model_len": self.twin.model.context_length,
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.served_model_name:
            return web.json_response(
                {"object": "error", "message": f"The model `{request.match_info['model']}` does not exist.",
                 "type": "NotFoundError", "param": None, "code": 404},
                status=404,
            )  # fmt: skip
        return web.json_response(self._model_card())

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")  # fmt: skip

    async def metrics(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(TwinCollector(self))
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # ---- profile

    def _steps(self) -> int:
        return self.core.prefill_index + self.core.decode_index

    def _profile_counters(self) -> dict[str, Any]:
        core = self.core
        return {
            "sim_s": self.sim_now(),
            "breakdown_s": dict(core.breakdown_s),
            "busy_s": core.busy_s,
            "steps": self._steps(),
            "prefill_steps": core.prefill_index,
            "decode_steps": core.decode_index,
        }

    async def start_profile(self, request: web.Request) -> web.Response:
        """Open a profile window (SGLang's `num_steps` closes it by itself after that many steps)."""
        body: dict[str, Any] = {}
        if request.can_read_body:
            with contextlib.suppress(ValueError):
                body = await request.json() or {}
        if self.profile is not None and self.profile.end is None:
            return web.Response(status=400, text="Profiling is already in progress. Call /stop_profile first.\n")
        num_steps = body.get("num_steps") if isinstance(body, dict) else None
        self.profile = ProfileWindow(self._profile_counters(), int(num_steps) if num_steps else None)
        sched_log.info("Profiling starts (simulated: the twin's step-time breakdown).")
        return web.Response(text="Start profiling.\n")

    async def stop_profile(self, request: web.Request) -> web.Response:
        """Close the window: step time by component (seconds and share) over the steps run inside it."""
        p = self.profile
        if p is None:
            return web.Response(status=400, text="Profiling is not in progress. Call /start_profile first.\n")
        end = p.end or self._profile_counters()
        self.profile = None
        seconds = {k: end["breakdown_s"][k] - p.start["breakdown_s"].get(k, 0.0) for k in end["breakdown_s"]}
        total = sum(seconds.values())
        sched_log.info("Profiling done (simulated).")
        return web.json_response(
            {
                "simulated": True,
                "window_s": round(end["sim_s"] - p.start["sim_s"], 6),
                "step_time_s": total,
                "busy_s": end["busy_s"] - p.start["busy_s"],
                "prefill_steps": end["prefill_steps"] - p.start["prefill_steps"],
                "decode_steps": end["decode_steps"] - p.start["decode_steps"],
                "breakdown": {k: {"seconds": v, "share": v / total if total > 0 else 0.0} for k, v in seconds.items()},
            }
        )

    # ---- telemetry

    def telemetry_snapshot(self, window_s: float = TELEMETRY_WINDOW_S) -> m.Telemetry:
        """Simulated per-GPU telemetry: power over the last `window_s` simulated seconds, energy since ready."""
        now = self.sim_now()
        window_s = max(min(window_s, now), 1e-9) if now > 0 else 1e-9
        recent = [u for u in self._recent if u[0] > now - window_s]
        busy, tensor, memory = (sum(u[i] for u in recent) for i in (1, 2, 3))
        share = min(busy / window_s, 1.0) if now > 0 else 0.0
        cost, hw, r = self.twin.cost, self.twin.hw, self.twin.resolved
        power = cost.power_w(tensor / window_s, memory / window_s) if now > 0 else hw.idle_w
        core = self.core
        energy = cost.power_w(core.tensor_s / now, core.memory_s / now) * now if now > 0 else 0.0
        mem_mib = (r["weights_gib_per_gpu"] + r["kv_pool_gib_per_gpu"]) * 1024
        gpu = {
            "name": hw.title,
            "samples": 1,
            "power_w_mean": round(power, 1),
            "power_w_p95": round(power, 1),
            "power_w_max": round(power, 1),
            "power_limit_w": hw.tdp_w,
            "util_gpu_pct_mean": round(100 * share, 1),
            "mem_used_mib_max": round(mem_mib, 1),
            "energy_j": round(energy, 3),
        }
        core = self.core
        return m.Telemetry(
            source="simulated",
            gpus=[m.GpuTelemetry(gpu=i, **gpu) for i in range(self.twin.par.gpus)],
            server_metrics={
                "num_running_reqs": float(len(core.running)),
                "num_queue_reqs": float(len(core.waiting)),
                "token_usage": core.token_usage(),
                "gen_throughput": self.last_gen_throughput,
                "sim_time_s": now,
                "busy_s": core.busy_s,
                "window_s": window_s,
            },
        )

    async def telemetry(self, request: web.Request) -> web.Response:
        try:
            window = float(request.query.get("window_s", TELEMETRY_WINDOW_S))
        except ValueError:
            return web.json_response({"error": {"message": "window_s must be a number"}}, status=400)
        return web.Response(text=self.telemetry_snapshot(window).model_dump_json(), content_type="application/json")


# ---------------------------------------------------------------------------------------------- helpers


def _text_tokens(text: str) -> int:
    return max(len(text) // CHARS_PER_TOKEN, 1)


def _dumps(data: Any) -> str:
    return json.dumps(data, default=str)


def _error(endpoint: str, message: str, status: int = 400) -> web.Response:
    if endpoint == "generate":
        return web.json_response({"error": {"message": message}}, status=status)
    return web.json_response(
        {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status},
        status=status,
    )


async def _body(request: web.Request, endpoint: str) -> dict[str, Any] | web.Response:
    try:
        body = await request.json()
    except ValueError as e:
        return _error(endpoint, f"The request body is not valid JSON: {e}")
    if not isinstance(body, dict):
        return _error(endpoint, "The request body must be a JSON object.")
    return body


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank"):
            record.rank = ""
        return True


def setup_logging(level: str = "info") -> None:
    """SGLang's log format on stderr: `[2026-01-01 12:00:00 TP0] message`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s%(rank)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(_RankFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # cut connections are the point, not news


RESOLVED_ARGS = ("tp_size", "pp_size", "ep_size", "mem_fraction_static", "max_running_requests", "chunked_prefill_size",
                 "max_prefill_tokens", "cuda_graph_max_bs_decode", "kv_cache_dtype")  # fmt: skip


def resolved_args(twin: Twin) -> dict[str, Any]:
    """SGLang's server args after its startup hooks: what the user gave, with the automatic values resolved."""
    model_path = str(twin.args.get("model_path") or twin.model.model_path)
    served = twin.args.get("served_model_name") or model_path
    return {
        **twin.args,
        "model_path": model_path,
        "served_model_name": served,
        **{k: twin.resolved[k] for k in RESOLVED_ARGS},
    }


def _startup_lines(twin: Twin) -> None:
    for warning in twin.warnings:
        http_log.warning(warning)
    r, hw = twin.resolved, twin.hw
    args = ", ".join(f"{k}={v!r}" for k, v in resolved_args(twin).items())
    http_log.info(f"server_args=ServerArgs({args})")
    used = r["weights_gib_per_gpu"]
    sched_log.info(
        f"Load weight end. type={twin.model.architecture}, avail mem={hw.memory_gib - used:.2f} GB, "
        f"mem usage={used:.2f} GB."
    )
    sched_log.info(
        f"KV Cache is allocated. #tokens: {r['max_total_num_tokens']}, KV size: {r['kv_pool_gib_per_gpu']:.2f} GB"
    )
    sched_log.info(twin.startup_line())
    if twin.no_effect:
        http_log.info(
            f"pivot twin: accepted flags with no effect in SGLang {SGLANG_VERSION}: {', '.join(twin.no_effect)}"
        )
    if twin.not_modelled:
        http_log.info(f"pivot twin: accepted flags the twin does not model: {', '.join(twin.not_modelled)}")


def serve(flags: Sequence[str], *, model_profile: str, hardware: str, gpus: int, options: ServeOptions) -> int:
    """Run `sglang serve FLAGS` as the twin until it stops; returns the process's exit code.

    Flags SGLang refuses print SGLang's own usage error and return its code (2); a startup fault logs
    SGLang's line and returns 1. Profiles that do not exist raise PivotError (pivot's error, not SGLang's).
    """
    from tools.engines.catalog import CatalogError

    try:
        twin = Twin.build(model_profile, hardware, gpus, m.ServerConfig.parse(list(flags)), SGLANG_VERSION)
    except CatalogError as e:
        sys.stdout.write(e.stdout)
        sys.stderr.write(e.stderr)
        return e.exit_code
    except TwinStartupError as e:
        setup_logging("info")
        if e.classify == "argument-validation":  # SGLang's arg hooks raise in the launching process itself
            http_log.error(f"Traceback (most recent call last):\n{e.log}")
        else:  # the scheduler process fails while loading, and the launcher notices
            sched_log.error(f"Scheduler hit an exception: Traceback (most recent call last):\n{e.log}")
            http_log.error("Received sigquit from a child process. It usually means the child failed.")
        return e.exit_code
    setup_logging(str(twin.args.get("log_level") or "info"))
    _startup_lines(twin)
    server = TwinServer(twin, options)
    host, port = str(twin.args.get("host") or "127.0.0.1"), int(twin.args.get("port") or 30000)
    return asyncio.run(server.run(host, port))
