"""The shared vocabulary of pivot: every module, engine, tool and report speaks these models.

Names follow the field: SGLang's flags keep SGLang's spelling, benchmark results keep
`sglang.bench_serving`'s JSON keys, and numbers of our own carry their unit in their name.
"""

from __future__ import annotations

import hashlib
import math
import re
import shlex
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent.errors import PivotError


def utcnow() -> datetime:
    """The current time in UTC, the only clock the ledger records."""
    return datetime.now(UTC)


class _Model(BaseModel):
    """Base of our own models: unknown fields are errors, so a typo in a plan or a tool call is caught."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


# --------------------------------------------------------------------------------------------------
# Server configuration: ordered flags, as typed, in SGLang's spelling.

_FLAG_NAME = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_.-]*$|^-[A-Za-z][A-Za-z0-9]*$")  # -x, and vLLM's -tp, -O3


def _is_flag_token(token: str) -> bool:
    """True for `--name`, `--name=value`, `-x` and vLLM's `-tp`; false for values such as `-1` or `0.5`."""
    if token.startswith("--"):
        return len(token) > 2
    return len(token) >= 2 and token[0] == "-" and token[1].isalpha() and "=" not in token


class Flag(_Model):
    """One command-line flag as the user typed it: `--tp-size 8`, `--enable-mscclpp`, `--cuda-graph-bs-decode 1 2 4`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The flag with its dashes, exactly as typed, e.g. `--tp-size`.")
    value: str | tuple[str, ...] | None = Field(
        default=None, description="None for a switch, a string for one value, a tuple for several."
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not _FLAG_NAME.match(name):
            raise ValueError(f"{name!r} is not a command-line flag (flags look like --name)")
        return name

    def argv(self) -> list[str]:
        """The flag and its values as separate argv tokens."""
        if self.value is None:
            return [self.name]
        if isinstance(self.value, tuple):
            return [self.name, *self.value]
        return [self.name, self.value]

    def __str__(self) -> str:
        return shlex.join(self.argv())


SWITCH_ON = "(on)"  # how a diff shows the value of a flag that takes none


class FlagChange(_Model):
    """A flag (or environment variable) whose value differs between two configs; None means absent."""

    name: str
    old: str | None
    new: str | None

    def __str__(self) -> str:
        if self.old is None:
            return self.name if self.new == SWITCH_ON else f"{self.name} {self.new}"
        if self.new is None:
            return f"without {self.name}"
        return f"{self.name} {self.old} -> {self.new}"


class ConfigDiff(_Model):
    """What changed from one ServerConfig to another, flag by flag and variable by variable."""

    flags: list[FlagChange] = []
    env: list[FlagChange] = []

    @property
    def empty(self) -> bool:
        return not self.flags and not self.env

    def __str__(self) -> str:
        parts = [str(c) for c in self.flags] + [f"env {c}" for c in self.env]
        return ", ".join(parts) if parts else "(no change)"


def _render_value(flag: Flag | None) -> str | None:
    if flag is None:
        return None
    return " ".join(flag.argv()[1:])


class ServerConfig(_Model):
    """An engine's command line as ordered flags in the engine's own spelling, plus its environment.

    The order is kept because it is what the user typed and what the launch log shows; when a flag
    appears twice, the last one wins, as with argparse.
    """

    flags: tuple[Flag, ...] = ()
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the server.")

    @classmethod
    def parse(cls, args: str | Sequence[str] | None, env: dict[str, str] | None = None) -> ServerConfig:
        """Build a config from a command-line string (split like a POSIX shell, never run by one) or argv list."""
        if args is None:
            return cls(env=dict(env or {}))
        try:
            tokens = shlex.split(args) if isinstance(args, str) else [str(t) for t in args]
        except ValueError as e:  # an unclosed quote
            raise PivotError(f"cannot split {args!r} into arguments: {e}") from e
        flags: list[Flag] = []
        name: str | None = None
        values: list[str] = []

        def close() -> None:
            if name is not None:
                value: str | tuple[str, ...] | None
                value = None if not values else values[0] if len(values) == 1 else tuple(values)
                flags.append(Flag(name=name, value=value))

        for token in tokens:
            if _is_flag_token(token):
                close()
                name, values = token, []
                if token.startswith("--") and "=" in token:
                    name, _, inline = token.partition("=")
                    values = [inline]
            elif name is None:
                raise PivotError(
                    f"unexpected argument {token!r} before any flag",
                    hint="server configs are flags only, e.g. '--tp-size 8 --enable-mscclpp'",
                )
            else:
                values.append(token)
        close()
        return cls(flags=tuple(flags), env=dict(env or {}))

    @model_validator(mode="before")
    @classmethod
    def _accept_argv(cls, data: Any) -> Any:
        """Plans and tools may give flags as a command-line string or an argv list."""
        try:
            if isinstance(data, str | list):
                return cls.parse(data).model_dump()
            if isinstance(data, dict) and isinstance(data.get("flags"), str | list):
                items = data["flags"]
                if isinstance(items, str) or all(isinstance(t, str) for t in items):
                    return {**data, "flags": cls.parse(items).flags}
        except PivotError as e:
            raise ValueError(e.message) from e
        return data

    def argv(self) -> list[str]:
        """The flags as an argv list, ready for subprocess without a shell."""
        return [token for flag in self.flags for token in flag.argv()]

    def __str__(self) -> str:
        text = shlex.join(self.argv())
        if self.env:
            text = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())) + " " + text
        return text

    def names(self) -> list[str]:
        """Flag names in order of first appearance."""
        return list(dict.fromkeys(f.name for f in self.flags))

    def get(self, name: str) -> Flag | None:
        """The flag with this exact name (the last one, if repeated), or None."""
        found = [f for f in self.flags if f.name == name]
        return found[-1] if found else None

    def __contains__(self, name: object) -> bool:
        return any(f.name == name for f in self.flags)

    def with_flags(self, other: ServerConfig | str | Sequence[str]) -> ServerConfig:
        """A copy with `other`'s flags set: a flag already present is replaced where it stood, new ones go last."""
        extra = other if isinstance(other, ServerConfig) else ServerConfig.parse(other)
        updates = {f.name: f for f in extra.flags}  # the last of a repeated flag wins
        existing = set(self.names())
        out: list[Flag] = []
        for flag in self.flags:
            if flag.name not in updates:
                out.append(flag)
            elif updates[flag.name] not in out:
                out.append(updates[flag.name])
        out.extend(f for name, f in updates.items() if name not in existing)
        return ServerConfig(flags=tuple(out), env={**self.env, **extra.env})

    def without(self, *names: str) -> ServerConfig:
        """A copy without the named flags."""
        drop = set(names)
        return ServerConfig(flags=tuple(f for f in self.flags if f.name not in drop), env=dict(self.env))

    def diff(self, base: ServerConfig) -> ConfigDiff:
        """What this config changes relative to `base`."""
        flags: list[FlagChange] = []
        for name in dict.fromkeys([*base.names(), *self.names()]):
            old, new = base.get(name), self.get(name)
            if old != new:
                old_text = None if old is None else (_render_value(old) or SWITCH_ON)
                new_text = None if new is None else (_render_value(new) or SWITCH_ON)
                flags.append(FlagChange(name=name, old=old_text, new=new_text))
        env = [
            FlagChange(name=k, old=base.env.get(k), new=self.env.get(k))
            for k in sorted(set(base.env) | set(self.env))
            if base.env.get(k) != self.env.get(k)
        ]
        return ConfigDiff(flags=flags, env=env)


