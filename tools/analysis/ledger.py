"""Reading the ledger: an experiment's levels, telemetry and recorded profile, and which experiment to analyse."""

from __future__ import annotations

from agent import models as m
from agent.store import Store
from tools.profiles import HardwareProfile


def _kv_usage(level: m.BenchLevel, telemetry: m.Telemetry | None) -> float | None:
    extra = level.model_extra or {}
    for key in ("max_token_usage", "token_usage"):
        if isinstance(extra.get(key), int | float):
            return float(extra[key])
    if telemetry is not None:
        for key in ("token_usage_max", "sglang:token_usage", "token_usage", "token_usage_mean"):
            if key in telemetry.server_metrics:
                return float(telemetry.server_metrics[key])
    return None


def _power(telemetry: m.Telemetry | None, hw: HardwareProfile) -> tuple[float | None, float | None, float | None]:
    """(mean power per GPU, the power limit, mean utilization) over the level's GPUs."""
    if telemetry is None:
        return None, None, None
    watts = [g.power_w_mean for g in telemetry.gpus if g.power_w_mean is not None]
    limits = [g.power_limit_w for g in telemetry.gpus if g.power_limit_w]
    utils = [g.util_gpu_pct_mean for g in telemetry.gpus if g.util_gpu_pct_mean is not None]
    power = sum(watts) / len(watts) if watts else None
    limit = sum(limits) / len(limits) if limits else (hw.tdp_w if power is not None else None)
    util = sum(utils) / len(utils) if utils else None
    return power, limit, util


def _server_info(levels: list[m.BenchLevel]) -> dict | None:
    for level in levels:
        info = (level.model_extra or {}).get("server_info")
        if isinstance(info, dict):
            return info
    return None


def _levels(store: Store, experiment_id: int) -> tuple[list[m.BenchLevel], str]:
    """The experiment's levels (each concurrency's mean over the runs, as the reports show it) and their source."""
    by_c: dict[int, list[m.BenchLevel]] = {}
    source = "measured"
    for result in store.bench_results(experiment_id):
        source = result.source
        for level in result.levels:
            if level.max_concurrency is not None:
                by_c.setdefault(level.max_concurrency, []).append(level)
    return [m.BenchLevel.mean(by_c[c]) for c in sorted(by_c)], source


def _telemetry_by_level(store: Store, experiment_id: int) -> dict[int, m.Telemetry]:
    out = {}
    for t in store.telemetry(experiment_id):
        if t.max_concurrency is not None and (t.gpus or t.server_metrics):  # a CPU server has gauges, no GPUs
            out[t.max_concurrency] = t
    return out


# --------------------------------------------------------------------------------------------------
# The analysis.


def _recorded_profile(store: Store, session_id: str, experiment_id: int) -> tuple[m.ProfileSummary | None, int | None]:
    """A profile an earlier analysis of this experiment recorded (its shares survive re-analysis); else the latest
    profile of another experiment with the same configuration and workload (a profile item measures the best
    configuration on a server of its own: that measurement is what the best configuration's root cause uses)."""
    found, on = _profile_of(store, session_id, experiment_id)
    if found is not None:
        return found, on or experiment_id
    this = store.get_experiment(experiment_id)
    for other in reversed(store.experiments(session_id)):
        if other.id != experiment_id and other.config == this.config and other.workload == this.workload:
            found, on = _profile_of(store, session_id, other.id or 0)
            if found is not None:
                return found, on or other.id
    return None, None


def same_config_analysed(store: Store, session_id: str, experiment_id: int) -> list[int]:
    """Other analysed experiments with the configuration and workload of `experiment_id` (their root cause should
    use a profile measured on it)."""
    this = store.get_experiment(experiment_id)
    analysed = {f.experiment_id for f in store.findings(session_id, kind="bottleneck")}
    return [
        e.id
        for e in store.experiments(session_id)
        if e.id is not None
        and e.id != experiment_id
        and e.id in analysed
        and e.config == this.config
        and e.workload == this.workload
    ]


def _profile_of(store: Store, session_id: str, experiment_id: int) -> tuple[m.ProfileSummary | None, int | None]:
    """The profile recorded with an experiment's analysis, and the experiment it was measured on."""
    for f in store.findings(session_id, experiment_id=experiment_id, kind="evidence"):
        shares = {
            k[len("profile_") : -len("_share_pct")]: v
            for k, v in f.values.items()
            if k.startswith("profile_") and k.endswith("_share_pct")
        }
        if shares:
            cats = {
                k: m.ProfileCategory(seconds=f.values.get(f"profile_{k}_s", 0.0), share=min(max(v / 100, 0.0), 1.0))
                for k, v in shares.items()
            }
            source = "simulated" if "(simulated" in f.text else "measured"
            on = f.values.get("profiled_experiment_id")
            summary = m.ProfileSummary(source=source, categories=cats, max_concurrency=f.max_concurrency)
            return summary, int(on) if on is not None else None
    return None, None


KEPT_VERDICTS = (None, "baseline", "adopted")  # configurations that stand; no_gain and worse were set aside


def best_experiment(store: Store, session_id: str) -> int | None:
    """The kept experiment (baseline, adopted or not yet judged) with the highest output tok/s at a level without
    failures; when none is kept, any experiment. Ties go to the earlier one."""
    best: dict[bool, tuple[float, int]] = {}
    for e in store.experiments(session_id):
        if e.id is None or e.kind == "prior":
            continue
        kept = e.verdict in KEPT_VERDICTS
        for result in store.bench_results(e.id):
            for level in result.levels:
                if not level.holds:
                    continue
                key = (level.output_throughput, -e.id)
                if kept not in best or key > best[kept]:
                    best[kept] = key
    chosen = best.get(True) or best.get(False)
    return -chosen[1] if chosen else None
