"""The Deployment of every HTTP engine: a ManagedServer plus benchmarks through tools/loadgen and telemetry.

`launch_in_session` is how the agent launches with a session's engine: the log goes under
state/<session>/logs/ and, for engines that launch processes, the server is recorded in the ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from agent import models as m
from agent.contracts import Deployment, Engine, LedgerLink, ProgressCallback
from agent.errors import PivotError
from agent.session import Paths
from tools.engines.failures import COMMON_RULES, FailureRule, short_line
from tools.engines.process import ManagedServer
from tools.metrics import DEFAULT_VOCAB_SIZE
from tools.telemetry.summary import energy_fields
from tools.tls import tls_context

if TYPE_CHECKING:
    from agent.session import Session
    from tools.loadgen import LevelProgress
    from tools.telemetry import TelemetryRecorder
    from tools.telemetry.power import PowerLimits

RATE_KEYS = (
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "max_output_tokens_per_s",
    "request_goodput",
    "token_goodput_tok_s",
)
CLIENT_DELAY_KEYS = ("mean_dispatch_delay_ms", "max_dispatch_delay_ms")  # the client's: stay on the wall clock
# A level during which the twin's clock lost more than this share of the level's wall duration waiting for this host
# measured the host, not the twin: it runs again at a lower time scale (up to LAG_RERUNS times, never below
# MIN_TIME_SCALE), and is refused as a measurement when it still falls behind.
LAG_REFUSE_SHARE = 0.02
LAG_RERUNS = 3
MIN_TIME_SCALE = 1.0
CRASH_GRACE_S = 5.0  # a level still running this long after the server died is cut short
WATCH_S = 0.2  # how often a benchmark checks that the server is still running


def server_log_path(paths: Paths, session_id: str, engine: str, experiment_id: int | None = None) -> Path:
    """A new log file for one server under state/<session>/logs/ (the name says engine, experiment and time;
    `experiment_id` is the experiment's number in the session, as the reports call it)."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    prefix = f"exp{experiment_id:03d}-" if experiment_id is not None else ""
    stem = f"{prefix}{engine}-{stamp}"
    logs = paths.logs_dir(session_id)
    path, n = logs / f"{stem}.log", 1
    while path.exists():
        n += 1
        path = logs / f"{stem}-{n}.log"
    return path


def launch_in_session(
    session: Session,
    config: m.ServerConfig,
    *,
    engine: Engine | None = None,
    experiment_id: int | None = None,
    force: bool = False,
    issues: Sequence[m.FlagIssue] | None = None,
) -> Deployment:
    """Launch `config` with the session's engine (or `engine`), logging under the session's state dir and, for
    engines that launch processes, recording the server in the ledger. Returns before the server is ready.
    `issues`: the engine's audit of `config` made already by the caller (the launch does not audit again)."""
    engine = engine or session.engine
    if engine is None:
        raise PivotError("this session has no engine to launch with", hint="open the session with an engine")
    number = session.store.get_experiment(experiment_id).number if experiment_id is not None else None
    log_path = server_log_path(session.paths, session.id, engine.name, number)  # named as the reports call it
    ledger = LedgerLink(session.store, session.id, experiment_id, session.paths)
    return engine.launch(config, log_path, ledger=ledger, force=force, issues=issues)


def read_telemetry(deployment: HttpDeployment) -> m.Telemetry:
    """GPU and server readings of a deployment now (tools/telemetry/): NVML on this host and the server's
    /metrics, or the twin's /sim/telemetry for sim-http. Never raises: what cannot be read is in `error`."""
    from tools.telemetry import TelemetryRecorder

    recorder = TelemetryRecorder(deployment.base_url, simulated=deployment.simulated, gauges=deployment.gauges)
    try:
        return recorder.snapshot()
    finally:
        recorder.stop()


def start_deployment(argv: list[str], *, log_path: Path, base_url: str, engine: str, health_url: str, host: str,
                     env: dict[str, str], cwd: Path | str | None, ready_line: str | None, stop_grace_s: float,
                     ledger: LedgerLink | None, failure_rules: Sequence[FailureRule] = COMMON_RULES,
                     owner_check: bool = True, power_limit_w: float | None = None, gpu_count: int = 1,
                     **deployment: Any) -> HttpDeployment:  # fmt: skip
    """Start `argv` as a ManagedServer (recorded in `ledger`) and wrap it: what every HTTP engine's launch() does.
    `owner_check` false: the server runs behind a launch prefix (docker exec, ssh), so this host cannot tell whether
    the socket on its port is the server's own. `power_limit_w`: a GPU power limit set through NVML on the server's
    `gpu_count` GPUs before it starts, restored when it stops (PowerLimitRefused where the driver will not)."""
    limits = limit_power(engine, power_limit_w, log_path, {**os.environ, **env}, gpu_count, deployment.get("source"))
    try:
        server = ManagedServer(
            argv,
            log_path=log_path,
            base_url=base_url,
            engine=engine,
            health_url=health_url,
            host=host,
            env=env,
            cwd=cwd,
            ready_line=ready_line,
            stop_grace_s=stop_grace_s,
            ledger=ledger,
            failure_rules=failure_rules,
            owner_check=owner_check,
        )
        server.start()
    except BaseException:
        if limits is not None:
            limits.restore()
        raise
    return HttpDeployment(server, engine=engine, power_limits=limits, **deployment)


POWER_PENDING = "power-limits-to-restore.json"  # beside the server logs while a power limit is set


def limit_power(engine: str, watts: float | None, log_path: Path, env: Mapping[str, str], gpus: int,
                source: object) -> PowerLimits | None:  # fmt: skip
    """Limits a killed pivot left set beside these logs put back, then `watts` set on the server's GPUs (None:
    nothing to set). A server of the twin (sim-http) has no GPUs to limit: refused, as the sim engine models it."""
    from tools.telemetry.power import PowerLimitRefused, restore_pending, server_gpus, set_power_limits

    pending = log_path.parent / POWER_PENDING
    restore_pending(pending)
    if watts is None:
        return None
    if source == "simulated":
        raise PowerLimitRefused(
            f"{engine} serves the twin without its power model: it cannot run under a GPU power limit",
            hint="run power items on the sim engine (the twin models the limit) or on GPUs",
        )
    return set_power_limits(server_gpus(dict(env), gpus), watts, pending_path=pending)


class HttpDeployment:
    """A server launched as a process and spoken to over HTTP: what the sglang, sim-http and command engines return.

    benchmark() runs tools/loadgen one level at a time while watching the process: if the server dies, the level
    running then ends with its requests counted as failed (cut short after CRASH_GRACE_S), every later level is
    recorded as failed without sending anything, and `failure` holds the classified reason (also in the ledger).
    """

    def __init__(
        self,
        server: ManagedServer,
        *,
        engine: str,
        source: m.Source = "measured",
        backend: str = "sglang",
        endpoint: str | None = None,
        model: str | None = None,
        warmup_pause_s: float = 1.0,
        time_scale: float | None = None,
        audit: Sequence[m.FlagIssue] = (),
        gauges: Mapping[str, str] | None = None,
        auth_env: str | None = None,
        power_limits: PowerLimits | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.server, self.engine, self.source, self.backend = server, engine, source, backend
        self.power_limits = power_limits  # GPU power limits set for this server (a power item), restored at stop()
        self.gauges: Mapping[str, str] = dict(gauges or {})  # pivot's gauge name -> the engine's Prometheus name
        self.endpoint, self.model, self.warmup_pause_s, self.time_scale = endpoint, model, warmup_pause_s, time_scale
        self.audit = list(audit)
        self.auth_env = auth_env  # opt-in: the environment variable whose value goes as the benchmark's Bearer token
        self.level_telemetry: list[m.Telemetry] = []  # per level of the last benchmark(), in order
        self.vocab_size = vocab_size  # the served model's vocabulary, when the engine could read it

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def bench_headers(self) -> dict[str, str]:
        """No Authorization unless the engine opted in (`auth_env`, the name of the variable holding the server's
        key): pivot's own keys ($OPENAI_API_KEY and the like) are never sent to the server under test."""
        if not self.auth_env:
            return {}
        key = os.environ.get(self.auth_env)
        if not key:
            raise PivotError(f"${self.auth_env} is not set", hint="export the server's API key in that variable")
        return {"Authorization": f"Bearer {key}"}

    @property
    def simulated(self) -> bool:
        return self.source == "simulated"

    @property
    def failure(self) -> str | None:
        """The classified reason the server failed (oom, cuda-error, ...), once it has."""
        self.server.poll()
        return self.server.failure

    @property
    def log_path(self) -> Path:
        return self.server.log_path

    @property
    def argv(self) -> list[str]:
        """The command line the server was launched with."""
        return list(self.server.argv)

    def wait_ready(self, timeout_s: float, on_progress: ProgressCallback | None = None) -> None:
        self.server.wait_ready(timeout_s, on_progress)

    def alive(self) -> bool:
        return self.server.alive()

    def log_tail(self, n: int = 50) -> list[str]:
        return self.server.log_tail(n)

    def telemetry(self) -> m.Telemetry:
        return read_telemetry(self)

    def metrics(self) -> dict[str, Any]:
        """The engine's gauges from the server's /metrics, by pivot's names (PivotError when it publishes none)."""
        from tools.telemetry import scrape_metrics

        return {"source": self.source, "metrics": scrape_metrics(self.base_url, gauges=self.gauges)}

    def profile(self, out_dir: Path, spec: m.BenchSpec | None = None) -> m.ProfileSummary:
        """/start_profile, a short load, /stop_profile, then the torch profiler's traces (tools/profile.py)."""
        from tools.profile import profile_server

        return profile_server(self.base_url, out_dir, spec=spec)

    def stop(self) -> None:
        try:
            self.server.stop()
        finally:
            if self.power_limits is not None:
                self.power_limits.restore()

    # ---- benchmark

    def benchmark(
        self,
        spec: m.BenchSpec,
        on_progress: ProgressCallback | None = None,
        *,
        on_level: Callable[[LevelProgress], None] | None = None,
        output_file: Path | None = None,
    ) -> m.BenchResult:
        """Run the sweep `spec` against this server; failed requests are counted, never raised.

        `on_progress` gets one line of text per event, `on_level` the loadgen's LevelProgress (for progress bars);
        `output_file` gets one JSON line per level with bench_serving's keys. Ctrl-C returns the finished levels
        with interrupted=True. GPU power, clocks and energy (NVML, or the twin's /sim/telemetry) and the server's
        /metrics are sampled during every level; the summaries are in `level_telemetry` afterwards. The endpoint is the spec's, or the engine's when the spec asks for SGLang's
        /generate and the server has none (the command engine).
        """
        if self.endpoint is not None and spec.endpoint == "generate":
            spec = spec.model_copy(update={"endpoint": self.endpoint})
        if spec.vocab_size is None and self.vocab_size is not None and spec.dataset_name == "random-ids":
            spec = spec.model_copy(update={"vocab_size": self.vocab_size})  # the served model's ids, as recorded
        result = m.BenchResult(
            spec=spec,
            engine=self.engine,
            source=self.source,
            raw_path=str(output_file) if output_file is not None else None,
        )
        from tools.telemetry import TelemetryRecorder

        self.level_telemetry = []
        recorder = TelemetryRecorder(self.base_url, simulated=self.simulated, gauges=self.gauges)
        try:
            asyncio.run(self._sweep(spec, result, on_progress, on_level, output_file, recorder))
        except KeyboardInterrupt:
            result.interrupted = True
        finally:
            recorder.stop()
            self.level_telemetry = list(recorder.levels)
        result.finished_at = m.utcnow()
        self.server.poll()
        return result

    async def _sweep(
        self,
        spec: m.BenchSpec,
        result: m.BenchResult,
        on_progress: ProgressCallback | None,
        on_level: Callable[[LevelProgress], None] | None,
        output_file: Path | None,
        recorder: TelemetryRecorder,
    ) -> None:
        from tools import loadgen
        from tools.hostload import HostLoad

        # measured for a server of this host: a real engine's, and sim-http's too (the twin served over HTTP times its
        # answers on this host's clock, so other processes' load moves its numbers: [safety] G12)
        host = HostLoad(self.server.pgid) if self.server.owner_check else None
        total = len(spec.concurrency)
        for index, concurrency in enumerate(spec.concurrency):
            if self.server.poll() is not None:
                level = self._failed_level(spec, concurrency, f"server is down ({self.server.failure})")
                if output_file is not None:
                    loadgen.append_jsonl(output_file, level)
                result.levels.append(level)
                if on_progress is not None:
                    on_progress(f"concurrency {concurrency}: not run, the server is down ({self.server.failure})")
                continue

            def report(p: LevelProgress, index: int = index) -> None:
                p = self._scaled_progress(p.model_copy(update={"level_index": index, "levels_total": total}))
                if on_level is not None:
                    on_level(p)
                if on_progress is not None and (p.phase != "running" or p.requests_done == 0):
                    on_progress(str(p))

            one = spec.model_copy(update={"concurrency": [concurrency]})  # its SLOs go on the wall clock per attempt
            await asyncio.to_thread(recorder.mark_level, concurrency)
            host_mark = await asyncio.to_thread(host.mark) if host is not None else None
            outcome = await self._level_in_time(one, report, on_progress, first=not result.levels)
            if outcome is None:  # interrupted (Ctrl-C) before the level finished
                result.interrupted = True
                return
            level, crashed, interrupted = outcome
            telemetry = await asyncio.to_thread(recorder.end_level, level.total_output_tokens)
            level = level.model_copy(update=energy_fields(telemetry, level.total_output_tokens))
            if host is not None:  # what other processes took of this host's CPUs meanwhile (a real engine's run)
                level = level.model_copy(
                    update={"host_other_cores": await asyncio.to_thread(host.other_cores, host_mark)}
                )
            if output_file is not None:  # the raw file holds what the ledger holds: the twin's (scaled) numbers
                loadgen.append_jsonl(output_file, level)
            result.levels.append(level)
            if interrupted and not crashed:
                result.interrupted = True
                return

    async def _level_in_time(
        self,
        one: m.BenchSpec,
        report: Callable[[LevelProgress], None],
        on_progress: ProgressCallback | None,
        first: bool = True,
    ) -> tuple[m.BenchLevel, bool, bool] | None:
        """One level, run again at a lower time scale while the twin's clock fell behind this host's (its numbers
        would be this host's, not the twin's); refused as a measurement when it still does at the lowest scale.
        Returns (the level in simulated time, crashed, interrupted), or None when interrupted before it ended."""
        attempt = 0
        loop = asyncio.get_running_loop()
        while True:
            before, wall_before = await asyncio.to_thread(self._twin_clock), loop.time()
            ran = await self._one_level(one.model_copy(update=self._wall_clock_slos(one)), report, first)
            if ran is None:
                return None
            level, crashed, interrupted = ran
            after, wall = await asyncio.to_thread(self._twin_clock), loop.time() - wall_before
            scale = self.time_scale or 1.0
            behind = after[1] - before[1] if before is not None and after is not None else 0.0
            if crashed or interrupted or behind <= LAG_REFUSE_SHARE * max(level.duration, wall - behind):
                return self._scaled(level), crashed, interrupted
            # the simulated seconds of work this host served per wall second: a scale it can hold
            kept_up = (after[0] - before[0]) / wall if before is not None and after is not None and wall > 0 else 0.0
            lower = max(MIN_TIME_SCALE, min(scale / 2, kept_up / 2))  # half the rate this host held: headroom
            if attempt < LAG_RERUNS and scale > MIN_TIME_SCALE and await asyncio.to_thread(self._rescale, lower):
                attempt += 1
                if on_progress is not None:
                    on_progress(
                        f"concurrency {one.concurrency[0]}: this host fell {behind:.1f} s behind the twin's clock in a "
                        f"{level.duration:.1f} s level at time scale {scale:g}; the level runs again at time scale "
                        f"{lower:.3g} (its numbers would have been this host's, not the twin's)"
                    )
                continue
            why = (
                f"not a measurement: this host fell {behind:.1f} s behind the twin's clock during a {level.duration:.1f} "
                f"s level at time scale {scale:g}, so its numbers are this host's, not the twin's; it is never judged "
                "(run it with a lower time scale, -o time_scale=N, or on a less loaded host)"
            )
            return self._scaled(level).model_copy(update={"refused": why}), crashed, interrupted

    async def _one_level(
        self, one: m.BenchSpec, report: Callable[[LevelProgress], None], first: bool = True
    ) -> tuple[m.BenchLevel, bool, bool] | None:
        """One level as the load generator measured it (wall clock), watching the process: (level, crashed,
        interrupted), or None when it was interrupted before it ended."""
        from tools import loadgen

        concurrency = one.concurrency[0]
        task = asyncio.create_task(
            loadgen.run_sweep(
                self.base_url,
                one,
                backend=self.backend,
                model=self.model,
                on_progress=report,
                warmup_pause_s=self.warmup_pause_s,
                headers=self.bench_headers(),
                vocab_size=one.vocab_size or DEFAULT_VOCAB_SIZE,
                first_level=first,  # a later level's failed warmup is that level's failure, not a wrong endpoint
            )
        )
        died_at: float | None = None
        loop = asyncio.get_running_loop()
        while not task.done():
            await asyncio.wait({task}, timeout=WATCH_S)
            if died_at is None and self.server.poll() is not None:
                died_at = loop.time()
            if died_at is not None and not task.done() and loop.time() - died_at > CRASH_GRACE_S:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        swept, error = None, None
        try:
            swept = task.result()
        except asyncio.CancelledError:
            pass
        except PivotError as e:  # the probe or every warmup request failed: it may be dying
            error = e
        level = swept.levels[0] if swept is not None and swept.levels else None
        failures = error is not None or (level is not None and level.failed > 0)
        crashed = self.server.poll() is not None or (failures and await self._exits_soon())
        if error is not None and not crashed:
            raise error
        if level is None:
            if not crashed:
                return None
            level = self._failed_level(one, concurrency, f"server crashed ({self.server.failure})")
        if crashed:
            why = short_line(self.server.failure_line) if self.server.failure_line else self.server.exit_text()
            note = f"the server crashed during this level: {self.server.failure} ({why})"
            level = level.model_copy(update={"warnings": [*level.warnings, note]})
        return level, crashed, bool(swept is not None and swept.interrupted)

    async def _exits_soon(self) -> bool:
        """After failed requests: whether the process exits within CRASH_GRACE_S (False once /health answers 200)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CRASH_GRACE_S
        timeout = httpx.Timeout(1.0, connect=0.5)
        async with httpx.AsyncClient(timeout=timeout, trust_env=False, verify=tls_context()) as client:
            while loop.time() < deadline:
                if self.server.poll() is not None:
                    return True
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.server.health_url)).status_code == 200:
                        return False
                await asyncio.sleep(WATCH_S)
        return self.server.poll() is not None

    def _failed_level(self, spec: m.BenchSpec, concurrency: int, reason: str) -> m.BenchLevel:
        """A level whose every request failed without being sent (the server is gone)."""
        from tools.metrics import compute_level, failed_goodput

        n = spec.prompts_for(concurrency)
        base = compute_level(
            [],
            max_concurrency=concurrency,
            request_rate=spec.request_rate,
            backend=self.backend,
            dataset_name=spec.dataset_name,
            random_input_len=spec.random_input_len,
            random_output_len=spec.random_output_len,
            random_range_ratio=spec.random_range_ratio,
        )
        return m.BenchLevel(
            **base.model_dump(exclude={"failed", "errors"}),
            failed=n,
            errors={reason: n},
            **failed_goodput(spec.goodput_slos_ms),
        )

    def _wall_clock_slos(self, spec: m.BenchSpec) -> dict[str, Any]:
        """The spec's SLOs on the wall clock of a twin served `time_scale` times faster than its GPUs (the load
        generator measures wall time; `_scaled` converts the level back to simulated time)."""
        k = self.time_scale
        if not spec.goodput_slos_ms or k is None or k == 1.0:
            return {}
        return {"goodput_slos_ms": {name: ms / k for name, ms in spec.goodput_slos_ms.items()}}

    def _twin_clock(self) -> tuple[float, float] | None:
        """The simulated seconds the twin's engine has stepped through and the wall seconds its clock has lost waiting
        for this host (None for a real server, or when the twin does not say)."""
        if not self.simulated:
            return None
        try:
            info = httpx.get(self.base_url + "/server_info", timeout=5.0, trust_env=False).json()
            state = info["internal_states"][0]
            return float(state["busy_s"]), float(state["wall_lag_s"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return None

    def _rescale(self, scale: float) -> bool:
        """Ask the twin to run at `scale` from now on (its /sim/time_scale); True when it did."""
        try:
            answer = httpx.post(self.base_url + "/sim/time_scale", json={"time_scale": scale}, timeout=5.0,
                                trust_env=False)  # fmt: skip
        except httpx.HTTPError:
            return False
        if answer.status_code != 200:
            return False
        self.time_scale = scale
        self.warmup_pause_s = 1.0 / scale
        return True

    def _scaled_progress(self, p: LevelProgress) -> LevelProgress:
        """Progress in the twin's simulated time, as the levels the ledger records are (rates / scale, times x)."""
        k = self.time_scale
        if k is None or k == 1.0:
            return p
        update: dict[str, Any] = {"output_tok_s": p.output_tok_s / k, "elapsed_s": p.elapsed_s * k}
        if p.level is not None:
            update["level"] = self._scaled(p.level)
        return p.model_copy(update=update)

    def _scaled(self, level: m.BenchLevel) -> m.BenchLevel:
        """A level measured against the twin served `time_scale` times faster than its simulated GPUs, converted to
        simulated time (times x scale, rates / scale) so it reads like `sim` and like the GPUs it stands for. The
        client's own delays are magnified with it, and the peak is over scale-second buckets: the note says so."""
        k = self.time_scale
        if k is None or k == 1.0:
            return level
        data = level.model_dump()
        for key, value in data.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if key == "duration" or (key.endswith("_ms") and key not in CLIENT_DELAY_KEYS):
                data[key] = value * k
            elif key in RATE_KEYS:
                data[key] = value / k
        note = (
            f"the twin ran {k:g}x faster than its simulated GPUs: times and rates are converted to simulated time "
            f"(wall-clock x {k:g}), so the client's own overhead counts {k:g}x too, and the peak is over "
            f"{k:g}-second buckets; a lower time scale is closer to the GPUs"
        )
        data["warnings"] = [*level.warnings, note]
        if isinstance(data.get("goodput_slos_ms"), dict):  # the SLOs the wall-clock level was judged by, scaled back
            data["goodput_slos_ms"] = {name: round(ms * k, 6) for name, ms in data["goodput_slos_ms"].items()}
        return m.BenchLevel.model_validate(data)
