"""Test data built by hand: a bench_serving level with every required field set."""

from __future__ import annotations

from typing import Any

from agent import models as m

LATENCY_STATS = ("mean", "median", "std", "p90", "p95", "p99")


def baseline_and_change(store: Any, session_id: str, plan: m.Plan, **change: Any) -> tuple[m.Experiment, m.Experiment]:
    """A finished baseline of `plan` and a change on it (its fields overridden by `change`), recorded, no runs."""
    workload, config = plan.workload, plan.target.base_config()
    base = store.add_experiment(session_id, m.Experiment(kind="baseline", config=config, workload=workload,
                                                         status="finished"))  # fmt: skip
    fields = {"kind": "change", "config": config, "workload": workload, "status": "finished",
              "base_experiment_id": base.id, **change}  # fmt: skip
    return base, store.add_experiment(session_id, m.Experiment(**fields))


def bench_level(concurrency: int, out_tok_s: float, **fields: Any) -> m.BenchLevel:
    """A level at `concurrency` with `out_tok_s` output tok/s; latencies are 10 ms plus the statistic's index.
    `fields` override the defaults or add any other bench_serving key."""
    lat = {f"{s}_{k}_ms": 10.0 + i for i, s in enumerate(LATENCY_STATS) for k in ("e2e_latency", "ttft", "tpot", "itl")}
    values: dict[str, Any] = {
        "backend": "sglang",
        "dataset_name": "random-ids",
        "max_concurrency": concurrency,
        "random_input_len": 256,
        "random_output_len": 128,
        "random_range_ratio": 0.0,
        "duration": 10.0,
        "completed": concurrency,
        "total_input_tokens": 1000,
        "total_output_tokens": 900,
        "request_throughput": 3.0,
        "input_throughput": out_tok_s,
        "output_throughput": out_tok_s,
        "total_throughput": out_tok_s * 2,
        "concurrency": concurrency * 0.9,
        "max_output_tokens_per_s": out_tok_s * 2,
        **lat,
    }
    return m.BenchLevel(**(values | fields))
