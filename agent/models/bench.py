"""Benchmarks: the spec, per-level results, telemetry and profile summaries."""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from agent.models.base import _Model, utcnow
from agent.models.slo import LoadAxis, SloMetric, check_slos

# --------------------------------------------------------------------------------------------------
# Benchmarks: the workload, and results with bench_serving's key names.

Endpoint = Literal["generate", "completions", "chat"]


# What one concurrency level may send: beyond these a benchmark (or the twin's simulation of one) would take hours
# and gigabytes before it said anything, so a workload asking for more is refused with the bound in words.
MAX_PROMPTS_PER_LEVEL = 200_000
MAX_TOKENS_PER_REQUEST = 1_048_576  # longer than any served model's context today
MAX_TOKENS_PER_LEVEL = {"input": 2**27, "output": 2**30}  # prompts x tokens of one level (input: 1 GiB of ids)


class BenchSpec(_Model):
    """A benchmark workload and the concurrency levels to sweep, in `sglang.bench_serving`'s terms."""

    endpoint: Endpoint = Field(
        default="generate", description="SGLang's native /generate, /v1/completions or /v1/chat/completions."
    )
    dataset_name: Literal["random-ids", "random"] = Field(
        default="random-ids", description="random-ids: random token ids (no download); random: random text."
    )
    random_input_len: int = Field(default=1024, ge=1, le=MAX_TOKENS_PER_REQUEST)
    random_output_len: int = Field(default=1024, ge=1, le=MAX_TOKENS_PER_REQUEST)
    random_range_ratio: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Lengths ~ uniform[max(int(L*ratio), 1), L], as bench_serving."
    )
    concurrency: list[int] = Field(default_factory=lambda: [1, 64, 256], description="max_concurrency per level.")
    num_prompts: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PROMPTS_PER_LEVEL,
        description="Prompts per level; None: prompts_per_concurrency x concurrency.",
    )
    prompts_per_concurrency: float = Field(default=2.0, gt=0, le=1000)
    min_prompts: int = Field(
        default=8, ge=1, le=MAX_PROMPTS_PER_LEVEL, description="Floor on prompts per level when num_prompts is None."
    )
    request_rate: float = Field(default=math.inf, gt=0, description="Requests/s (Poisson arrivals); inf: all at once.")
    warmup_requests: int = Field(default=1, ge=0, le=1000)
    ignore_eos: bool = True
    seed: int = Field(default=42, ge=0, le=2**32 - 1, description="numpy's seed, as bench_serving's --seed.")
    request_timeout_s: float = Field(default=600.0, gt=0, le=86_400.0)
    goodput_slos_ms: dict[SloMetric, float] | None = Field(
        default=None,
        description="SGLang's --goodput SLOs in ms (ttft, tpot, e2el): each level then reports request goodput, "
        "SLO attainment (overall and per SLO) and token goodput. They judge the requests, not what is sent.",
    )
    vocab_size: int | None = Field(
        default=None,
        gt=0,
        description="random-ids prompts draw token ids below this; None: the served model's vocabulary when the "
        "engine can read it (its config.json and tokenizer, as bench_serving uses the tokenizer's), else 32,000.",
    )

    @field_validator("goodput_slos_ms")
    @classmethod
    def _check_slos(cls, slos: dict[str, float] | None) -> dict[SloMetric, float] | None:
        return check_slos(slos) or None if slos is not None else None

    @field_validator("concurrency")
    @classmethod
    def _check_levels(cls, levels: list[int]) -> list[int]:
        if not levels:
            raise ValueError("at least one concurrency level is needed")
        if any(c < 1 for c in levels):
            raise ValueError("concurrency levels must be positive integers")
        if any(c > MAX_PROMPTS_PER_LEVEL for c in levels):
            raise ValueError(f"a concurrency level is at most {MAX_PROMPTS_PER_LEVEL:,}")
        if len(set(levels)) != len(levels):
            raise ValueError("concurrency levels must not repeat")
        return levels

    @model_validator(mode="after")
    def _bounded_levels(self) -> BenchSpec:
        top = max(self.concurrency)
        prompts = self.prompts_for(top)
        if prompts > MAX_PROMPTS_PER_LEVEL:
            raise ValueError(
                f"concurrency {top:,} sends {prompts:,} prompts, more than the {MAX_PROMPTS_PER_LEVEL:,} a level may "
                "send: give num_prompts (or a smaller prompts_per_concurrency)"
            )
        for what, tokens in (("input", self.random_input_len), ("output", self.random_output_len)):
            if prompts * tokens > MAX_TOKENS_PER_LEVEL[what]:
                raise ValueError(
                    f"concurrency {top:,} sends {prompts:,} prompts of up to {tokens:,} {what} tokens, "
                    f"{prompts * tokens:,} in all, more than the {MAX_TOKENS_PER_LEVEL[what]:,} a level may send: "
                    "give fewer prompts or shorter requests"
                )
        return self

    def prompts_for(self, concurrency: int) -> int:
        """How many measured prompts a level at this concurrency sends."""
        if self.num_prompts is not None:
            return self.num_prompts
        return max(self.min_prompts, math.ceil(concurrency * self.prompts_per_concurrency))

    def workload_key(self) -> str:
        """A short fingerprint of what is measured, concurrency levels aside: equal keys compare fairly (the SLOs
        judge the requests sent and change none of them, so they are left out too; an unset vocabulary too, so keys
        recorded before it existed still match)."""
        unset = {"vocab_size"} if self.vocab_size is None else set()
        fields = self.model_dump(exclude={"concurrency", "goodput_slos_ms"} | unset)
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
    # the means are what pivot compares; the other statistics (median, std, p90, p95, p99) are kept when a file has
    # them (bench_serving 0.5 writes all of them; older versions and other clients fewer)
    mean_e2e_latency_ms: float
    median_e2e_latency_ms: float | None = None
    std_e2e_latency_ms: float | None = None
    p90_e2e_latency_ms: float | None = None
    p95_e2e_latency_ms: float | None = None
    p99_e2e_latency_ms: float | None = None
    mean_ttft_ms: float
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p95_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p95_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p95_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    concurrency: float = Field(description="Little's law: sum of e2e latencies / duration.")
    accept_length: float | None = None
    max_output_tokens_per_s: float = Field(description="Peak output tok/s in any 1-second bucket.")
    max_concurrent_requests: int | None = None
    # SGLang 0.5.23's --goodput keys (written only when SLOs were given, as SGLang writes them).
    goodput_slos_ms: dict[str, float] | None = None
    request_goodput: float | None = Field(default=None, ge=0, description="Good requests per second of duration.")
    slo_attainment: float | None = Field(
        default=None, ge=0, le=1, description="Good requests / requests sent (failed ones count against it), 0..1."
    )
    slo_attainment_by_metric: dict[str, float] | None = Field(
        default=None, description="Per SLO: requests that succeeded and met it / requests sent, 0..1."
    )
    # Our own additions: token goodput, energy, failures with reasons, and whether the client kept its promise.
    token_goodput_tok_s: float | None = Field(
        default=None, description="Output tokens of the good requests per second of duration (pivot's)."
    )
    mean_gpu_power_w: float | None = Field(default=None, description="Mean power per GPU over the level (W).")
    host_other_cores: float | None = Field(
        default=None,
        description="CPU cores other processes (not pivot, not the server) kept busy on this host during the level, "
        "on average (tools/hostload.py); None when not measured.",
    )
    energy_per_output_token_j: float | None = Field(
        default=None, description="Joules of all the server's GPUs over the level per output token."
    )
    failed: int = 0
    errors: dict[str, int] = Field(default_factory=dict, description="Failure reason -> count.")
    mean_in_flight: float | None = None
    max_in_flight: int | None = None
    mean_dispatch_delay_ms: float | None = None
    max_dispatch_delay_ms: float | None = None
    client_cpu_s: float | None = None
    warnings: list[str] = Field(default_factory=list)
    refused: str | None = Field(
        default=None,
        description="Why this level is not a measurement (the twin served over HTTP fell behind its clock even at "
        "the lowest time scale, so the numbers are the host's): it is kept and shown, never judged or compared.",
    )

    @property
    def holds(self) -> bool:
        """Whether a comparison may use this level: requests completed, none failed, and it is a measurement."""
        return self.completed > 0 and self.failed == 0 and self.refused is None

    @model_serializer(mode="wrap")
    def _omit_unset_extras(self, handler):  # type: ignore[no-untyped-def]
        """The goodput and energy keys only where they were measured, so a level without them has exactly
        bench_serving's keys (and pivot's own checks), as before."""
        data = handler(self)
        if isinstance(data, dict):
            for key in OPTIONAL_LEVEL_KEYS:
                if data.get(key, 0) is None:
                    del data[key]
        return data

    @property
    def load(self) -> float | None:
        """The level's load: its request rate when finite (Poisson arrivals), else its max_concurrency."""
        if isinstance(self.request_rate, int | float) and math.isfinite(self.request_rate):
            return float(self.request_rate)
        return None if self.max_concurrency is None else float(self.max_concurrency)

    @staticmethod
    def noise_pct(values: Sequence[float]) -> float | None:
        """The noise of repeated runs of one level: twice the standard error of their mean, in % of the mean (for
        two runs their spread (max - min) / mean; each further run narrows it); None for fewer than two."""
        if len(values) < 2:
            return None
        mean = statistics.fmean(values)
        if mean <= 0:
            return None
        return 2 * statistics.stdev(values) / math.sqrt(len(values)) / mean * 100

    @classmethod
    def mean(cls, levels: Sequence[BenchLevel]) -> BenchLevel:
        """The mean of runs of one level (reruns of an experiment): every float averaged, counts from the last run.
        A run with failed requests is not averaged away: then the last run is returned as it is. A run refused as a
        measurement is left out of the mean of the others (and returned when no run is a measurement)."""
        if not levels:
            raise ValueError("no level to average")
        measured = [lv for lv in levels if lv.refused is None]
        if measured and len(measured) < len(levels) and not any(lv.failed > 0 for lv in levels):
            levels = measured
        last = levels[-1]
        if len(levels) == 1 or any(lv.failed > 0 for lv in levels) or any(lv.refused for lv in levels):
            return last
        dumps = [lv.model_dump() for lv in levels]
        data = dict(dumps[-1])
        for key, value in dumps[-1].items():
            if isinstance(value, float):
                values = [d.get(key) for d in dumps]
                if all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                    data[key] = sum(values) / len(values)
            elif key == "slo_attainment_by_metric" and isinstance(value, dict):
                runs = [d.get(key) for d in dumps]
                if all(isinstance(r, dict) and set(r) == set(value) for r in runs):
                    data[key] = {k: sum(r[k] for r in runs) / len(runs) for k in value}  # type: ignore[index]
        return cls.model_validate(data)


