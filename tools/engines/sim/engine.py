"""The `sim` engine: the digital twin behind the Engine and Deployment protocols, in virtual time, in process."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from agent import models as m
from agent.contracts import EngineOptions, LedgerLink, LevelCallback, Predictor, ProgressCallback
from agent.errors import LaunchFailed, PivotError
from tools.engines.base import CatalogEngine
from tools.engines.catalog import CatalogError
from tools.engines.sglang import FAILURE_RULES as SGLANG_FAILURE_RULES
from tools.engines.sim.options import SimOptions
from tools.engines.sim.predictor import build_twin, twin_predictor
from tools.engines.sim.scheduler import LevelSimulation, SimulationStopped
from tools.engines.sim.twin import Twin, TwinStartupError, not_modelled_flags

VERSION = "0.5.23"


class SimLaunchError(LaunchFailed):
    """The simulated server did not start; `failure` is the crash class pivot records."""

    def __init__(self, message: str, failure: str, hint: str | None = None) -> None:
        super().__init__(message, hint, failure=failure)


class SimDeployment:
    """A running twin: benchmarks answer in virtual time (seconds of CPU for minutes of GPU time)."""

    argv: list[str] | None = None  # nothing is launched: the twin runs in this process

    def __init__(self, twin: Twin, log_path: Path, noise: float, seed: int | None = None) -> None:
        self.twin, self.noise, self.seed = twin, noise, seed
        self.log_path: Path | None = log_path
        self.base_url = f"sim://{twin.model.name}@{twin.gpus}x{twin.hw.name}"
        self._alive = True
        self._last: m.Telemetry | None = None
        self._lines: list[str] = []
        self.level_telemetry: list[m.Telemetry] = []  # per level of the last benchmark(), as HttpDeployment has it
        self.failure: str | None = None  # the crash class of a fault under load, once one happened
        self._sims: list[LevelSimulation] = []
        self._log(twin.startup_line())
        self._log("The server is fired up and ready to roll!")

    def _log(self, line: str) -> None:
        self._lines.append(line)
        assert self.log_path is not None
        with self.log_path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")

    def wait_ready(self, timeout_s: float, on_progress: ProgressCallback | None = None) -> None:
        if not self._alive:
            raise PivotError("the simulated server is not running")

    def alive(self) -> bool:
        return self._alive

    def log_tail(self, n: int = 50) -> list[str]:
        return self._lines[-n:]

    def benchmark(
        self,
        spec: m.BenchSpec,
        on_progress: ProgressCallback | None = None,
        *,
        on_level: LevelCallback | None = None,
        output_file: Path | None = None,
    ) -> m.BenchResult:
        """Simulate the sweep; a fault under load is logged, its level's requests fail, and the server is down.

        `on_level` gets a finished LevelProgress per level, `output_file` one JSON line per level, as over HTTP."""
        from tools import loadgen
        from tools.engines import process

        result = m.BenchResult(
            spec=spec, engine="sim", source="simulated", raw_path=str(output_file) if output_file else None
        )
        self.level_telemetry, self._sims = [], []
        signals = process.signals_received()
        alive = self._alive

        def check() -> None:  # SIGTERM/SIGINT since it began, or stopped (a TUI cancel): end within a second
            if process.signals_received() != signals or (alive and not self._alive):
                raise SimulationStopped("the simulated benchmark was stopped before it finished")

        levels = self.twin.predict(spec, noise=self.noise, down=not alive, seed=self.seed, check=check)
        for index, (level, sim) in enumerate(levels):
            result.levels.append(level)
            if output_file is not None:
                loadgen.append_jsonl(output_file, level)
            if on_level is not None:
                on_level(loadgen.LevelProgress(
                    phase="done", level_index=index, levels_total=len(spec.concurrency),
                    max_concurrency=level.max_concurrency or 0, requests_total=level.completed + level.failed,
                    requests_done=level.completed + level.failed, requests_failed=level.failed,
                    output_tokens=level.total_output_tokens, elapsed_s=level.duration,
                    output_tok_s=level.output_throughput, level=level,
                ))  # fmt: skip
            if not sim.records:  # the server was already down: nothing ran
                continue
            self._sims.append(sim)
            self._last = self.twin.telemetry(sim, level.max_concurrency or 0)
            self.level_telemetry.append(self._last)
            self._log(
                f"Decode batch, #running-req: {min(level.max_concurrency or 0, self.twin.limits.max_running_requests)}, "
                f"token usage: {sim.max_token_usage:.2f}, gen throughput (token/s): {level.output_throughput:.2f}"
            )
            if on_progress:
                on_progress(
                    f"concurrency {level.max_concurrency}: {level.output_throughput:,.0f} output tok/s (simulated)"
                )
            if sim.fault is not None:
                self._log(sim.fault.log)
                self._alive = False
                self.failure = sim.fault.classify
        result.finished_at = m.utcnow()
        return result

    def telemetry(self) -> m.Telemetry:
        return self._last or m.Telemetry(source="simulated", gpus=[])

    def metrics(self) -> dict[str, Any]:
        """The in-process twin serves no /metrics: its resolved limits and the last level's readings."""
        return {
            "source": "simulated",
            "resolved": self.twin.resolved,
            "last_level": self.telemetry().model_dump(mode="json"),
        }

    def profile(self, out_dir: Path, spec: m.BenchSpec | None = None) -> m.ProfileSummary:
        """The twin's step-time breakdown of the last benchmark (no load is run, no trace is written)."""
        from tools.profile import summarize_twin

        return summarize_twin(self.profile_breakdown())

    def profile_breakdown(self) -> dict[str, object]:
        """The step-time breakdown of the last benchmark's top level, as the twin's /stop_profile answers it."""
        if not self._sims:
            raise PivotError("nothing has run on this server yet: benchmark it before profiling")
        sim = max((s for s in self._sims if s.records), key=lambda s: len(s.records))
        total = sum(sim.breakdown_s.values())
        return {
            "simulated": True,
            "window_s": sim.wall_s,
            "step_time_s": total,
            "busy_s": sim.busy_s,
            "prefill_steps": sim.prefill_steps,
            "decode_steps": sim.decode_steps,
            "breakdown": {
                k: {"seconds": v, "share": v / total if total > 0 else 0.0} for k, v in sim.breakdown_s.items()
            },
        }

    def stop(self) -> None:
        self._alive = False