# --------------------------------------------------------------------------------------------------
# Benchmarks: the workload, and results with bench_serving's key names.

Endpoint = Literal["generate", "completions", "chat"]


class BenchSpec(_Model):
    """A benchmark workload and the concurrency levels to sweep, in `sglang.bench_serving`'s terms."""

    endpoint: Endpoint = Field(
        default="generate", description="SGLang's native /generate, /v1/completions or /v1/chat/completions."
    )
    dataset_name: Literal["random-ids", "random"] = Field(
        default="random-ids", description="random-ids: random token ids (no download); random: random text."
    )
    random_input_len: int = Field(default=1024, ge=1)
    random_output_len: int = Field(default=1024, ge=1)
    random_range_ratio: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Lengths ~ uniform[max(int(L*ratio), 1), L], as bench_serving."
    )
    concurrency: list[int] = Field(default_factory=lambda: [1, 64, 256], description="max_concurrency per level.")
    num_prompts: int | None = Field(
        default=None, ge=1, description="Prompts per level; None: prompts_per_concurrency x concurrency."
    )
    prompts_per_concurrency: float = Field(default=2.0, gt=0)
    min_prompts: int = Field(default=8, ge=1, description="Floor on prompts per level when num_prompts is None.")
    request_rate: float = Field(default=math.inf, gt=0, description="Requests/s (Poisson arrivals); inf: all at once.")
    warmup_requests: int = Field(default=1, ge=0)
    ignore_eos: bool = True
    seed: int = 42
    request_timeout_s: float = Field(default=600.0, gt=0)

    @field_validator("concurrency")
    @classmethod
    def _check_levels(cls, levels: list[int]) -> list[int]:
        if not levels:
            raise ValueError("at least one concurrency level is needed")
        if any(c < 1 for c in levels):
            raise ValueError("concurrency levels must be positive integers")
        if len(set(levels)) != len(levels):
            raise ValueError("concurrency levels must not repeat")
        return levels

    def prompts_for(self, concurrency: int) -> int:
        """How many measured prompts a level at this concurrency sends."""
        if self.num_prompts is not None:
            return self.num_prompts
        return max(self.min_prompts, math.ceil(concurrency * self.prompts_per_concurrency))

    def workload_key(self) -> str:
        """A short fingerprint of what is measured, concurrency levels aside: equal keys compare fairly."""
        fields = self.model_dump(exclude={"concurrency"})
        text = ",".join(f"{k}={fields[k]!r}" for k in sorted(fields))
        return hashlib.sha256(text.encode()).hexdigest()[:12]