# BenchLevel keys left out of its dump when unset (bench_serving writes the goodput keys only with --goodput).
OPTIONAL_LEVEL_KEYS = (
    "goodput_slos_ms",
    "request_goodput",
    "slo_attainment",
    "slo_attainment_by_metric",
    "token_goodput_tok_s",
    "mean_gpu_power_w",
    "host_other_cores",
    "energy_per_output_token_j",
)


Source = Literal["measured", "simulated", "imported"]


class Placement(_Model):
    """Where an experiment's server ran: the executor, the host and GPUs it was given, and its log there."""

    executor: str = Field(description="local (this process, one at a time) or ray (a task on a Ray cluster).")
    host: str = Field(description="The host name of the node that ran the server.")
    node_id: str | None = Field(default=None, description="The Ray node's id.")
    gpu_ids: list[str] = Field(
        default_factory=list, description="The GPUs it was given (CUDA_VISIBLE_DEVICES on that host), as ids."
    )
    log_path: str | None = Field(default=None, description="The server's log on that host, when not this one.")
    attempt: int = Field(default=1, ge=1, description="1, or more when a lost node made the executor run it again.")


class CapacityPoint(_Model):
    """One level of a capacity search: the load it ran at and the SLO attainment it had."""

    load: float = Field(description="max_concurrency, or the request rate in req/s (Poisson arrivals).")
    attainment: float = Field(ge=0, le=1, description="slo_attainment of the level (0 when nothing succeeded).")
    output_throughput: float = 0.0
    predicted: bool = Field(default=False, description="A prediction (the twin), not a measured level.")