class SimEngine(CatalogEngine):
    """The digital twin of SGLang 0.5.23 on simulated GPUs (in process, virtual time)."""

    name = "sim"
    version = VERSION
    catalog_engine = "sglang"
    ready_timeout_s = 60.0
    failure_rules = SGLANG_FAILURE_RULES  # the twin writes SGLang's words
    parallel_dests: ClassVar[Mapping[str, str]] = {"tp": "tp_size", "pp": "pp_size", "ep": "ep_size", "dp": "dp_size"}
    dp_within_tp_dest: ClassVar[str | None] = "enable_dp_attention"  # DP attention: the DP ranks share the TP GPUs

    Options: ClassVar[type[EngineOptions] | None] = SimOptions
    require_model = False  # the twin serves a model profile, not a model path

    def __init__(self, *profile: object, **options: object) -> None:
        """Options (SimOptions): `model_profile`, `hardware`, `gpus`, `noise`, `seed`, by name or in that order."""
        names = list(SimOptions.model_fields)
        if len(profile) > len(names):
            raise TypeError(f"SimEngine takes at most {len(names)} options by position ({', '.join(names)})")
        o = self.setup({**dict(zip(names, profile, strict=False)), **options})
        assert isinstance(o, SimOptions)
        self.model_profile, self.hardware, self.gpus, self.noise = o.model_profile, o.hardware, o.gpus, o.noise
        self.seed, self.truth = o.seed, o.truth
        if o.truth:
            from tools.engines.sim.truth import load_truth

            load_truth(o.truth)  # a truth file that does not read is refused before anything is recorded

    def with_seed(self, seed: int) -> SimEngine:
        """The same engine drawing its noise from `seed` (the agent seeds each experiment on its own)."""
        assert isinstance(self.options, SimOptions)
        return SimEngine(**{**self.options.model_dump(), "seed": seed})

    def not_modelled(self, config: m.ServerConfig) -> list[str]:
        """The flags of `config` SGLang reads but the twin does not model: their effect is never simulated."""
        return not_modelled_flags(config, VERSION)

    def predictor(self, target: m.Target) -> Predictor | None:
        """The twin itself, noise-free, for this engine's profiles and GPUs (the stock twin, with a truth too: the
        truth is what the engine measures, never what it predicts)."""
        return twin_predictor(self.model_profile, self.hardware, self.gpus)

    def start(
        self, config: m.ServerConfig, log_path: Path, *, ledger: LedgerLink | None, issues: list[m.FlagIssue]
    ) -> SimDeployment:
        """Build the twin for `config`; SGLang's refusals and startup faults raise SimLaunchError (the twin parses
        with SGLang's parser, forced or not; nothing is launched, so nothing is recorded in `ledger`)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            twin = build_twin(self.model_profile, self.hardware, self.gpus, config, self.truth, VERSION)
        except CatalogError as e:
            log_path.write_text(e.stderr, encoding="utf-8")
            kind = "ambiguous-argument" if "ambiguous" in e.message else "unrecognized-argument"
            if "unrecognized" not in e.message and "ambiguous" not in e.message:
                kind = "argument-validation"
            raise SimLaunchError(f"SGLang refused the flags: {e.message}", kind, hint=e.hint) from e
        except TwinStartupError as e:
            log_path.write_text(e.log + "\n", encoding="utf-8")
            raise SimLaunchError(f"the server did not start: {e.message}", e.classify, hint=e.log) from e
        return SimDeployment(twin, log_path, self.noise, self.seed)