class BenchLevel(BaseModel):
    """One concurrency level's result, with exactly the keys `sglang.bench_serving` writes, plus our own checks.

    Unknown keys from other bench_serving versions are kept (extra="allow") so imported files round-trip.
    """

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    tag: str | None = None
    backend: str | None = None
    dataset_name: str | None = None
    request_rate: float = math.inf
    max_concurrency: int | None = None
    sharegpt_output_len: int | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: float | None = None
    duration: float = Field(description="Seconds from the first measured dispatch to the last completion.")
    completed: int
    total_input_tokens: int
    total_input_text_tokens: int | None = None
    total_input_vision_tokens: int | None = None
    total_output_tokens: int
    total_output_tokens_retokenized: int | None = None
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    mean_e2e_latency_ms: float
    median_e2e_latency_ms: float
    std_e2e_latency_ms: float
    p90_e2e_latency_ms: float
    p95_e2e_latency_ms: float
    p99_e2e_latency_ms: float
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    p90_ttft_ms: float
    p95_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    p90_tpot_ms: float
    p95_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    std_itl_ms: float
    p90_itl_ms: float
    p95_itl_ms: float
    p99_itl_ms: float
    concurrency: float = Field(description="Little's law: sum of e2e latencies / duration.")
    accept_length: float | None = None
    max_output_tokens_per_s: float = Field(description="Peak output tok/s in any 1-second bucket.")
    max_concurrent_requests: int | None = None
    # Our own additions: failures with reasons, and whether the client kept its promise.
    failed: int = 0
    errors: dict[str, int] = Field(default_factory=dict, description="Failure reason -> count.")
    mean_in_flight: float | None = None
    max_in_flight: int | None = None
    mean_dispatch_delay_ms: float | None = None
    max_dispatch_delay_ms: float | None = None
    client_cpu_s: float | None = None
    warnings: list[str] = Field(default_factory=list)

    @classmethod
    def mean(cls, levels: Sequence[BenchLevel]) -> BenchLevel:
        """The mean of runs of one level (reruns of an experiment): every float averaged, counts from the last run.
        A run with failed requests is not averaged away: then the last run is returned as it is."""
        if not levels:
            raise ValueError("no level to average")
        last = levels[-1]
        if len(levels) == 1 or any(lv.failed > 0 for lv in levels):
            return last
        dumps = [lv.model_dump() for lv in levels]
        data = dict(dumps[-1])
        for key, value in dumps[-1].items():
            if isinstance(value, float):
                values = [d.get(key) for d in dumps]
                if all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                    data[key] = sum(values) / len(values)
        return cls.model_validate(data)


Source = Literal["measured", "simulated", "imported"]


