"""Roofline and bottleneck analysis of an experiment's sweep; its findings are written to the ledger.

Inputs: the experiment's benchmark levels and telemetry (ledger rows), the target's model and hardware
profiles (tools/profiles), GEMM micro-benchmarks when recorded, and a profile breakdown when one is given.
Output: an `Analysis`, and `Finding` rows that replace the experiment's previous ones, so the reports
(tools/reports/) render them without importing anything from here.

Formulas, per GPU, named in the findings that use them (B: requests decoding at once, c: the level's
concurrency, k experts per token out of E, tp/pp/ep the parallel sizes read from the experiment's flags):

  running decodes          B = min(output tok/s x mean TPOT, c)                      (Little's law)
  context per request      ctx = mean prompt + mean output / 2
  rows per expert          c x k / E (every request of the level in one decode batch; the seeds' count); the GEMM
                           of an expert that is hit sees m = c x k / E_hit(c) rows, E_hit(c) = E (1 - (1 - k/E)^c)
  expert width on one GPU  n = expert_ffn / tp under TP (every GPU holds every expert at 1/tp of its width),
                           expert_ffn under EP (whole experts, E / ep of them per GPU)
  GEMM arithmetic intensity  AI = 2 m W / (W b_w + m a), W = 3 x hidden x n weights of one expert on one GPU,
                           a = activation bytes per row in and out of the three projections; for a dense model
                           M = c rows through a hidden x hidden/tp GEMM: AI = 2 M K N / (K N b_w + M K b_a + 2 M N)
  ridge point              peak TFLOPS of the weight dtype / memory bandwidth (FLOP/byte); AI below it: memory-bound
  roofline                 min(peak, AI x bandwidth)
  achieved TFLOPS          the nearest recorded micro-benchmark (same device and dtype, FP8 for FP4 weights on a GPU
                           without FP4 units; rows within 2x, width within 4x; `pivot microbench`), else the
                           hardware profile's GEMM-efficiency fit, as the twin models a GEMM: the lower of
                           peak x eff_max x m/(m + m_half) x n/(n + n_half) and 2 m / b_w x BW_gemm(n), the rate its
                           weights stream at (bandwidth x gemm_bandwidth_efficiency x n/(n + gemm_bandwidth_n_half))
  bytes per decode step    expert weights touched (E_hit = E (1 - (1 - k/E)^B) experts per MoE layer) + dense
                           weights + B x ctx x KV bytes per token, per GPU, times pp (the stages run in turn)
  bandwidth floor          bytes per decode step / peak memory bandwidth; each level's TPOT is compared with it
  decode step (measured)   B / peak output tok/s (a stretch of decode-only steps), at most TPOT
  component estimates      expert GEMMs, dense GEMMs: max(bytes / bandwidth, FLOPs / achieved); attention: KV bytes
                           / bandwidth; communication: 2 all-reduces per layer of B x hidden x 2 bytes,
                           latency + 2 (tp-1)/tp x payload / link bandwidth each, plus the EP all-to-all and PP sends
  host overhead            TPOT at the lowest level (concurrency <= 8) minus the GPU estimate there (a fixed cost
                           per step)
  scaling exponent         ln(out_i / out_i-1) / ln(c_i / c_i-1): 1 is linear, below 0.2 throughput has stopped growing
  power share              mean GPU power / the enforced power limit

The dominant bottleneck, decided in this order at the level with the best output tok/s (R):
  1. kv_capacity: throughput stopped scaling (exponent < 0.2) at a level whose KV pool was >= 90% full, or
     requests failed for lack of memory;
  2. host_overhead: the host overhead measured at low concurrency is at least the GPU work of a step at R;
  3. prefill_interference: TPOT at R is at least 2x the decode step and exceeds it by a larger factor than
     the decode step exceeds its bandwidth floor (decode itself is closer to its floor than tokens are to it);
  4. otherwise the largest component of the decode step at R (the profile's when one was given, else the
     estimates): expert GEMMs -> small_batch_expert_gemm when memory-bound or below 25% of peak, else compute;
     dense GEMMs -> compute above the ridge point, memory_bandwidth below; attention/KV -> memory_bandwidth;
     communication -> communication.

The package: `core` (`analyze`, the entry point), `roofline` (the Roofline of one model, GPU and layout),
`levels` (per-level evidence, notes, scaling, a profile's split), `bottlenecks` (one rule per bottleneck, asked
in the order above), `plan_checks` (`check_plan`, `plan_claims`: one function per plan check), `ledger` (reading
levels, telemetry and profiles; `best_experiment`), `results` (`Analysis`, `LevelRoofline`), `common` (thresholds,
formatting, `layout`). Callers import from `tools.analysis`, never from the modules.
"""

from tools.analysis.common import (
    ACTIVATION_BYTES,
    GB,
    GIB,
    KV_FULL,
    LOW_POWER_SHARE,
    SMALL_GEMM_SHARE_OF_PEAK,
    STOPPED_EXPONENT,
    SUBLINEAR_EXPONENT,
    SessionLike,
    flag_value,
    layout,
    session_engine,
)
from tools.analysis.core import analyze
from tools.analysis.ledger import KEPT_VERDICTS, best_experiment, same_config_analysed
from tools.analysis.plan_checks import check_plan, plan_claims
from tools.analysis.results import Analysis, LevelRoofline
from tools.analysis.roofline import COMPONENT_TITLES, Roofline

__all__ = [
    "ACTIVATION_BYTES",
    "COMPONENT_TITLES",
    "GB",
    "GIB",
    "KEPT_VERDICTS",
    "KV_FULL",
    "LOW_POWER_SHARE",
    "SMALL_GEMM_SHARE_OF_PEAK",
    "STOPPED_EXPONENT",
    "SUBLINEAR_EXPONENT",
    "Analysis",
    "LevelRoofline",
    "Roofline",
    "SessionLike",
    "analyze",
    "best_experiment",
    "check_plan",
    "flag_value",
    "layout",
    "plan_claims",
    "same_config_analysed",
    "session_engine",
]
