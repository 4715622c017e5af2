"""TwinServer: the aiohttp app plus the engine task that runs the twin's scheduler step by step and times
its tokens on the wall clock (see tools/engines/sim/server.py for the whole picture)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import deque

from aiohttp import web

from agent.errors import PivotError
from tools.engines.sim.common import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    LOG_LINES_PER_S,
    READY_LINE,
    SHUTDOWN_TIMEOUT_S,
    TELEMETRY_WINDOW_S,
    TTFT_BUCKETS,
    WALL_LAG_TOLERANCE_S,
    ServeOptions,
    Stream,
    http_log,
    resolved_args,
    sched_log,
)
from tools.engines.sim.http_app import RoutesMixin
from tools.engines.sim.metrics_endpoint import Histogram, MetricsMixin, ProfileWindow
from tools.engines.sim.scheduler import EngineCore, Step
from tools.engines.sim.streaming import StreamingMixin
from tools.engines.sim.twin import Twin


class TwinServer(RoutesMixin, StreamingMixin, MetricsMixin):
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

    def _wall(self) -> float:
        return asyncio.get_running_loop().time()

    def rescale(self, scale: float) -> None:
        """Go on at `scale` simulated seconds per wall second: the simulated clock is rebased now, so the time
        already simulated is kept and only what follows runs at the new rate."""
        if self._wall_base is not None:
            self._sim_base, self._wall_base = self.sim_now(), self._wall()
        self.scale = float(scale)

    def sim_now(self) -> float:
        """Simulated seconds since the server was ready (never ahead of the step in flight)."""
        if self._wall_base is None:
            return 0.0
        now = self._sim_base + (self._wall() - self._wall_base) * self.scale
        return min(now, self._clock) if self._busy else now

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