class BenchResult(_Model):
    """A sweep: one BenchLevel per concurrency level, and where the numbers came from."""

    spec: BenchSpec
    levels: list[BenchLevel] = []
    engine: str = Field(description="The engine that served the load, e.g. sglang, sim, sim-http.")
    source: Source = Field(description="measured on real hardware, simulated by the twin, or imported from a file.")
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    interrupted: bool = Field(default=False, description="True when the sweep was stopped before its last level.")
    raw_path: str | None = Field(default=None, description="JSONL of the levels, with bench_serving's keys.")

    def level(self, concurrency: int) -> BenchLevel | None:
        """The level run at this max_concurrency, if any."""
        return next((lv for lv in self.levels if lv.max_concurrency == concurrency), None)


class GpuTelemetry(_Model):
    """One GPU over one benchmark level: power, utilization, clocks, memory and energy."""

    gpu: int = Field(ge=0)
    name: str | None = None
    samples: int = 0
    power_w_mean: float | None = None
    power_w_p95: float | None = None
    power_w_max: float | None = None
    power_limit_w: float | None = None
    util_gpu_pct_mean: float | None = None
    util_mem_pct_mean: float | None = None
    sm_clock_mhz_mean: float | None = None
    mem_clock_mhz_mean: float | None = None
    mem_used_mib_max: float | None = None
    temperature_c_max: float | None = None
    energy_j: float | None = Field(default=None, description="From the GPU's total-energy counter.")

    @property
    def power_share_of_limit(self) -> float | None:
        if self.power_w_mean is None or not self.power_limit_w:
            return None
        return self.power_w_mean / self.power_limit_w


class Telemetry(_Model):
    """GPU and server readings over one benchmark level (or a point in time when max_concurrency is None)."""

    source: Literal["measured", "simulated", "unavailable"]
    max_concurrency: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    gpus: list[GpuTelemetry] = []
    server_metrics: dict[str, float] = Field(default_factory=dict, description="From the server's /metrics.")
    error: str | None = Field(default=None, description="Why readings are missing, e.g. no NVML on this host.")
    output_tokens: int | None = Field(default=None, description="Tokens generated during the level, if known.")
    output_tokens_per_j: float | None = Field(
        default=None, description="output_tokens per joule of all GPUs' energy counters over the level."
    )

    @property
    def energy_j(self) -> float | None:
        """Joules of all GPUs together over the level; None unless every GPU has its energy."""
        if not self.gpus or any(g.energy_j is None for g in self.gpus):
            return None
        return sum(g.energy_j or 0.0 for g in self.gpus)


class ProfileCategory(_Model):
    """GPU time of one kind of kernel in a profile window."""

    seconds: float = Field(ge=0, description="Kernel time per GPU (mean over the traced ranks), or the twin's.")
    share: float = Field(ge=0, le=1, description="Of the window's total kernel time.")
    kernels: int | None = Field(default=None, description="Kernel launches counted (traces only).")


class ProfileKernel(_Model):
    """One kernel name's total time in a trace, with the category its name fell into."""

    name: str
    category: str
    seconds: float
    count: int


class ProfileSummary(_Model):
    """Where GPU time went during a profile window: expert GEMMs, other GEMMs, attention, communication, other."""

    source: Literal["measured", "simulated"]
    categories: dict[str, ProfileCategory] = Field(default_factory=dict)
    total_s: float = Field(default=0.0, description="Sum of the categories' seconds.")
    window_s: float | None = Field(default=None, description="From the first kernel's start to the last one's end.")
    busy_s: float | None = Field(default=None, description="Time at least one kernel ran (per GPU, mean).")
    ranks: int = Field(default=1, description="GPUs traced (a device in a trace file; SGLang writes one per rank).")
    trace_files: list[str] = Field(default_factory=list)
    top_kernels: list[ProfileKernel] = Field(default_factory=list)
    max_concurrency: int | None = Field(default=None, description="The load's concurrency while profiling.")
    output_throughput: float | None = Field(default=None, description="The load's output tok/s, if one was run.")
    notes: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# Flags audit.

FlagStatus = Literal["ok", "unknown", "ambiguous", "deprecated", "invalid", "noop"]
BLOCKING_FLAG_STATUSES: frozenset[str] = frozenset({"unknown", "ambiguous", "invalid"})


