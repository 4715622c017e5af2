"""The digital twin: SGLang's flags resolved as SGLang resolves them, then a sweep simulated in virtual time.

`Twin.build()` parses the flags with the SGLang catalog (so bad flags fail with SGLang's own message),
resolves the automatic values (memory fraction, KV pool, max running requests, chunked prefill,
CUDA-graph sizes) the way SGLang 0.5.23 does for the hardware profile, and checks the declared startup
faults. `Twin.run_level()` / `Twin.predict()` simulate benchmark levels and return bench_serving's
numbers (computed by tools/metrics.py from simulated per-request timelines) plus the engine's view:
power per GPU, KV usage, the step-time breakdown and any fault under load.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agent import models as m
from agent.errors import PivotError
from tools.engines.sim.costmodel import MIN_CLOCK, CostModel, Parallel
from tools.engines.sim.scheduler import LevelSimulation, SchedulerLimits, simulate_level
from tools.metrics import compute_level, failed_goodput, workload_draws
from tools.profiles import Fault, HardwareProfile, ModelProfile, load_hardware, load_model

GIB = 1 << 30

# Flags (argparse dests) whose effect the cost model or the scheduler represents.
MODELLED = frozenset(
    {
        "model_path", "tp_size", "pp_size", "ep_size", "dp_size", "attn_dp_size", "enable_dp_attention",
        "max_running_requests", "mem_fraction_static", "chunked_prefill_size", "max_prefill_tokens",
        "max_total_tokens", "cuda_graph_max_bs_decode", "disable_cuda_graph", "disable_decode_cuda_graph",
        "cuda_graph_backend_decode", "kv_cache_dtype", "disable_overlap_schedule", "enable_mscclpp",
        "enable_single_batch_overlap", "enable_two_batch_overlap", "moe_a2a_backend", "schedule_conservativeness",
        "host", "port", "enable_metrics", "served_model_name", "trust_remote_code", "load_format",
        "skip_tokenizer_init", "log_level", "page_size", "pp_max_micro_batch_size",
    }
)  # fmt: skip


class TwinStartupError(PivotError):
    """The simulated server would not start: the log line SGLang prints and the crash class."""

    def __init__(self, message: str, log: str, classify: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.log, self.classify, self.exit_code = log, classify, exit_code


NOT_SIMULABLE = "not-simulable"  # the crash class of values SGLang accepts but the twin cannot simulate

# SGLang 0.5.23's own checks on single values, in its words (sglang/srt/arg_groups/validation_hook.py::
# check_server_args: AssertionError with these messages); the catalog's invalid combinations carry the same.
SGLANG_VALUE_CHECKS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("pp_max_micro_batch_size", lambda v: v is not None and v < 1,
     "pp_max_micro_batch_size must be a positive integer or None (for auto-compute). Got: {v}"),
    ("schedule_conservativeness", lambda v: v is not None and v < 0, "schedule_conservativeness must be non-negative"),
    ("base_gpu_id", lambda v: v is not None and v < 0, "base_gpu_id must be non-negative"),
    ("gpu_id_step", lambda v: v is not None and v < 1, "gpu_id_step must be positive"),
)  # fmt: skip
# What the twin needs of values SGLang's parser takes as they come: dest, the test a value must pass, and what
# the value must be (in words).
TWIN_NEEDS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("tp_size", lambda v: v >= 1, "an integer >= 1"),
    ("pp_size", lambda v: v >= 1, "an integer >= 1"),
    ("ep_size", lambda v: v >= 1, "an integer >= 1"),
    ("dp_size", lambda v: v >= 1, "an integer >= 1"),
    ("attn_dp_size", lambda v: v >= 1, "an integer >= 1"),
    ("mem_fraction_static", lambda v: math.isfinite(v) and 0 < v <= 1, "a fraction in (0, 1]"),
    ("max_running_requests", lambda v: v >= 1, "an integer >= 1"),
    ("max_prefill_tokens", lambda v: v >= 1, "an integer >= 1"),
    ("max_total_tokens", lambda v: v >= 1, "an integer >= 1"),
    ("page_size", lambda v: v >= 1, "an integer >= 1"),
    ("chunked_prefill_size", lambda v: v <= 1 << 24, "at most 16777216 (or -1: no chunking)"),
    ("cuda_graph_max_bs_decode", lambda v: v >= 1, "an integer >= 1"),
    ("schedule_conservativeness", lambda v: math.isfinite(v), "a finite number"),
)


def _check_values(args: dict[str, Any]) -> None:
    """Refuse, before anything is computed from them, the values SGLang's own checks refuse (in its words, as
    argument-validation) and the values it takes but the twin cannot simulate (a clear startup error)."""
    for dest, refused, text in SGLANG_VALUE_CHECKS:
        v = args.get(dest)
        if isinstance(v, int | float) and refused(v):
            message = text.format(v=v)
            raise TwinStartupError(
                f"SGLang refuses --{dest.replace('_', '-')} {v}: {message}",
                log=f"AssertionError: {message}",
                classify="argument-validation",
            )
    for dest, ok, needed in TWIN_NEEDS:
        v = args.get(dest)
        if v is None or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if not ok(v):
            flag = "--" + dest.replace("_", "-")
            raise TwinStartupError(
                f"the twin cannot simulate {flag} {v}: it must be {needed} (SGLang 0.5.23's parser accepts it; "
                "a real server would fail later or behave in ways the twin does not model)",
                log=f"pivot twin: cannot simulate {flag} {v}: it must be {needed}",
                classify=NOT_SIMULABLE,
            )


def _parse(config: m.ServerConfig, version: str) -> tuple[dict[str, Any], list[str], list[str], list[str]]:
    """SGLang's parse of `config`: dest -> value (defaults included), the dests the user set, those of them
    this version reads nowhere (the catalog's no-op flags), and SGLang's deprecation warnings.
    Bad flags raise CatalogError with SGLang's own message."""
    from tools.engines.catalog import load_catalog

    catalog = load_catalog("sglang", version)
    parsed = catalog.parse_args(config.argv(), require_model=False)
    given, no_effect = [], []
    for flag in config.flags:
        spec = catalog.resolve(flag.name)
        if isinstance(spec, str):
            continue
        given.append(spec.dest)
        if catalog.noop_note(spec) is not None:
            no_effect.append(spec.dest)
    return parsed.values, list(dict.fromkeys(given)), list(dict.fromkeys(no_effect)), parsed.warnings


def not_modelled_flags(config: m.ServerConfig, version: str = "0.5.23") -> list[str]:
    """The flags of `config`, as typed, that SGLang reads but the twin does not model: a change of them alone leaves
    the twin's numbers as they were, so the twin cannot measure it. Flags SGLang refuses, and flags SGLang itself
    reads nowhere (no-ops: the twin's "no change" is right for them), are not in the list."""
    from tools.engines.catalog import load_catalog

    catalog = load_catalog("sglang", version)
    out: list[str] = []
    for flag in config.flags:
        spec = catalog.resolve(flag.name)
        if isinstance(spec, str) or spec.dest in MODELLED or catalog.noop_note(spec) is not None:
            continue
        out.append(flag.name)
    return list(dict.fromkeys(out))


@dataclass
class Twin:
    """One simulated SGLang server: model, hardware, resolved flags, cost model and scheduler limits."""

    model: ModelProfile
    hw: HardwareProfile
    gpus: int
    config: m.ServerConfig
    args: dict[str, Any]
    par: Parallel
    cost: CostModel
    limits: SchedulerLimits
    resolved: dict[str, Any]
    not_modelled: list[str] = field(default_factory=list)
    no_effect: list[str] = field(default_factory=list)
    load_faults: list[Fault] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # SGLang's deprecation warnings for these flags
    power_limit_w: float | None = None  # the GPUs' power limit below their TDP (a power item), else None

    @classmethod
    def build(
        cls,
        model_profile: str | ModelProfile,
        hardware: str | HardwareProfile,
        gpus: int,
        config: m.ServerConfig,
        version: str = "0.5.23",
    ) -> Twin:
        """Resolve flags and memory like SGLang; raise TwinStartupError where SGLang would not start."""
        args, given, no_effect, warnings = _parse(config, version)
        twin = cls.from_args(model_profile, hardware, gpus, config, args, given, no_effect)
        twin.warnings = [*warnings, *twin.warnings]
        return twin

    @classmethod
    def from_args(
        cls,
        model_profile: str | ModelProfile,
        hardware: str | HardwareProfile,
        gpus: int,
        config: m.ServerConfig,
        args: dict[str, Any],
        given: list[str],
        no_effect: Sequence[str] = (),
    ) -> Twin:
        """The twin for already-parsed flags (`given`: the dests the user set; `no_effect`: those of them the
        engine reads nowhere); profiles by name or as objects. Without --model-path, the profile's is used."""
        model = load_model(model_profile) if isinstance(model_profile, str) else model_profile
        if not args.get("model_path"):
            args = {**args, "model_path": model.model_path}
        hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
        if not hw.calibrated:
            raise PivotError(
                f"the twin is not available for {hw.title}: it has no calibrated profile (unknown: "
                f"{', '.join(hw.unknown()) or 'its calibration'})",
                hint="name a shipped hardware profile (tools/profiles/hardware/) or calibrate one "
                "(scripts/calibrate_twin.py)",
            )
        _check_values(args)
        power_limit = _power_limit(config, hw)
        tp, pp = int(args.get("tp_size") or 1), int(args.get("pp_size") or 1)
        ep = int(args.get("ep_size") or 1)
        a2a_backend = _check_topology(args, gpus, tp, pp, ep)
        warnings: list[str] = []
        par = _parallel(args, hw, tp, pp, ep, a2a_backend, warnings)
        cost = CostModel(model, hw, par)
        mem_frac = float(args.get("mem_fraction_static") or hw.auto_mem_fraction_static)
        weights_gib = cost.weight_bytes_per_gpu() / GIB
        pool_gib = hw.memory_gib * mem_frac - weights_gib  # on the stage with the most weights
        kv_tokens = _kv_tokens(args, hw, cost, mem_frac, weights_gib)
        max_running, micro = _max_running(args, model, kv_tokens, pp)
        par = replace(par, cuda_graph_max_bs=min(par.cuda_graph_max_bs, max_running), pp_micro_batch=micro)
        cost = CostModel(model, hw, par)
        chunk, page = _chunk_and_page(args, model, hw, kv_tokens)
        limits = SchedulerLimits(
            max_running_requests=max_running,
            kv_capacity_tokens=kv_tokens,
            chunked_prefill_size=chunk,
            max_prefill_tokens=int(args.get("max_prefill_tokens") or 16384),
            schedule_conservativeness=float(args.get("schedule_conservativeness") or 1.0),
            page_size=page,
        )
        load_faults = [
            f
            for f in hw.faults
            if f.phase == "load"
            and ep >= int(f.when.get("min_ep_size", 1))
            and f.when.get("model_kind", model.kind) == model.kind
        ]
        resolved = {
            "tp_size": tp,
            "pp_size": pp,
            "ep_size": ep,
            "mem_fraction_static": mem_frac,
            "max_total_num_tokens": kv_tokens,
            "max_running_requests": max_running,
            "chunked_prefill_size": chunk,
            "max_prefill_tokens": limits.max_prefill_tokens,
            "cuda_graph_max_bs_decode": par.cuda_graph_max_bs,
            "cuda_graph_decode": par.cuda_graph,
            "page_size": limits.page_size,
            "disable_overlap_schedule": not par.overlap_schedule,
            "kv_cache_dtype": model.default_kv_dtype if par.kv_dtype == "auto" else par.kv_dtype,
            "weights_gib_per_gpu": round(weights_gib, 2),
            "kv_pool_gib_per_gpu": round(max(pool_gib, 0), 2),
            "power_limit_w": power_limit or hw.tdp_w,
        }
        return cls(
            model=model,
            hw=hw,
            gpus=gpus,
            config=config,
            args=args,
            par=par,
            cost=cost,
            limits=limits,
            resolved=resolved,
            not_modelled=[d for d in given if d not in MODELLED and d not in no_effect],
            no_effect=list(no_effect),
            load_faults=load_faults,
            warnings=warnings,
            power_limit_w=power_limit,
        )

    def workload(self, spec: m.BenchSpec, concurrency: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """bench_serving's input lengths, output lengths and arrival times for one level (seeded by the spec)."""
        inputs, outputs, _, arrivals = workload_draws(spec, spec.prompts_for(concurrency))
        return inputs, outputs, arrivals

    def simulate(self, spec: m.BenchSpec, concurrency: int, *, noise: float = 0.0, seed: int | None = None,
                 check: Callable[[], None] | None = None) -> LevelSimulation:  # fmt: skip
        """Simulate one level of `spec` at `concurrency` (under a power limit, at the clock that holds it)."""
        sim = self._simulate_at(1.0, spec, concurrency, noise, seed, check)
        if self.power_limit_w is None or self.power_w(sim, limited=False) <= self.power_limit_w:
            return sim
        return self._clocked(sim, spec, concurrency, noise, seed, check)

    def _clocked(self, full: LevelSimulation, spec: m.BenchSpec, concurrency: int, noise: float, seed: int | None,
                 check: Callable[[], None] | None) -> LevelSimulation:  # fmt: skip
        """The level at the SM clock share c where the power model meets the limit (costmodel.py): a guess with
        the wall time held, then c from the wall time fitted as A + B / c through both simulations."""
        cap, hw, cal = float(self.power_limit_w or self.hw.tdp_w), self.hw, self.hw.calibration
        budget = (cap - hw.idle_w) / ((hw.tdp_w - hw.idle_w) * cal.power_activity)  # w u_t c^2 + u_m at the cap
        weight = cal.power_compute_weight * full.tensor_s

        def clock_for(wall: Callable[[float], float]) -> float:
            lo, hi = MIN_CLOCK, 1.0
            for _ in range(40):  # bisection on the model alone: no simulation
                c = (lo + hi) / 2
                lo, hi = (c, hi) if (weight * c * c + full.memory_s) / wall(c) <= budget else (lo, c)
            return lo

        c1 = clock_for(lambda c: full.wall_s)
        guess = self._simulate_at(c1, spec, concurrency, noise, seed, check)
        if c1 >= 1.0 - 1e-6 or abs(guess.wall_s - full.wall_s) < 1e-12:
            return guess
        b = (guess.wall_s - full.wall_s) / (1 / c1 - 1.0)
        a = full.wall_s - b
        c2 = clock_for(lambda c: max(a + b / c, 1e-9))
        return self._simulate_at(c2, spec, concurrency, noise, seed, check)

    def _simulate_at(self, clock: float, spec: m.BenchSpec, concurrency: int, noise: float, seed: int | None,
                     check: Callable[[], None] | None) -> LevelSimulation:  # fmt: skip
        inputs, outputs, arrivals = self.workload(spec, concurrency)
        fault = self.load_faults[0] if self.load_faults else None
        cost = self.cost if clock >= 1.0 else CostModel(self.model, self.hw, self.par, clock=clock)
        sim = simulate_level(
            cost,
            self.limits,
            max_concurrency=concurrency,
            input_lens=inputs,
            output_lens=outputs,
            arrivals_s=arrivals,
            seed=(spec.seed if seed is None else seed) * 1_000_003 + concurrency,
            noise=noise,
            fault=fault,
            ignore_eos=spec.ignore_eos,
            check=check,
        )
        sim.clock = cost.clock
        return sim

    def power_w(self, sim: LevelSimulation, *, limited: bool = True) -> float:
        """Mean power per GPU over a simulated level, from its tensor-core and memory use at its clock
        (costmodel.power_w); never above the power limit (the driver holds it) unless `limited` is False."""
        cost = self.cost if sim.clock >= 1.0 else CostModel(self.model, self.hw, self.par, clock=sim.clock)
        power = cost.power_w(sim.tensor_s / sim.wall_s, sim.memory_s / sim.wall_s)
        return min(power, self.power_limit_w) if limited and self.power_limit_w is not None else power

    def level(self, spec: m.BenchSpec, sim: LevelSimulation, concurrency: int,
              check: Callable[[], None] | None = None) -> m.BenchLevel:  # fmt: skip
        """The simulated level in bench_serving's keys, plus mean_gpu_power_w and max_token_usage."""
        level = compute_level(
            sim.records,
            max_concurrency=concurrency,
            request_rate=spec.request_rate,
            backend="sglang",
            dataset_name=spec.dataset_name,
            random_input_len=spec.random_input_len,
            random_output_len=spec.random_output_len,
            random_range_ratio=spec.random_range_ratio,
            check=check,
            goodput_slos_ms=spec.goodput_slos_ms,
        )
        power = self.power_w(sim)
        joules = power * self.par.gpus * sim.wall_s
        return m.BenchLevel(
            **level.model_dump(exclude={"mean_gpu_power_w", "energy_per_output_token_j"}),
            mean_gpu_power_w=round(power, 1),
            energy_per_output_token_j=round(joules / level.total_output_tokens, 4)
            if level.total_output_tokens
            else None,
            max_token_usage=round(sim.max_token_usage, 4),
        )

    def telemetry(self, sim: LevelSimulation, concurrency: int) -> m.Telemetry:
        """Simulated per-GPU telemetry for a level (every GPU of the layout alike)."""
        power = self.power_w(sim)
        busy = min(sim.busy_s / sim.wall_s, 1.0)
        gpu = {
            "name": self.hw.title,
            "samples": 1,
            "power_w_mean": round(power, 1),
            "power_w_p95": round(power, 1),
            "power_w_max": round(power, 1),
            "power_limit_w": self.power_limit_w or self.hw.tdp_w,
            "util_gpu_pct_mean": round(100 * busy, 1),
            "sm_clock_mhz_mean": round(self.hw.sm_clock_mhz * sim.clock, 1) if self.hw.sm_clock_mhz else None,
            "energy_j": round(power * sim.wall_s, 1),
            "energy_source": "model",
        }
        return m.Telemetry(
            source="simulated",
            max_concurrency=concurrency,
            gpus=[m.GpuTelemetry(gpu=i, **gpu) for i in range(self.par.gpus)],
        )

    def predict(
        self,
        spec: m.BenchSpec,
        *,
        noise: float = 0.0,
        down: bool = False,
        seed: int | None = None,
        check: Callable[[], None] | None = None,
    ) -> list[tuple[m.BenchLevel, LevelSimulation]]:
        """Every level of `spec`; once the server is down (a fault under load, or `down`) later levels all fail.
        `seed` draws the noise (default: the workload's seed); the workload itself always comes from the spec."""
        out = []
        for concurrency in spec.concurrency:
            if down:
                n = spec.prompts_for(concurrency)
                sim = LevelSimulation(records=[], busy_s=0.0, wall_s=1e-9, breakdown_s={}, max_token_usage=0.0,
                                      decode_steps=0, prefill_steps=0, retractions=0)  # fmt: skip
                level = m.BenchLevel(
                    **compute_level([], max_concurrency=concurrency).model_dump(exclude={"failed", "errors"}),
                    failed=n,
                    errors={"connection refused (server is down)": n},
                    **failed_goodput(spec.goodput_slos_ms),
                )
                out.append((level, sim))
                continue
            sim = self.simulate(spec, concurrency, noise=noise, seed=seed, check=check)
            out.append((self.level(spec, sim, concurrency, check), sim))
            down = sim.fault is not None
        return out

    def startup_line(self) -> str:
        """The line SGLang's scheduler logs once its memory pools are sized."""
        r = self.resolved
        available = self.hw.memory_gib * (1 - r["mem_fraction_static"])
        return (
            f"max_total_num_tokens={r['max_total_num_tokens']}, chunked_prefill_size={r['chunked_prefill_size']}, "
            f"max_prefill_tokens={r['max_prefill_tokens']}, max_running_requests={r['max_running_requests']}, "
            f"context_len={self.model.context_length}, available_gpu_mem={available:.2f} GB"
        )

    def server_info(self) -> dict[str, Any]:
        """What `GET /server_info` reports: the resolved args, what is not modelled, and the model path."""
        return {
            "engine": "pivot-sim (digital twin of SGLang 0.5.23)",
            "model_path": self.args["model_path"],
            "hardware": self.hw.name,
            "gpus": self.gpus,
            "resolved": self.resolved,
            "not_modelled": self.not_modelled,
            "no_effect_in_0_5_23": self.no_effect,
            "max_total_num_tokens": self.limits.kv_capacity_tokens,
            "launch_flags": self.config.argv(),
        }


POWER_LIMIT_REFUSED = "power-limit"  # the crash class of a power limit the GPUs do not take


def _power_limit(config: m.ServerConfig, hw: HardwareProfile) -> float | None:
    """The config's GPU power limit when it is below the TDP (None: full power); one outside the GPU's range is
    refused as NVML refuses it (nvmlDeviceSetPowerManagementLimit: Invalid Argument)."""
    watts = config.gpu_power_limit_w
    if watts is None:
        return None
    lo, hi = hw.power_limit_range_w
    if not lo <= watts <= hi:
        raise TwinStartupError(
            f"the {hw.title} takes power limits from {lo:g} to {hi:g} W, not {watts:g} W",
            log=f"pivot: nvmlDeviceSetPowerManagementLimit({watts * 1000:.0f} mW): Invalid Argument "
            f"(constraints {lo * 1000:.0f}..{hi * 1000:.0f} mW)",
            classify=POWER_LIMIT_REFUSED,
        )
    return float(watts) if watts < hw.tdp_w else None


def _check_topology(args: dict[str, Any], gpus: int, tp: int, pp: int, ep: int) -> str:
    """SGLang's refusals of a parallel layout (too few GPUs, ep not dividing tp, two-batch overlap without
    an all-to-all backend); the MoE all-to-all backend it resolves to."""
    dp = int(args.get("dp_size") or 1)
    attn_dp = int(args.get("attn_dp_size") or 1)
    if args.get("enable_dp_attention"):
        attn_dp = max(attn_dp, tp)
    if tp * pp * dp > gpus:
        raise TwinStartupError(
            f"tp_size * pp_size * dp_size = {tp * pp * dp} needs more GPUs than the {gpus} available",
            log=f"RuntimeError: CUDA error: invalid device ordinal (world size {tp * pp * dp} > {gpus} GPUs)",
            classify="cuda-error",
        )
    if ep > 1 and tp % ep:
        raise TwinStartupError(
            f"tp_size {tp} is not a multiple of ep_size {ep}",
            log=f"ValueError: tp_size ({tp}) must be divisible by ep_size ({ep})",
            classify="argument-validation",
        )
    a2a_backend = args.get("moe_a2a_backend") or "none"
    if args.get("enable_two_batch_overlap") and a2a_backend == "none" and attn_dp <= 1:
        raise TwinStartupError(
            "two-batch overlap needs an all-to-all MoE backend or attention data parallelism",
            log="ValueError: Two-batch overlap requires --moe-a2a-backend to be set (not 'none') "
            "or data-parallel attention to be enabled.",
            classify="argument-validation",
        )
    return a2a_backend


def _parallel(
    args: dict[str, Any], hw: HardwareProfile, tp: int, pp: int, ep: int, a2a_backend: str, warnings: list[str]
) -> Parallel:
    """The cost model's parallel layout and execution switches, before the running-request cap is known."""
    overlap = not args.get("disable_overlap_schedule")
    if pp > 1 and overlap:  # SGLang's post-process hook (arg_groups/overrides.py) turns it off
        overlap = False
        warnings.append("Pipeline parallelism is incompatible with overlap schedule.")
    graph_backend = str(args.get("cuda_graph_backend_decode") or "full")
    cuda_graph = not (
        args.get("disable_cuda_graph") or args.get("disable_decode_cuda_graph") or graph_backend == "disabled"
    )
    big = 90 <= hw.memory_gib <= 160
    graph_bs = args.get("cuda_graph_max_bs_decode") or (512 if tp >= 4 and big else 256)
    return Parallel(
        tp=tp,
        pp=pp,
        ep=ep,
        kv_dtype=str(args.get("kv_cache_dtype") or "auto"),
        cuda_graph_max_bs=int(graph_bs),
        cuda_graph=cuda_graph,
        overlap_schedule=overlap,
        mscclpp=bool(args.get("enable_mscclpp")),
        single_batch_overlap=bool(args.get("enable_single_batch_overlap")) and (ep > 1 or a2a_backend != "none"),
    )


def _kv_tokens(args: dict[str, Any], hw: HardwareProfile, cost: CostModel, mem_frac: float, weights_gib: float) -> int:
    """The KV pool in tokens (capped by --max-total-tokens); a pool under a startup fault's bound is out of memory."""
    kv_tokens = cost.kv_capacity_tokens(hw.memory_gib * mem_frac * GIB)
    if args.get("max_total_tokens"):
        kv_tokens = min(kv_tokens, int(args["max_total_tokens"]))
    for fault in hw.faults:
        if fault.phase == "startup" and "max_kv_tokens" in fault.when and kv_tokens <= fault.when["max_kv_tokens"]:
            raise TwinStartupError(
                f"out of memory at startup: weights take {weights_gib:.1f} GiB per GPU of the "
                f"{hw.memory_gib * mem_frac:.1f} GiB that --mem-fraction-static {mem_frac} allows",
                log=fault.log,
                classify=fault.classify,
            )
    return kv_tokens


def _max_running(args: dict[str, Any], model: ModelProfile, kv_tokens: int, pp: int) -> tuple[int, int]:
    """The running-request cap and the pipeline micro-batch size, as SGLang resolves them."""
    max_running = args.get("max_running_requests")
    if max_running is None:
        auto = min(max(kv_tokens / model.context_length * 512, 2048), 4096)
        max_running = int(min(auto, kv_tokens // 2))
    max_running = int(max_running)
    # SGLang's default pp_max_micro_batch_size: max running requests split over the pipeline stages
    micro = int(args.get("pp_max_micro_batch_size") or max(max_running // pp, 1))
    max_running = min(max_running, micro * pp)  # each micro-batch admits up to `micro` (SGLang's pp_budget)
    return max_running, micro


def _chunk_and_page(args: dict[str, Any], model: ModelProfile, hw: HardwareProfile, kv_tokens: int) -> tuple[int, int]:
    """The chunked-prefill size and page size, refused as SGLang (or the twin) refuses them."""
    chunk = args.get("chunked_prefill_size")
    if chunk is None:
        big = 90 <= hw.memory_gib <= 160
        chunk = 2048 if hw.memory_gib < 35 else 4096 if hw.memory_gib < 90 else 8192 if big else 16384
    page = int(args.get("page_size") or model.default_page_size)
    if int(chunk) > 0 and int(chunk) % page:  # SGLang's check_server_args, on the resolved values
        message = "chunked_prefill_size must be divisible by page_size"
        raise TwinStartupError(
            f"SGLang refuses chunked_prefill_size {int(chunk)} with page_size {page}: {message}",
            log=f"AssertionError: {message}",
            classify="argument-validation",
        )
    if kv_tokens < page:
        raise TwinStartupError(
            f"the twin cannot simulate --page-size {page}: the KV pool ({kv_tokens} tokens) holds not one page",
            log=f"pivot twin: cannot simulate a KV pool of {kv_tokens} tokens with page_size {page}",
            classify=NOT_SIMULABLE,
        )
    return int(chunk), page
