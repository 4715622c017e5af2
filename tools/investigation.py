"""The read-only toolset of a sub-agent investigation (agent/investigate.py): the ledger, a server's log, the
analysis, the GEMM evidence, profile traces, the twin's predictions and the flag audit.

None of these tools launches, benchmarks or judges anything: an investigation reads what the campaign recorded and
what the twin predicts, and its report says so. (`analysis` records the analysis' findings when an experiment has
none yet, as `pivot summary` does: derived data, never a measurement.) It is not a `pivot.tools` plugin: the main
agent reaches it only through the `investigate` tool.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic_ai import FunctionToolset, ModelRetry, RunContext

from agent import models as m
from agent.errors import PivotError
from agent.session import Session
from tools.method import Method

toolset: FunctionToolset[Session] = FunctionToolset(id="investigation", max_retries=2)

ERROR_LINE = re.compile(r"error|exception|traceback|killed|out of memory|oom|nccl|cuda|fatal|abort", re.IGNORECASE)
LOG_LINES = 60


def _experiment(method: Method, experiment_id: int | None) -> m.Experiment:
    e = method.experiment(experiment_id) if experiment_id is not None else method.best()
    if e is None:
        ids = ", ".join(str(x.number) for x in method.experiments) or "none yet"
        raise ModelRetry(f"no experiment {method.number(experiment_id) or experiment_id}; experiments: {ids}")
    return e


def _row(method: Method, e: m.Experiment) -> dict[str, Any]:
    ok = method.ok_values(e)
    top = max(ok) if ok else None
    return {
        "experiment_id": e.id,
        "plan_items": e.plan_items,
        "kind": e.kind,
        "config": str(e.config),
        "status": e.status,
        "verdict": e.verdict,
        "reason": e.reason,
        "failure": e.failure,
        "failure_detail": e.failure_detail,
        "runs": method.run_count(e),
        "failed_levels": method.failed_levels(e),
        "highest_level_held": top,
        "output_tok_s_at_highest_level": round(sum(ok[top]) / len(ok[top]), 1) if top is not None else None,
    }


@toolset.tool
def ledger_experiments(ctx: RunContext[Session]) -> dict[str, Any]:
    """Every experiment of the session as the ledger holds it: its items, flags, status, verdict and reason, the
    classified failure, the levels that failed and the highest level that held (mean output tok/s there); and which
    experiment is the best configuration so far."""
    method = Method.read(ctx.deps.store, ctx.deps.id)
    best = method.best()
    return {
        "best_experiment_id": best.id if best is not None else None,
        "noise_band_pct": method.band_pct(),
        "experiments": [_row(method, e) for e in method.experiments],
    }


@toolset.tool
def experiment_levels(ctx: RunContext[Session], experiment_id: int) -> list[dict[str, Any]]:
    """The benchmark levels one experiment measured, per run: concurrency, completed and failed requests, output
    tok/s, mean TTFT and TPOT in ms, and the errors of failed requests."""
    store = ctx.deps.store
    method = Method.read(store, ctx.deps.id)
    e = _experiment(method, experiment_id)
    out = []
    for run, result in enumerate(store.bench_results(e.id or 0), start=1):
        for lv in result.levels:
            out.append(
                {
                    "run": run,
                    "max_concurrency": lv.max_concurrency,
                    "completed": lv.completed,
                    "failed": lv.failed,
                    "output_throughput": lv.output_throughput,
                    "mean_ttft_ms": lv.mean_ttft_ms,
                    "mean_tpot_ms": lv.mean_tpot_ms,
                    "errors": sorted(set(lv.errors))[:5],
                }
            )
    return out


@toolset.tool
def server_log(ctx: RunContext[Session], experiment_id: int, lines: int = LOG_LINES) -> dict[str, Any]:
    """The end of the server log of one experiment (its last launch): the last `lines` lines, the lines that look
    like errors, and the engine's own diagnosis of them (the failure class and the line that shows it)."""
    session = ctx.deps
    method = Method.read(session.store, session.id)
    e = _experiment(method, experiment_id)
    if not e.log_path:
        return {"experiment_id": e.id, "log": None, "note": "no server log recorded (never launched)"}
    path = Path(e.log_path)
    path = path if path.is_absolute() else session.paths.home / path
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as err:
        return {"experiment_id": e.id, "log": str(path), "note": f"cannot read it: {err.strerror or err}"}
    tail = text[-max(1, min(lines, 400)) :]
    errors = [line for line in text if ERROR_LINE.search(line)][-12:]
    diagnosis = None
    try:
        diagnosis = str(session.engine_for(session.settings.seed).diagnose(tail))
    except PivotError as err:  # an engine this host cannot build still has a readable log
        diagnosis = f"(no diagnosis: {err.message})"
    return {"experiment_id": e.id, "log": str(path), "tail": tail, "error_lines": errors, "diagnosis": diagnosis}