class FlagIssue(_Model):
    """The audit's verdict on one flag as typed, with what to do instead."""

    flag: str
    status: FlagStatus
    message: str = ""

    @property
    def blocking(self) -> bool:
        """True when the engine would refuse to start with this flag."""
        return self.status in BLOCKING_FLAG_STATUSES


# --------------------------------------------------------------------------------------------------
# Plans.

# flag: a flag flip; config: a configuration change; workload: a different benchmark workload;
# profile: a measurement (a profile of the best config) rather than a change; code: a change for the user to make.
ItemKind = Literal["flag", "config", "workload", "profile", "code"]
# measured: a measurement that changes nothing (a profile of the best configuration), neither kept nor set aside.
# not_measured: the engine does not model the flags the change touches (a simulated engine), so nothing it
# reports says what the change does: it has to be measured on GPUs.
# predicted: not launched because the twin, corrected to the campaign's own measurements, predicts the change inside
# the noise band (or a loss): a prediction, not a measurement; the search may try the item later on a new best.
Verdict = Literal[
    "baseline",
    "adopted",
    "no_gain",
    "regressed",
    "crashed",
    "ruled_out",
    "inconclusive",
    "measured",
    "not_measured",
    "predicted",
]


class Target(_Model):
    """What is being optimized: a model on some GPUs under one serving engine, with its base flags."""

    model: str = Field(description="The model path or hub id the engine serves (`--model-path`).")
    model_profile: str | None = Field(default=None, description="Name of a model profile, e.g. glm-5-nvfp4.")
    hardware: str = Field(description="Name of a hardware profile, e.g. rtx-pro-6000-blackwell.")
    gpus: int = Field(ge=1)
    engine: str = "sglang"
    engine_version: str | None = None
    flags: ServerConfig = Field(default_factory=ServerConfig, description="Base flags every experiment starts from.")

    def base_config(self) -> ServerConfig:
        """The base flags with `--model-path` first unless the flags already name the model."""
        if any(n in self.flags for n in ("--model-path", "--model")):
            return self.flags
        return ServerConfig(flags=(Flag(name="--model-path", value=self.model), *self.flags.flags), env=self.flags.env)


class PlanItem(_Model):
    """One optimization idea: what to change, why, what it should do, and what could go wrong."""

    id: str = Field(pattern=r"^\d{2,3}$", description='"01".."NN": also the number of its improvement document.')
    tier: int = Field(ge=1)
    title: str = Field(min_length=1)
    kind: ItemKind
    flags: ServerConfig | None = Field(default=None, description="Flags set on top of the best config so far.")
    remove_flags: list[str] = Field(default_factory=list, description="Flags removed from the best config.")
    workload: dict[str, Any] | None = Field(default=None, description="Overrides of the plan's workload.")
    change: str | None = Field(default=None, description="For code items: the change for the user to make.")
    hypothesis: str = Field(min_length=1)
    expected_impact: str = Field(min_length=1)
    risks: str = ""

    @model_validator(mode="after")
    def _check_kind(self) -> PlanItem:
        if self.kind in ("flag", "config") and self.flags is None and not self.remove_flags:
            raise ValueError(f"a {self.kind} item needs `flags` or `remove_flags`")
        if self.kind == "workload" and not self.workload:
            raise ValueError("a workload item needs a `workload` table of overrides")
        if self.kind == "code" and not self.change:
            raise ValueError("a code item needs `change`: what the user should change")
        if self.workload:
            BenchSpec.model_validate({**BenchSpec().model_dump(), **self.workload})
        return self

    def apply(self, config: ServerConfig) -> ServerConfig:
        """The config this item proposes, on top of `config`."""
        out = config.without(*self.remove_flags)
        return out.with_flags(self.flags) if self.flags is not None else out

    def workload_for(self, spec: BenchSpec) -> BenchSpec:
        """The workload this item is measured on: the plan's, with this item's overrides."""
        if not self.workload:
            return spec
        return BenchSpec.model_validate({**spec.model_dump(), **self.workload})


class PriorResult(_Model):
    """A finding from before the plan (for example the seeds' TP4+PP2 run), kept so it is not tried again."""

    title: str
    change: str = ""
    flags: ServerConfig | None = None
    finding: str
    verdict: Verdict