class Capacity(_Model):
    """The result of a capacity search: the highest load that met the SLOs, and the bracket around the crossing."""

    axis: LoadAxis
    slos_ms: dict[str, float]
    target: float = Field(gt=0, le=1, description="The attainment a load must reach to count.")
    capacity: float | None = Field(
        default=None, description="The highest load measured whose attainment met the target; None when none did."
    )
    upper: float | None = Field(
        default=None,
        description="The lowest load above `capacity` measured under the target: the crossing is between the two. "
        "None when every load up to the highest tried met it (capacity is at least that).",
    )
    load_min: float
    load_max: float
    points: list[CapacityPoint] = Field(default_factory=list, description="Levels in the order they ran.")
    predicted_capacity: float | None = Field(
        default=None, description="Where the predictor placed the crossing before the first level (None: none)."
    )
    max_levels: int = Field(ge=1)
    note: str = ""

    @property
    def bracket_text(self) -> str:
        """The bracket in words: "between 640 and 768 concurrent requests" or "at least 2048" or "below 1"."""
        unit = "concurrent requests" if self.axis == "concurrency" else "req/s"
        if self.capacity is None:
            return f"below {self.load_min:g} {unit} (the lowest load tried missed the target)"
        if self.upper is None:
            return f"at least {self.capacity:g} {unit} (the highest load tried met the target)"
        return f"{self.capacity:g} {unit} (the target is missed at {self.upper:g})"


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
    placement: Placement | None = Field(
        default=None, description="Where the server of this run ran (an executor's task); None for this process."
    )
    capacity: Capacity | None = Field(
        default=None, description="A capacity search's bracket, when the levels were chosen to find the crossing."
    )

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
    energy_j: float | None = Field(
        default=None, description="From the GPU's total-energy counter, else the integral of its power readings."
    )
    energy_source: Literal["counter", "power_integral", "model"] | None = Field(
        default=None,
        description="counter: NVML's total-energy counter; power_integral: its power readings integrated over time "
        "(a GPU without the counter); model: the twin's power model.",
    )

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
