"""The results of an analysis: one experiment's levels against the roofline, and its verdict."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agent import models as m


class LevelRoofline(BaseModel):
    """One concurrency level of one experiment, against the roofline of its GPUs."""

    model_config = ConfigDict(extra="forbid")

    max_concurrency: int
    completed: int
    failed: int
    output_throughput: float
    total_throughput: float
    max_output_tokens_per_s: float
    mean_ttft_ms: float
    mean_tpot_ms: float
    running_decodes: float = Field(description="min(output tok/s x mean TPOT, concurrency).")
    context_tokens: float = Field(description="Mean prompt + half the mean output.")
    rows_per_expert: float | None = Field(default=None, description="running decodes x k / E; None for a dense model.")
    gemm_m: float = Field(
        description="Rows of the analysed GEMM: rows per expert hit (MoE) or running decodes (dense)."
    )
    gemm_n: float = Field(description="Its width on one GPU.")
    gemm_k: float
    arithmetic_intensity_flop_per_byte: float
    ridge_flop_per_byte: float
    gemm_bound: Literal["memory", "compute"]
    peak_tflops: float
    roofline_tflops: float
    achieved_tflops: float = Field(description="The estimate's GEMM FLOPs per GPU per step / its GEMM time.")
    gemm_tflop: float = Field(default=0.0, description="FLOPs of the analysed GEMMs per GPU per decode step, in TFLOP.")
    achieved_source: str
    share_of_peak_pct: float
    share_of_roofline_pct: float
    step_bytes_gb: float = Field(description="Bytes one GPU reads in one decode step at running_decodes.")
    bandwidth_floor_ms: float
    tpot_over_floor: float
    decode_step_ms: float = Field(description="running_decodes / peak output tok/s, at most TPOT.")
    estimate_ms: dict[str, float] = Field(default_factory=dict, description="Decode-step components, estimated.")
    power_w_mean: float | None = None
    power_limit_w: float | None = None
    power_share_pct: float | None = None
    util_pct: float | None = None
    kv_usage_pct: float | None = None
    scaling_exponent: float | None = Field(default=None, description="Versus the previous level.")


class Analysis(BaseModel):
    """What an experiment's sweep shows: the levels against the roofline, the dominant bottleneck and why."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    experiment_id: int
    model_profile: str
    hardware: str
    gpus: int
    tp: int
    pp: int
    ep: int
    dense: bool
    source: str = Field(description="Where the numbers came from: measured, simulated or imported.")
    levels: list[LevelRoofline] = []
    reference_concurrency: int | None = Field(default=None, description="The level with the best output tok/s.")
    stops_scaling_at: int | None = None
    bottleneck: m.BottleneckCategory | None = None
    summary: str = ""
    evidence: list[m.Finding] = Field(default_factory=list, description="The lines that support the verdict.")
    secondary: list[m.Finding] = Field(default_factory=list, description="Other findings worth acting on.")
    findings: list[m.Finding] = Field(default_factory=list, description="Everything written to the ledger.")