class Plan(_Model):
    """A tiered optimization plan: the target, the workload every comparison uses, and the ideas to try."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    title: str
    description: str = ""
    target: Target
    workload: BenchSpec = Field(default_factory=BenchSpec)
    tiers: dict[int, str] = Field(default_factory=dict, description="Tier number -> what kind of changes it holds.")
    items: list[PlanItem] = Field(min_length=1)
    prior: list[PriorResult] = []
    source: str | None = Field(default=None, description="The file the plan was read from.")

    @field_validator("items")
    @classmethod
    def _unique_ids(cls, items: list[PlanItem]) -> list[PlanItem]:
        seen: set[str] = set()
        for item in items:
            if item.id in seen:
                raise ValueError(f"item id {item.id!r} is used twice")
            seen.add(item.id)
        return items

    def item(self, item_id: str) -> PlanItem:
        """The item with this id; a PivotError naming the known ids if there is none."""
        for it in self.items:
            if it.id == item_id:
                return it
        raise PivotError(f"plan {self.name!r} has no item {item_id!r}", hint=f"items: {', '.join(self.item_ids())}")

    def item_ids(self) -> list[str]:
        return [it.id for it in self.items]

    def tier_items(self, tier: int) -> list[PlanItem]:
        return [it for it in self.items if it.tier == tier]


# --------------------------------------------------------------------------------------------------
# The ledger's records.

TodoStatus = Literal["pending", "in_progress", "completed", "cancelled"]
TodoPriority = Literal["high", "medium", "low"]


class Todo(_Model):
    """One line of the agent's todo list."""

    id: str = Field(default="", description="Stable id; the ledger assigns one when empty.")
    content: str = Field(min_length=1)
    status: TodoStatus = "pending"
    priority: TodoPriority = "medium"
    plan_item: str | None = Field(default=None, description="The plan item this todo works on, if any.")


ExperimentKind = Literal["baseline", "change", "rerun", "prior", "imported"]
ExperimentStatus = Literal["planned", "running", "finished", "failed", "interrupted"]


class Experiment(_Model):
    """One clean experiment: a config on a workload, why it was tried, and what it showed."""

    id: int | None = None
    session_id: str | None = None
    plan_item: str | None = Field(default=None, description="The plan item tested; None for a baseline.")
    plan_items: list[str] = Field(
        default_factory=list,
        description="Every plan item this experiment combines, in order (a combined step names them all); "
        "`plan_item` is the first. Empty for a baseline of the plan's workload.",
    )
    kind: ExperimentKind = "change"
    title: str = ""
    hypothesis: str = ""
    config: ServerConfig
    base_experiment_id: int | None = Field(default=None, description="The experiment whose config this changes.")
    workload: BenchSpec
    status: ExperimentStatus = "planned"
    verdict: Verdict | None = None
    reason: str | None = Field(default=None, description="Why the verdict, with the measured numbers.")
    audit: list[FlagIssue] = Field(default_factory=list, description="The flag audit of `config` before launch.")
    not_modelled: list[str] = Field(
        default_factory=list,
        description="Flags of `config` the engine does not model (a simulated engine's), so their effect is not in "
        "its numbers; empty on a real engine.",
    )
    failure: str | None = Field(default=None, description="Classified failure, e.g. oom, unrecognized-argument.")
    failure_detail: str | None = Field(default=None, description="The log line or message that says why it failed.")
    log_path: str | None = None
    predicted_tok_s: float | None = Field(
        default=None,
        description="The twin's output tok/s for this config at the judged level, corrected to the campaign's own "
        "measurements, recorded before launch: a prediction, not a measurement.",
    )
    predicted_change_pct: float | None = Field(
        default=None, description="The predicted change against the base experiment's measured mean, in %."
    )
    prediction: str | None = Field(default=None, description="Where the prediction comes from, in words.")
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @model_validator(mode="after")
    def _items_agree(self) -> Experiment:
        if self.plan_item is not None and not self.plan_items:
            self.plan_items = [self.plan_item]
        elif self.plan_items and self.plan_item is None:
            self.plan_item = self.plan_items[0]
        return self

    @property
    def combined(self) -> bool:
        """True when the experiment tests several plan items together as one step."""
        return len(self.plan_items) > 1


