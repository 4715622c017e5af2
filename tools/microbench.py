"""The microbench toolset: GEMM micro-benchmarks of the target model's shapes on this host's GPU, into the ledger.

The measuring is tools/gemm.py (PyTorch only, also runnable alone as `python -m tools.gemm` on a GPU host
without pivot's dependencies); this module picks the shapes from the session's target, turns each timed
case into a `MicrobenchResult` row of the ledger's `microbench_results` (what tools/analysis/ reads in
place of the hardware profile's GEMM-efficiency fit: same device, same dtype, nearest rows and width), and
imports results measured elsewhere (`pivot microbench --from-json`).

Rows recorded: `device` is the hardware profile's name (h200, ...), `m` the rows per expert (experts) or
rows (dense), `n` the expert's width on one GPU (expert_ffn / tp) or the GEMM's output width, `k` the
hidden size or the GEMM's input width, `groups` the experts in one call; `backend` names the kernel path and
the shape. Shares are recomputed from the case's FLOPs, bytes and seconds against the current profile.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from pydantic_ai import FunctionToolset, ModelRetry, RunContext

from agent import models as m
from agent.contracts import load_engine
from agent.errors import PivotError
from agent.session import Session
from agent.store import Store
from tools import gemm
from tools.profiles import HardwareProfile, ModelProfile, load_hardware, names
from tools.profiles.target import session_profiles

toolset: FunctionToolset[Session] = FunctionToolset(id="microbench", max_retries=2)


class MicrobenchReport(BaseModel):
    """What a micro-benchmark run measured (or why nothing was measured), and what the analysis uses now."""

    available: bool = Field(description="Whether a GPU was measured; false: nothing was, see `reason`.")
    reason: str | None = Field(default=None, description="Why nothing was measured (no PyTorch, no CUDA GPU).")
    gpu: str | None = Field(default=None, description="The GPU measured, as the driver names it.")
    hardware: str = Field(description="The hardware profile the rows are recorded under (their `device`).")
    model_profile: str
    tp: list[int] = Field(description="TP sizes whose per-GPU widths were measured (1: the full width).")
    results: list[m.MicrobenchResult] = Field(default_factory=list, description="Rows recorded in the ledger.")
    errors: list[str] = Field(default_factory=list, description="Cases or backends that failed, with the reason.")
    notes: list[str] = Field(default_factory=list)
    ceilings: dict[str, float] = Field(
        default_factory=dict, description="Measured here: copy GB/s, 8192^3 GEMM TFLOPS per dtype."
    )
    analysis_uses: str = Field(description="Where the analysis's achieved GEMM TFLOPS come from after this run.")


# ---------------------------------------------------------------------------------------------- shapes


def model_for_target(target: m.Target) -> ModelProfile:
    """The target's model profile: `model_profile` when the plan names one, else the profile serving that model, else
    one generated from its config.json (tools/profiles/target.py)."""
    from tools.profiles.target import model_profile_for

    return model_profile_for(target)[0]


def target_tp(target: m.Target) -> int:
    """The TP size of the target's base flags, as the target's engine reads them (1 when they set none, or when
    that engine is not installed here)."""
    try:
        return load_engine(target.engine).parallelism(target.flags).tp
    except PivotError:
        return 1


def plan_cases(model: ModelProfile, tps: Iterable[int], rows: Iterable[int], dtypes: Iterable[str]) -> list[gemm.Case]:
    """The cases a run measures: the routed experts of a MoE model, the linear layers of a dense one."""
    try:
        return gemm.cases_for(model.model_dump(), sorted(set(tps)), list(rows), list(dtypes))
    except ValueError as e:
        raise PivotError(
            str(e), hint="rows like 1,2,4,...,4096; dtypes bf16,fp8; TP sizes that divide the widths"
        ) from e


def hardware_for_gpu(gpu_name: str) -> str | None:
    """The shipped hardware profile whose title names this GPU (e.g. 'NVIDIA H200' -> h200), if any."""
    words = set(gpu_name.lower().replace("nvidia", "").split())
    best: tuple[int, str] | None = None
    for name in names("hardware"):
        title = set(load_hardware(name).title.lower().replace("nvidia", "").split())
        if words and words <= title and (best is None or len(title) < best[0]):
            best = (len(title), name)
    return best[1] if best else None


def fit_note(hw: HardwareProfile) -> str:
    cal = hw.calibration
    if cal is None:
        return f"the roofline of {hw.title} (peak throughput at full efficiency: its profile has no GEMM fit)"
    stream = cal.bandwidth_efficiency if cal.gemm_bandwidth_efficiency is None else cal.gemm_bandwidth_efficiency
    width = f" x n/(n + {cal.gemm_bandwidth_n_half:g})" if cal.gemm_bandwidth_n_half > 0 else ""
    return (
        f"the {hw.name} profile's GEMM-efficiency fit: peak x {cal.gemm_efficiency_max:g} x m/(m + "
        f"{cal.gemm_m_half:g}) x n/(n + {cal.gemm_n_half:g}), at most what weights read at bandwidth x "
        f"{stream:g}{width} allow"
    )


# ---------------------------------------------------------------------------------------------- rows


def _backend_label(case: dict[str, Any]) -> str:
    title = gemm.BACKEND_TITLES.get(case["backend"], case["backend"])
    return f"{title} [{case['model']} {case['name']} tp{case['tp']}]"


def result_of(
    case: dict[str, Any], hw: HardwareProfile, *, session_id: str | None, measured_at: datetime | None
) -> m.MicrobenchResult:
    """One timed case (a row of tools.gemm's JSON) as a ledger row, its shares against `hw`."""
    seconds = float(case["seconds"])
    peak = hw.peak_tflops(case["dtype"])
    fig = gemm.figures(float(case["flops"]), float(case["bytes"]), seconds, peak, hw.memory_bandwidth_gbs)
    experts = case["kind"] == "experts"
    return m.MicrobenchResult(
        session_id=session_id,
        device=hw.name,
        dtype=case["dtype"],
        m=int(case["rows"]),
        n=int(case["n"]),
        k=int(case["k"]),
        groups=int(case.get("groups") or 1),
        rows_per_expert=float(case["rows"]) if experts else None,
        tflops=fig["tflops"],
        share_of_peak=fig["share_of_peak"],
        share_of_roofline=fig["share_of_roofline"],
        backend=_backend_label(case),
        source="measured",
        **({"measured_at": measured_at} if measured_at else {}),
    )


def results_of_run(
    run: dict[str, Any], hw: HardwareProfile, *, session_id: str | None = None
) -> tuple[list[m.MicrobenchResult], list[str]]:
    """The timed cases of a run as ledger rows, and the failed ones as 'label: error' lines."""
    when = None
    if run.get("measured_at"):
        try:
            when = datetime.fromisoformat(run["measured_at"])
        except ValueError:
            when = None
    results, errors = [], []
    for case in run.get("cases", []):
        label = f"{case.get('model')} {case.get('name')} tp{case.get('tp')} {case.get('dtype')} {case.get('backend')} m={case.get('rows')}"
        if case.get("error") or not case.get("seconds"):
            errors.append(f"{label}: {case.get('error') or 'not timed'}")
            continue
        try:
            results.append(result_of(case, hw, session_id=session_id, measured_at=when))
        except (KeyError, TypeError, ValueError) as e:
            errors.append(f"{label}: malformed ({type(e).__name__}: {e})")
    return results, errors


def record(store: Store, results: Sequence[m.MicrobenchResult]) -> list[m.MicrobenchResult]:
    return [store.add_microbench(r) for r in results]


def load_run(path: str | Path) -> dict[str, Any]:
    """A run written by `python -m tools.gemm --json-out` (or `pivot microbench --json-out`), checked."""
    path = Path(path)
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PivotError(f"{path}: cannot read micro-benchmark results: {e}") from e
    if not isinstance(run, dict) or run.get("format") != gemm.FORMAT:
        raise PivotError(
            f"{path}: not a pivot micro-benchmark file (format {gemm.FORMAT!r} expected)",
            hint="write one with: python -m tools.gemm --model-profile glm-5-nvfp4 --tp 1,8 --json-out FILE",
        )
    if not isinstance(run.get("cases"), list):
        raise PivotError(f"{path}: no `cases` list")
    return run


def import_run(
    store: Store, path: str | Path, *, session_id: str | None = None, hardware: str | None = None
) -> tuple[dict[str, Any], list[m.MicrobenchResult], list[str]]:
    """Record the timed cases of a results file; returns (the run, the recorded rows, the skipped cases)."""
    run = load_run(path)
    hw = load_hardware(hardware or run.get("hardware") or "")
    results, errors = results_of_run(run, hw, session_id=session_id)
    return run, record(store, results), errors


# ---------------------------------------------------------------------------------------------- measuring


def unavailable_reason() -> str | None:
    """Why no GPU can be measured here (no PyTorch, no CUDA device), or None when one can."""
    ok, why = gemm.gpu_status()
    return None if ok else why


def measure(
    model: ModelProfile,
    hw: HardwareProfile,
    *,
    tps: Iterable[int],
    rows: Iterable[int] = gemm.DEFAULT_ROWS,
    dtypes: Iterable[str] = gemm.DTYPES,
    backends: Sequence[str] | None = None,
    on_case: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Time the model's cases on GPU 0 against `hw`; the run as JSON data. Raises PivotError without a GPU."""
    cases = plan_cases(model, tps, rows, dtypes)
    try:
        run = gemm.measure(cases, hw.model_dump(), backends=backends, on_case=on_case)
    except gemm.Unavailable as e:
        raise PivotError(
            f"no GPU to benchmark: {e}",
            hint=f"run it on a GPU host, or import results measured elsewhere with --from-json FILE; until then "
            f"the analysis uses {fit_note(hw)}",
        ) from e
    return run.to_json()


def run_for_session(
    session: Session,
    *,
    rows: Iterable[int] | None = None,
    dtypes: Iterable[str] | None = None,
    on_case: Callable[[dict[str, Any]], None] | None = None,
) -> MicrobenchReport:
    """Measure the session target's shapes (full width and its TP width) and record them; never raises for no GPU."""
    target = session.target
    model = model_for_target(target)
    tps = sorted({1, target_tp(target)})
    rows = list(rows or gemm.DEFAULT_ROWS)
    dtypes = list(dtypes or gemm.DTYPES)
    plan_cases(model, tps, rows, dtypes)  # bad input fails before anything runs
    target_hw = session_profiles(session.store, session.id).hardware
    base = {"model_profile": model.name, "tp": tps}
    why = unavailable_reason()
    if why is not None:
        return MicrobenchReport(
            available=False, reason=why, hardware=target_hw.name, analysis_uses=fit_note(target_hw), **base
        )
    ok, gpu = gemm.gpu_status()
    notes = []
    hw_name = hardware_for_gpu(gpu) if ok else None
    if hw_name is None:
        return MicrobenchReport(
            available=False,
            reason=f"no hardware profile names this GPU ({gpu}); add one under tools/profiles/hardware/",
            gpu=gpu,
            hardware=target_hw.name,
            analysis_uses=fit_note(target_hw),
            **base,
        )
    hw = load_hardware(hw_name)
    if hw.name != target_hw.name:
        notes.append(
            f"this host's GPU is {gpu} ({hw.name}), not the target's {target_hw.name}: the rows are recorded for "
            f"{hw.name} and the analysis of this target keeps using {fit_note(target_hw)}"
        )
    run = measure(model, hw, tps=tps, rows=rows, dtypes=dtypes, on_case=on_case)
    results, errors = results_of_run(run, hw, session_id=session.id)
    stored = record(session.store, results)
    notes += run.get("notes", [])
    uses = (
        f"these {len(stored)} micro-benchmarks (nearest rows and width, same dtype) where they are close, else "
        + fit_note(hw)
        if hw.name == target_hw.name and stored
        else fit_note(target_hw)
    )
    return MicrobenchReport(
        available=True,
        gpu=gpu,
        hardware=hw.name,
        results=stored,
        errors=errors,
        notes=notes,
        ceilings=run.get("ceilings", {}),
        analysis_uses=uses,
        **base,
    )


# ---------------------------------------------------------------------------------------------- the tool


@toolset.tool
def microbench(
    ctx: RunContext[Session], rows: list[int] | None = None, dtypes: list[str] | None = None
) -> MicrobenchReport:
    """Measure how fast this host's GPU runs the target model's GEMMs, and record the results in the ledger.

    For a MoE model it times the routed experts' GEMMs together as the engine runs them (one grouped call
    over the experts a batch hits), at the full expert width and at the width one GPU holds under the target's
    TP, for `rows` rows per expert; for a dense model, the linear layers of one layer at `rows` rows.
    Default rows: 1, 2, 4, ..., 4096. `dtypes`: "bf16" and/or "fp8" (default both; fp8 needs Hopper or later).
    Takes one to three minutes on a GPU.

    Returns per shape TFLOPS, share of the GPU's dense peak and share of the roofline bound at that arithmetic
    intensity. Small rows per expert reaching a few percent of peak is the evidence for a
    small-batch expert GEMM bottleneck. After a run, the analysis uses these measurements instead of the
    hardware profile's fit (`analysis_uses` says which). Without a GPU here (no PyTorch or no CUDA device)
    nothing is measured: `available` is false and `reason` says why; do not retry, the analysis keeps using
    the profile.
    """
    bad = [d for d in dtypes or [] if d not in gemm.DTYPES]
    if bad:
        raise ModelRetry(f"unknown dtype(s) {', '.join(bad)}; use bf16 and/or fp8")
    if rows is not None and (not rows or any(r < 1 or r > 65536 for r in rows)):
        raise ModelRetry("rows must be a non-empty list of integers from 1 to 65536, e.g. [1, 8, 64, 512]")
    session = ctx.deps
    session.emit("info", "GEMM micro-benchmarks: starting")

    def progress(case: dict[str, Any]) -> None:
        session.emit("progress", gemm.format_row(case))

    report = run_for_session(session, rows=rows, dtypes=dtypes, on_case=progress)
    if report.available:
        session.emit("info", f"GEMM micro-benchmarks: {len(report.results)} rows recorded for {report.hardware}")
    else:
        session.emit("warning", f"GEMM micro-benchmarks not run: {report.reason}")
    return report
