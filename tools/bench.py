"""The bench toolset: a benchmark sweep of the running server, GPU power, the server's metrics, and a profile.

run_benchmark records every level (bench_serving's keys) with the GPU telemetry sampled during it, adds a run to
the server's experiment, and answers with a compact table and the method's comparison against the experiment's
base (tools/method.py), so the verdict that follows rests on numbers the ledger holds.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from pydantic_ai import FunctionToolset, ModelRetry, RunContext

from agent import models as m
from agent.contracts import Deployment
from agent.errors import PivotError, RequestsRefused
from agent.session import LiveServer, Session
from tools.engines.failures import serving_failure
from tools.experiments import raw_run_file, record_failed
from tools.method import Judgement, Method
from tools.numbering import number_of

toolset: FunctionToolset[Session] = FunctionToolset(id="bench", max_retries=3)


class LevelRow(BaseModel):
    """One concurrency level, compactly."""

    concurrency: int
    completed: int
    failed: int
    output_tok_s: float
    total_tok_s: float
    peak_output_tok_s: float
    mean_ttft_ms: float
    mean_tpot_ms: float
    mean_itl_ms: float
    gpu_power_w: float | None = Field(default=None, description="Mean power per GPU during the level.")
    energy_per_output_token_j: float | None = Field(default=None, description="Joules of all GPUs per output token.")
    slo_attainment: float | None = Field(
        default=None, description="With SLOs: good requests / requests sent (0..1; failures count against)."
    )
    token_goodput_tok_s: float | None = Field(default=None, description="With SLOs: output tok/s of good requests.")
    refused: str | None = Field(default=None, description="Why this level is not a measurement (never judged).")


class BenchReport(BaseModel):
    """A finished sweep: its levels, whether the server survived, and how it compares with its base."""

    experiment_id: int
    run: int = Field(description="Which run of this experiment this was (a rerun adds one).")
    source: str = Field(description="measured (real GPUs) or simulated (the twin).")
    levels: list[LevelRow]
    server_alive: bool
    failure: str | None = Field(default=None, description="Classified reason when requests failed.")
    errors: list[str] = Field(default_factory=list, description="A few distinct request errors.")
    capacity: str | None = Field(
        default=None, description="A capacity objective: the highest load that met the SLOs, with its bracket."
    )
    judgement: Judgement


def _live(session: Session) -> LiveServer:
    if session.live is None:
        raise ModelRetry("no server is running: launch_server first")
    return session.live


def _power(t: m.Telemetry | None) -> float | None:
    if t is None:
        return None
    watts = [g.power_w_mean for g in t.gpus if g.power_w_mean is not None]
    return round(sum(watts) / len(watts), 1) if watts else None


def _with_capacity(
    session: Session, e: m.Experiment, dep: Deployment, spec: m.BenchSpec, result: m.BenchResult, output_file: Path
) -> m.BenchResult:
    """A capacity objective's bracket, searched on the running server after its sweep (the result as it is for any
    other objective, or when the server is down)."""
    from tools.loadgen.capacity import capacity_search_of, run_capacity

    engine = session.engine_for(session.settings.seed)
    objective, start = capacity_search_of(session.plan.objective, engine, session.target, e.config, spec)
    if objective is None or not dep.alive():
        return result
    capacity = run_capacity(dep, spec, objective, result, predicted=start, output_file=output_file,
                            on_progress=lambda line: session.emit("progress", f"experiment {e.number}: {line}"))  # fmt: skip
    return result.model_copy(update={"capacity": capacity})


@toolset.tool
def run_benchmark(ctx: RunContext[Session], concurrency: list[int] | None = None) -> BenchReport:
    """Benchmark the running server across concurrency levels with the experiment's workload.

    Leave `concurrency` empty to run the workload's levels (every comparison must use the same ones). Each level
    reports output, total and peak output tok/s, TTFT, TPOT and ITL with sglang.bench_serving's definitions, and
    mean GPU power. If the server dies under load, the level running then and every later one count as failed
    and `failure` says why (oom, cuda-error, ...). `judgement` compares the experiment with its base on the judged
    level and gives the method's suggested verdict; `rerun` means the gain is inside the noise: relaunch the same
    experiment (launch_server with experiment_id) and benchmark it again before judging.
    """
    session = ctx.deps
    store = session.store
    live = _live(session)
    if live.experiment_id is None:
        raise ModelRetry("the running server belongs to no experiment: launch it with launch_server")
    e = store.get_experiment(live.experiment_id)
    spec = e.workload
    if concurrency:
        if any(c < 1 for c in concurrency):
            raise ModelRetry("concurrency levels are positive integers, e.g. [1, 64, 256]")
        spec = spec.model_copy(update={"concurrency": sorted(set(concurrency))})
    runs = len(store.bench_results(e.id or 0))
    dep = live.deployment
    output_file = raw_run_file(session, e.id or 0, runs + 1)
    session.emit("progress", f"experiment {e.number}: benchmarking levels {', '.join(map(str, spec.concurrency))}")
    try:
        result = dep.benchmark(
            spec, lambda line: session.emit("progress", f"experiment {e.number}: {line}"), output_file=output_file
        )
    except RequestsRefused as err:  # up, but it refused every request: the experiment failed, in the server's words
        session.stop_live()
        named = serving_failure([err.detail])  # its answers name the cause (a CUDA OOM while loading on demand)
        err.failure = named.failure if named is not None else err.failure
        record_failed(session, e, err.failure, err.message if named is not None else f"{err.message} ({err.hint})")
        failed = store.get_experiment(e.id or 0)
        return BenchReport(experiment_id=e.id or 0, run=runs + 1, source="measured", levels=[], server_alive=False,
                           failure=err.failure, errors=[err.detail],
                           judgement=Method.read(store, session.id).judge(failed))  # fmt: skip
    if result.interrupted or session.live is not live:  # cut short (Ctrl-C, a cancel): a broken run is not a crash
        store.update_experiment(e.model_copy(update={"status": "interrupted"}))
        raise PivotError(
            f"the benchmark of experiment {e.number} was cut short before it finished; nothing was recorded",
            hint="resume the session to run it again",
        )
    if not result.levels:
        raise PivotError(f"the benchmark of experiment {e.number} produced no level", hint="see server_status")
    telemetry = list(dep.level_telemetry)  # the sweep's (a capacity level's benchmark starts afresh)
    result = _with_capacity(session, e, dep, spec, result, output_file)
    run_id = store.add_bench_result(e.id or 0, result)
    for t in telemetry:
        store.add_telemetry(e.id or 0, t, run_id=run_id)
    by_level = {t.max_concurrency: t for t in telemetry}
    failed = [lv for lv in result.levels if lv.failed > 0]
    failure = dep.failure if failed else None
    errors = sorted({err for lv in failed for err in lv.errors})[:3]
    if failed and failure is None:
        named = serving_failure(errors)  # the server's answers name the cause: a CUDA OOM at a larger batch
        failure = named.failure if named is not None else "unknown" if dep.alive() else "server-exited"
    e = store.update_experiment(
        e.model_copy(update={"status": "finished", "failure": failure or e.failure, "finished_at": m.utcnow()})
    )
    judgement = Method.read(store, session.id).judge(e)
    rows = [
        LevelRow(
            concurrency=lv.max_concurrency or 0,
            completed=lv.completed,
            failed=lv.failed,
            output_tok_s=round(lv.output_throughput, 1),
            total_tok_s=round(lv.total_throughput, 1),
            peak_output_tok_s=round(lv.max_output_tokens_per_s, 1),
            mean_ttft_ms=round(lv.mean_ttft_ms, 1),
            mean_tpot_ms=round(lv.mean_tpot_ms, 1),
            mean_itl_ms=round(lv.mean_itl_ms, 1),
            gpu_power_w=_power(by_level.get(lv.max_concurrency)),
            energy_per_output_token_j=lv.energy_per_output_token_j,
            slo_attainment=None if lv.slo_attainment is None else round(lv.slo_attainment, 4),
            token_goodput_tok_s=None if lv.token_goodput_tok_s is None else round(lv.token_goodput_tok_s, 1),
        )
        for lv in result.levels
    ]
    held = [r for r, lv in zip(rows, result.levels, strict=True) if lv.holds] or rows
    top = max(held, key=lambda r: r.concurrency)  # the highest level that held: where a comparison is made
    session.emit(
        "tool_result",
        f"experiment {e.number} run {runs + 1}: {top.output_tok_s:,.0f} output tok/s at {top.concurrency}"
        + (f"; failed at {', '.join(str(lv.max_concurrency) for lv in failed)} ({failure})" if failed else ""),
    )
    return BenchReport(
        experiment_id=e.id or 0,
        run=runs + 1,
        source=result.source,
        levels=rows,
        server_alive=dep.alive(),
        failure=failure,
        errors=errors,
        capacity=result.capacity.bracket_text if result.capacity is not None else None,
        judgement=judgement,
    )


@toolset.tool
def read_power(ctx: RunContext[Session]) -> m.Telemetry:
    """GPU power, power limit, utilization, SM clock, memory and energy now, per GPU.

    From the running server's GPUs (NVML on this host, or the twin's simulated GPUs); without a server, NVML on
    this host. `source` says measured, simulated or unavailable (with the reason in `error`).
    """
    live = ctx.deps.live
    if live is not None:
        return live.deployment.telemetry()
    from tools.telemetry import read_gpus

    return read_gpus()


@toolset.tool
def server_metrics(ctx: RunContext[Session]) -> dict[str, Any]:
    """The running server's own metrics: the engine's /metrics gauges (running and queued requests, token usage of
    the KV pool, generation throughput, ...) under pivot's names, or the twin's equivalents when simulated."""
    live = _live(ctx.deps)
    try:
        return live.deployment.metrics()
    except PivotError as err:
        raise ModelRetry(f"{err.message}; {err.hint or ''}") from err


@toolset.tool
def profile(ctx: RunContext[Session]) -> dict[str, Any]:
    """Profile the running server under load and attribute GPU time to expert GEMMs, other GEMMs, attention,
    communication and the rest; the profile is recorded as evidence with the analysis of the server's experiment.
    Benchmark the server first. Returns the categories' shares and the analysis' dominant bottleneck."""
    from tools.analysis import analyze

    session = ctx.deps
    live = _live(session)
    summary = live.deployment.profile(session.paths.session_state_dir(session.id) / "profiles")
    result = analyze(session, live.experiment_id, profile=summary)
    from tools.analysis import same_config_analysed

    for other in same_config_analysed(session.store, session.id, live.experiment_id or 0):
        analyze(session, other)  # the best configuration's root cause now rests on this measured profile
    from tools.analysis import check_plan

    with contextlib.suppress(PivotError):  # a plan the checks cannot read stays unchecked
        check_plan(session)  # with the KV usage this analysis measured
    shares = {k: round(v.share * 100, 1) for k, v in summary.categories.items()}
    session.emit(
        "tool_result",
        f"profile of experiment {number_of(session, live.experiment_id)}: "
        + ", ".join(f"{k} {v:.0f}%" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])),
    )
    return {
        "experiment_id": live.experiment_id,
        "source": summary.source,
        "share_pct": shares,
        "bottleneck": result.bottleneck,
        "summary": result.summary,
    }