class Document(_Model):
    """A generated document: an improvement doc for a plan item or a numbered status summary."""

    id: int | None = None
    session_id: str
    kind: Literal["improvement", "status"]
    plan_item: str | None = None
    number: int | None = Field(default=None, description="The status summary's sequence number.")
    title: str
    path: str = Field(description="Where the file is, relative to PIVOT_HOME.")
    status: str = ""
    sha256: str = Field(description="Of the content pivot wrote, to notice edits made by hand.")
    experiment_ids: list[int] = Field(default_factory=list, description="Experiments its numbers come from.")
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class Pivot(_Model):
    """A pivot point: the agent stops, asks the user a question with options, and waits for the answer."""

    id: int | None = None
    session_id: str | None = None
    question: str = Field(min_length=1)
    options: list[str] = Field(default_factory=list)
    answer: str | None = None
    tool_call_id: str | None = Field(default=None, description="The deferred ask_user call the answer resumes.")
    summary_path: str | None = None
    asked_at: datetime = Field(default_factory=utcnow)
    answered_at: datetime | None = None

    @property
    def open(self) -> bool:
        return self.answer is None


ServerStatus = Literal["starting", "ready", "stopped", "crashed"]


class ServerProcess(_Model):
    """A server process pivot started, recorded so that no process outlives pivot unnoticed."""

    id: int | None = None
    session_id: str
    experiment_id: int | None = None
    engine: str
    pid: int
    pgid: int
    proc_start: str | None = Field(
        default=None, description="The kernel's start time of `pid`, so a reused pid is never taken for the server."
    )
    host: str
    base_url: str
    argv: list[str]
    log_path: str | None = None
    status: ServerStatus = "starting"
    failure: str | None = None
    started_at: datetime = Field(default_factory=utcnow)
    stopped_at: datetime | None = None


class PlanChange(_Model):
    """A session's plan replaced by an edited one (`pivot resume --plan`): what changed, from which file, when."""

    id: int | None = None
    session_id: str
    source: str | None = Field(default=None, description="The file the new plan was read from.")
    changes: list[str] = Field(description="What differs, one line each: base flags, items added, removed, changed.")
    at: datetime = Field(default_factory=utcnow)


SessionStatus = Literal["active", "waiting", "finished", "failed", "stopped"]


class SessionSettings(_Model):
    """How the agent works in one session: the method's thresholds and the engine's options, kept with the
    session so that a resume judges and launches exactly as the run before it did."""

    min_gain_pct: float = Field(
        default=3.0,
        ge=0,
        description="A change is adopted only when its gain at the judged level beats this and the measured noise.",
    )
    reruns: int = Field(default=1, ge=0, description="Reruns of a change whose gain is inside the noise band.")
    stall_after: int = Field(
        default=3, ge=1, description="Stop at a pivot after this many measured changes in a row without gain."
    )
    seed: int = Field(default=0, description="Seeds the simulated engines' noise: experiment N draws seed + N.")
    engine_options: dict[str, Any] = Field(
        default_factory=dict, description="Options the engine is built with (no secrets: they are stored)."
    )
    request_limit: int = Field(default=400, ge=1, description="Model requests per run before pivot stops it.")
    search: bool = Field(
        default=True,
        description="The twin-guided search (tools/search.py: predicted candidates, combined steps, retests, no "
        "launch for no-op flags) and adoptions confirmed by a second run. False: the plain greedy path (plan order, "
        "one item at a time, an adoption on one run), kept to compare against.",
    )


class Session(_Model):
    """A session as the ledger keeps it: one plan worked on by one agent, resumable at any time.

    (The live object handed to tools is `agent.session.Session`, which holds one of these.)
    """

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    name: str
    plan: Plan
    engine: str
    model: str = Field(default="autopilot", description="The model string driving the agent; never a key.")
    model_base_url: str | None = Field(default=None, description="An OpenAI-compatible server for the model.")
    settings: SessionSettings = Field(default_factory=SessionSettings)
    status: SessionStatus = "active"
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)

    @property
    def target(self) -> Target:
        return self.plan.target


class SessionSummary(_Model):
    """One line of `pivot sessions`: a session and how far it got."""

    id: str
    name: str
    plan: str
    target: str
    engine: str
    status: SessionStatus
    experiments: int
    open_pivot: str | None = Field(default=None, description="The question waiting for an answer, if any.")
    locked_by_pid: int | None = None
    updated_at: datetime


