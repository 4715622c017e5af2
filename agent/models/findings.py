"""Analysis findings, micro-benchmark results, model usage, and level lists."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Literal

from pydantic import Field

from agent.errors import PivotError
from agent.models.base import _Model, utcnow
from agent.models.bench import BenchSpec

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
        return BenchSpec(concurrency=levels, num_prompts=1, random_input_len=1, random_output_len=1).concurrency
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        reason = e.errors()[0]["msg"].removeprefix("Value error, ") if hasattr(e, "errors") else str(e)
        raise PivotError(
            f"bad concurrency list {text!r}: {reason}", hint="write distinct positive levels, e.g. 1,64,256"
        ) from e