@toolset.tool
def analysis(ctx: RunContext[Session], experiment_id: int | None = None) -> dict[str, Any]:
    """The roofline and bottleneck analysis of an experiment (default: the best): the dominant bottleneck with its
    evidence, and per level the rows per expert (or GEMM rows), arithmetic intensity, achieved TFLOPS and % of peak,
    the bandwidth floor and TPOT over it. Recorded findings are read; an experiment without any is analysed now."""
    from tools.analysis import analyze

    session = ctx.deps
    method = Method.read(session.store, session.id)
    e = _experiment(method, experiment_id)
    findings = session.store.findings(session.id, experiment_id=e.id)
    if not findings:
        try:
            findings = analyze(session, e.id).findings
        except PivotError as err:
            raise ModelRetry(f"{err.message}; {err.hint or ''}") from err
    verdict = next((f for f in findings if f.kind == "bottleneck"), None)
    return {
        "experiment_id": e.id,
        "bottleneck": verdict.category if verdict else None,
        "verdict": verdict.text if verdict else None,
        "evidence": [f.text for f in findings if f.kind in ("evidence", "scaling", "note")],
        "levels": [f.values for f in findings if f.kind == "level"],
    }


@toolset.tool
def gemm_evidence(ctx: RunContext[Session]) -> dict[str, Any]:
    """GEMM micro-benchmarks recorded for this target's hardware (TFLOPS, % of peak and of the roofline per shape,
    measured on a GPU by `pivot microbench`, or simulated), and the hardware's peak figures they are read against."""
    from tools.profiles import load_hardware

    target = ctx.deps.target
    if not target.hardware:  # a plan may name no hardware profile (a CPU engine, a GPU pivot has no profile of)
        return {
            "hardware": None,
            "microbench": [],
            "note": "the plan names no hardware profile ([target] hardware), so there are no peak figures to read "
            "GEMM micro-benchmarks against",
        }
    hw = load_hardware(target.hardware)
    rows = [r for r in ctx.deps.store.microbench_results() if r.device in (hw.name, hw.title)]
    return {
        "hardware": hw.name,
        "microbench": [
            {
                "dtype": r.dtype,
                "m": r.m,
                "n": r.n,
                "k": r.k,
                "groups": r.groups,
                "rows_per_expert": r.rows_per_expert,
                "tflops": r.tflops,
                "share_of_peak_pct": round(100 * r.share_of_peak, 1),
                "share_of_roofline_pct": round(100 * r.share_of_roofline, 1),
                "source": r.source,
            }
            for r in rows[-24:]
        ],
        "note": None
        if rows
        else "no GEMM micro-benchmark recorded for this hardware: the analysis uses the "
        "profile's fitted GEMM efficiency (run `pivot microbench --session SESSION` on the GPU host)",
    }


@toolset.tool
def profile_traces(ctx: RunContext[Session]) -> dict[str, Any]:
    """GPU kernel time by category from the profiler traces this session wrote (state/<session>/profiles/), with
    the top kernels; none when nothing was profiled."""
    from tools.profile import summarize_traces, trace_files

    folder = ctx.deps.paths.session_state_dir(ctx.deps.id) / "profiles"
    files = trace_files(folder) if folder.is_dir() else []
    if not files:
        return {"traces": 0, "note": "no profiler traces in this session"}
    s = summarize_traces(files)
    return {
        "traces": len(files),
        "source": s.source,
        "total_s": s.total_s,
        "share_pct": {k: round(100 * c.share, 1) for k, c in s.categories.items()},
        "top_kernels": [
            {"name": k.name[:120], "category": k.category, "seconds": k.seconds} for k in s.top_kernels[:8]
        ],
    }


@toolset.tool
def twin_prediction(ctx: RunContext[Session], plan_items: list[str]) -> dict[str, Any]:
    """The digital twin's prediction for the best configuration plus these plan items, corrected to the campaign's
    measurements: the predicted change against the best's measured mean, output tok/s at the judged level, and
    whether it predicts a crash. A prediction, never a measurement."""
    from tools import search

    method = Method.read(ctx.deps.store, ctx.deps.id)
    unknown = [i for i in plan_items if i not in method.plan.item_ids()]
    if unknown or not plan_items:
        raise ModelRetry(f"name plan items of {', '.join(method.plan.item_ids())} (got {plan_items})")
    est = search.Surrogate(method).estimate(tuple(plan_items))
    return {
        "plan_items": plan_items,
        "config": str(est.config),
        "source": est.source,
        "predicted_change_pct": est.change_pct,
        "predicted_tok_s": est.tok_s,
        "crash": est.crash,
        "level": est.level,
        "note": est.note,
    }


@toolset.tool
def flag_audit(ctx: RunContext[Session], flags: str) -> list[dict[str, Any]]:
    """The engine's audit of the best configuration with `flags` added (SGLang spelling): each flag ok, unknown,
    ambiguous, deprecated, invalid or noop, with what to do instead."""
    from tools.experiments import audit_issues, proposed_config

    method = Method.read(ctx.deps.store, ctx.deps.id)
    try:
        config = proposed_config(method, None, flags, None)
    except PivotError as err:
        raise ModelRetry(f"{err.message}; {err.hint or ''}") from err
    return [i.model_dump(include={"flag", "status", "message"}) for i in audit_issues(ctx.deps, config)]