class Event(_Model):
    """Something that happened, for a progress display: a tool call, a level finished, a warning."""

    kind: Literal["info", "progress", "warning", "tool_call", "tool_result", "message", "error"]
    message: str
    data: dict[str, Any] = Field(default_factory=dict)
    at: datetime = Field(default_factory=utcnow)


# --------------------------------------------------------------------------------------------------
# Analysis findings and GEMM micro-benchmarks: ledger rows the reports render (tools/analysis/ writes them).

BottleneckCategory = Literal[
    "small_batch_expert_gemm",
    "kv_capacity",
    "memory_bandwidth",
    "compute",
    "communication",
    "host_overhead",
    "prefill_interference",
]
BOTTLENECK_TITLES: dict[str, str] = {
    "small_batch_expert_gemm": "small-batch expert GEMMs",
    "kv_capacity": "KV cache capacity",
    "memory_bandwidth": "memory bandwidth",
    "compute": "compute",
    "communication": "communication",
    "host_overhead": "host overhead",
    "prefill_interference": "prefill interference",
}
# level: one concurrency level's roofline numbers; scaling: where throughput stops growing; evidence: one
# measurement and what it implies; bottleneck: the verdict; claim: a physics or direction check of a plan item;
# note: why a part of the analysis does not apply (a dense model has no experts).
FindingKind = Literal["level", "scaling", "evidence", "bottleneck", "claim", "note"]


class Finding(_Model):
    """One thing the analysis found: a sentence (a measurement and what it implies) and the numbers it rests on."""

    id: int | None = None
    session_id: str | None = None
    experiment_id: int | None = Field(default=None, description="The experiment measured; None for plan checks.")
    kind: FindingKind
    category: BottleneckCategory | None = Field(default=None, description="The bottleneck this supports, if any.")
    plan_item: str | None = None
    max_concurrency: int | None = None
    text: str = Field(min_length=1)
    values: dict[str, float] = Field(
        default_factory=dict, description="Every number in `text`, by name, with its unit in the name."
    )
    formula: str | None = Field(default=None, description="How derived numbers were computed, in words.")
    severity: Literal["info", "warning", "error"] = "info"
    created_at: datetime = Field(default_factory=utcnow)


class MicrobenchResult(_Model):
    """One GEMM micro-benchmark: a shape and dtype on a device, and the throughput it reached."""

    id: int | None = None
    session_id: str | None = Field(default=None, description="The session that asked for it, if any.")
    device: str = Field(description="The hardware profile name (or the GPU's name) it ran on.")
    dtype: str = Field(description="Weight dtype, as in the profiles: nvfp4, fp8, bf16.")
    m: int = Field(ge=1, description="Rows (tokens) of one GEMM.")
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    groups: int = Field(default=1, ge=1, description="GEMMs in one grouped call (experts), 1 for a plain GEMM.")
    rows_per_expert: float | None = None
    tflops: float = Field(ge=0)
    share_of_peak: float = Field(ge=0, description="tflops / the dense peak of the dtype.")
    share_of_roofline: float = Field(ge=0, description="tflops / min(peak, arithmetic intensity x bandwidth).")
    backend: str | None = Field(default=None, description="The kernel library or backend measured.")
    source: Literal["measured", "simulated"] = "measured"
    measured_at: datetime = Field(default_factory=utcnow)


class ModelUsage(_Model):
    """One agent run's use of its model: requests and tokens as pydantic-ai counted them, and the price where
    genai-prices knows the model (None otherwise: the autopilot, a scripted model, a self-hosted server)."""

    id: int | None = None
    session_id: str | None = None
    model: str
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    outcome: str = ""
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime = Field(default_factory=utcnow)


def parse_levels(text: str | Iterable[int]) -> list[int]:
    """Concurrency levels from '1,64,256' (or an iterable of ints), checked like BenchSpec does."""
    if isinstance(text, str):
        try:
            levels = [int(p) for p in text.replace(" ", "").split(",") if p]
        except ValueError as e:
            raise PivotError(f"bad concurrency list {text!r}", hint="write levels as 1,64,256") from e
    else:
        levels = list(text)
    try:
        return BenchSpec(concurrency=levels).concurrency
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        reason = e.errors()[0]["msg"].removeprefix("Value error, ") if hasattr(e, "errors") else str(e)
        raise PivotError(
            f"bad concurrency list {text!r}: {reason}", hint="write distinct positive levels, e.g. 1,64,256"
        ) from e
