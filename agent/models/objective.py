"""What a campaign optimizes: the objective (throughput, goodput, capacity or energy) and the latency SLOs it is
judged under, as a plan's `[objective]` table and `pivot run --objective ... --slo ttft:500,tpot:50` give it.

SLOs are per request, in milliseconds, as SGLang 0.5.23's benchmark (`--goodput ttft:500 tpot:50 e2el:20000`) and
vLLM's define them: a request is good when it succeeded and met every SLO given; a failed request counts against
attainment; a one-token answer has TPOT 0. `slo_attainment` is the share of the requests sent that were good.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from agent.models.base import _Model
from agent.models.slo import (  # noqa: F401 (the SLO vocabulary, re-exported where it was first defined)
    SLO_LABELS,
    SLO_METRICS,
    LoadAxis,
    SloMetric,
    check_slos,
    parse_slos,
    slo_text,
)

if TYPE_CHECKING:
    from agent.models.bench import BenchLevel, BenchResult

ObjectiveKind = Literal["throughput", "goodput", "capacity", "energy"]
GoodputKind = Literal["request", "token"]
DEFAULT_ATTAINMENT = 0.95  # AIPerf's max-goodput-under-slo recipe and the default


class Objective(_Model):
    """What the campaign optimizes and the SLOs it is judged under (a plan's `[objective]` table).

    - throughput: output tok/s at the judged level (the default; SLOs given here are reported, not judged);
    - goodput: request goodput (good requests per second) or token goodput (output tokens of good requests per
      second) at the judged level;
    - capacity: the highest load (concurrency, or request rate with Poisson arrivals) at which SLO attainment is at
      least `attainment_target`, found per experiment by levels that bracket the crossing;
    - energy: output tokens per joule at the judged level; with SLOs, only the tokens of good requests count and a
      level whose attainment is under the target does not count at all.
    """

    kind: ObjectiveKind = Field(default="throughput", description="throughput | goodput | capacity | energy.")
    ttft_ms: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="SLO on time to first token, per request (ms)."
    )
    tpot_ms: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="SLO on time per output token after the first (ms)."
    )
    e2el_ms: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="SLO on end-to-end latency, per request (ms)."
    )
    attainment_target: float = Field(
        default=DEFAULT_ATTAINMENT,
        gt=0,
        le=1,
        description="The share of requests that must be good (capacity; energy and goodput under SLOs report it).",
    )
    goodput: GoodputKind = Field(
        default="request",
        description="goodput: request (SGLang's and vLLM's request_goodput, req/s) or token (output tok/s of good "
        "requests, pivot's token_goodput_tok_s).",
    )
    load: LoadAxis = Field(
        default="concurrency",
        description="capacity: the load that grows, concurrency (max_concurrency) or request rate (Poisson arrivals).",
    )
    load_min: float | None = Field(
        default=None,
        gt=0,
        description="capacity: the lowest load tried (default: the workload's lowest concurrency; 0.1 req/s).",
    )
    load_max: float | None = Field(
        default=None,
        gt=0,
        description="capacity: the highest load tried (default: the workload's highest concurrency; 1000 req/s).",
    )
    max_levels: int = Field(default=6, ge=2, le=24, description="capacity: levels per experiment, at most.")
    resolution: float = Field(
        default=0.1, gt=0, le=1, description="capacity: the bracket is narrowed until upper / lower - 1 is this."
    )

    @model_validator(mode="after")
    def _check(self) -> Objective:
        if self.kind in ("goodput", "capacity") and not self.slos_ms:
            raise ValueError(f"a {self.kind} objective needs at least one SLO: ttft_ms, tpot_ms or e2el_ms")
        if self.load_min is not None and self.load_max is not None and self.load_min >= self.load_max:
            raise ValueError(f"load_min ({self.load_min:g}) must be below load_max ({self.load_max:g})")
        if self.load == "concurrency":
            for name in ("load_min", "load_max"):
                value = getattr(self, name)
                if value is not None and value != int(value):
                    raise ValueError(f"{name} is a concurrency here: a whole number, not {value:g}")
        return self

    @property
    def slos_ms(self) -> dict[SloMetric, float]:
        """The SLOs given, in SGLang's spelling and order: {"ttft": 500.0, "tpot": 50.0}."""
        pairs = (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("e2el", self.e2el_ms))
        return {k: float(v) for k, v in pairs if v is not None}  # type: ignore[misc]

    @classmethod
    def build(
        cls,
        kind: str | None = None,
        slos: Mapping[str, float] | None = None,
        base: Objective | None = None,
        **kw: object,
    ) -> Objective:
        """`base` (default: throughput) with another kind and/or SLOs (replacing all of base's SLOs), validated."""
        data = (base or cls()).model_dump()
        if kind is not None:
            data["kind"] = kind
        if slos is not None:
            checked = check_slos(slos)
            for metric in SLO_METRICS:
                data[f"{metric}_ms"] = checked.get(metric)
        data.update({k: v for k, v in kw.items() if v is not None})
        return cls.model_validate(data)

    @property
    def judged_by_slos(self) -> bool:
        """Whether the SLOs decide the objective's value (goodput, capacity, energy under SLOs)."""
        return self.kind != "throughput" and bool(self.slos_ms)

    def slo_words(self) -> str:
        """The SLOs in words, "TTFT <= 500 ms, TPOT <= 50 ms" ("" without any)."""
        return slo_text(self.slos_ms)

    @property
    def unit(self) -> str:
        """The objective's unit, as summaries write it."""
        if self.kind == "goodput":
            return "good req/s" if self.goodput == "request" else "good output tok/s"
        if self.kind == "capacity":
            return "concurrent requests" if self.load == "concurrency" else "req/s"
        if self.kind == "energy":
            return "output tok/J"
        return "output tok/s"

    def describe(self) -> str:
        """The objective in words: "capacity at TTFT <= 500 ms, TPOT <= 50 ms (95% of requests)"."""
        slos = self.slo_words()
        share = f"{self.attainment_target * 100:g}% of requests"
        if self.kind == "throughput":
            return "output tok/s" + (f" (SLOs reported: {slos})" if slos else "")
        if self.kind == "goodput":
            what = "request goodput" if self.goodput == "request" else "token goodput"
            return f"{what} at {slos}"
        if self.kind == "capacity":
            load = "concurrent requests" if self.load == "concurrency" else "request rate (Poisson arrivals)"
            return f"capacity ({load}) at {slos} ({share})"
        return "output tokens per joule" + (f" at {slos} ({share})" if slos else "")

    # ---- the judged value (tools/method/objective.py reads these: the method, the search, the reports)

    @property
    def metric(self) -> str:
        """The level's key the objective reads (bench_serving's spelling where it has one), or `capacity`."""
        if self.kind == "goodput":
            return "request_goodput" if self.goodput == "request" else "token_goodput_tok_s"
        if self.kind == "energy":
            return "energy_per_output_token_j"
        return "capacity" if self.kind == "capacity" else "output_throughput"

    def value(self, level: BenchLevel) -> float | None:
        """The judged value of one level; None when it does not count: it does not hold (it failed, completed
        nothing, or is not a measurement: BenchLevel.holds), lacks the key
        (goodput measured without the SLOs, energy without a reading), is under the attainment target (energy under
        SLOs), or the objective is capacity (a property of a run's levels at several loads, not of one level).

        - throughput: output tok/s; goodput: good req/s or good output tok/s;
        - energy: output tokens per joule (1 / J per output token); under SLOs only the good requests' tokens."""
        if level.max_concurrency is None or not level.holds or self.kind == "capacity":
            return None
        if self.kind == "throughput":
            return level.output_throughput
        if self.kind == "goodput":
            v = level.request_goodput if self.goodput == "request" else level.token_goodput_tok_s
            return None if v is None else float(v)
        j = level.energy_per_output_token_j
        if j is None or j <= 0:
            return None
        if not self.slos_ms:
            return 1.0 / j
        if level.slo_attainment is None or level.slo_attainment < self.attainment_target:
            return None
        if level.token_goodput_tok_s is None or level.output_throughput <= 0:
            return None
        return level.token_goodput_tok_s / level.output_throughput / j

    def value_of_run(self, result: BenchResult) -> dict[int, float]:
        """The judged values of one run, by the concurrency they are compared at: each level that counts; for
        capacity the run's one value, the bracket's lower end its capacity search found (0 when even the lowest
        load missed the target), filed under the workload's highest concurrency; {} without a search."""
        if self.kind == "capacity":
            cap = result.capacity
            if cap is None or not result.spec.concurrency:
                return {}
            return {max(result.spec.concurrency): float(cap.capacity or 0.0)}
        out: dict[int, float] = {}
        for lv in result.levels:
            v = self.value(lv)
            if v is not None and lv.max_concurrency is not None:
                out[lv.max_concurrency] = v
        return out

    # ---- the objective's words

    @property
    def what(self) -> str:
        """The objective for "raised ... from A to B": "capacity at TPOT <= 50 ms", "output tok/s"."""
        slos = self.slo_words()
        if self.kind == "goodput":
            return f"{'request' if self.goodput == 'request' else 'token'} goodput at {slos}"
        if self.kind == "capacity":
            return f"capacity at {slos}"
        if self.kind == "energy":
            return "output tokens per joule" + (f" at {slos}" if slos else "")
        return "output tok/s"

    def number(self, value: float) -> str:
        """A value as verdicts write it, without its unit: 1,234 tok/s and concurrencies whole, else three figures."""
        if self.kind == "throughput" or (self.kind == "capacity" and self.load == "concurrency") or abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3g}"

    def at(self, concurrency: int) -> str:
        """What was measured where, after a number or a change: "output tok/s at concurrency 64"."""
        slos = self.slo_words()
        if self.kind == "capacity":
            share = f"{self.attainment_target * 100:g}% of requests"
            return f"{self.unit} of capacity at {slos} ({share})"
        if self.kind == "throughput" or not slos:
            return f"{self.unit} at concurrency {concurrency}"
        return f"{self.unit} at concurrency {concurrency} ({slos})"

    def change_words(self, before: float, after: float) -> str:
        """A change in the objective's words: "capacity at TPOT <= 50 ms from 640 to 896 concurrent requests
        (+40%)"."""
        pct = f"{(after - before) / before * 100:+.0f}%" if before > 0 else "from nothing"
        unit = "" if self.kind == "throughput" else f" {self.unit}"
        return f"{self.what} from {self.number(before)} to {self.number(after)}{unit} ({pct})"
