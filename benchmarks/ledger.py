"""Ledger under contention and batching, measured side by side in one run (compare, don't clock).

1. Several processes write experiments at once: pivot's Store (BEGIN IMMEDIATE) against a naive
   read-then-write in a deferred transaction (sqlite-utils `atomic()`), which SQLite answers with
   "database is locked" at once when two writers race. Prints rows written, errors and wall time.
2. Recording sweeps: one transaction per sweep (Store.add_bench_result) against one commit per row.

    python benchmarks/ledger.py [--procs 6] [--writes 200] [--sweeps 200]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sqlite3
import tempfile
import time
from pathlib import Path

from sqlite_utils import Database

from agent import models as m
from agent.store import Store

PLAN = m.Plan(
    name="bench",
    title="ledger benchmark",
    target=m.Target(model="m", hardware="h200", gpus=1),
    items=[m.PlanItem(id="01", tier=1, title="t", kind="flag", flags="--x 1", hypothesis="h", expected_impact="e")],
)


def _store_writer(db_path: str, writes: int, q: mp.Queue) -> None:
    store, errors = Store(db_path), 0
    for i in range(writes):
        try:
            store.add_experiment("bench1", m.Experiment(title=f"w{i}", config=m.ServerConfig(), workload=PLAN.workload))
        except Exception:
            errors += 1
    q.put(errors)


def _naive_writer(db_path: str, writes: int, q: mp.Queue) -> None:
    db, errors = Database(sqlite3.connect(db_path, timeout=30)), 0
    row = Store._experiment_row(m.Experiment(session_id="bench1", config=m.ServerConfig(), workload=PLAN.workload))
    for _ in range(writes):
        try:
            with db.atomic():  # deferred: reads first, then must upgrade to a write lock
                next(db.query("select count(*) from experiments where session_id = 'bench1'"))
                db["experiments"].insert(row)
        except sqlite3.OperationalError:
            errors += 1
    q.put(errors)


def contention(procs: int, writes: int) -> None:
    print(f"{procs} processes x {writes} writes each, WAL, busy timeout 30 s")
    print(f"{'writer':<34}{'rows':>8}{'errors':>8}{'wall s':>9}")
    for label, target in (
        ("Store (BEGIN IMMEDIATE)", _store_writer),
        ("naive deferred read-then-write", _naive_writer),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "pivot.db")
            with Store(path) as s:
                s.create_session(m.Session(id="bench1", name="b", plan=PLAN, engine="sim"))
            q: mp.Queue = mp.Queue()
            workers = [mp.Process(target=target, args=(path, writes, q)) for _ in range(procs)]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            wall = time.perf_counter() - t0
            errors = sum(q.get() for _ in workers)
            with Store(path) as s:
                rows = len(s.experiments("bench1"))
            print(f"{label:<34}{rows:>8}{errors:>8}{wall:>9.2f}")


def _level(c: int) -> m.BenchLevel:
    lat = {
        f"{s}_{k}_ms": 1.0
        for s in ("mean", "median", "std", "p90", "p95", "p99")
        for k in ("e2e_latency", "ttft", "tpot", "itl")
    }
    return m.BenchLevel(
        max_concurrency=c, duration=1.0, completed=c, total_input_tokens=c, total_output_tokens=c,
        request_throughput=1.0, input_throughput=1.0, output_throughput=1.0, total_throughput=2.0,
        concurrency=1.0, max_output_tokens_per_s=1.0, **lat,
    )  # fmt: skip


def batching(sweeps: int) -> None:
    levels = [_level(c) for c in (1, 256, 512, 1024, 2048)]
    result = m.BenchResult(spec=PLAN.workload, levels=levels, engine="sim", source="simulated")
    timings = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "pivot.db")
        store.create_session(m.Session(id="bench1", name="b", plan=PLAN, engine="sim"))
        e = store.add_experiment("bench1", m.Experiment(config=m.ServerConfig(), workload=PLAN.workload))
        t0 = time.perf_counter()
        for _ in range(sweeps):
            store.add_bench_result(e.id, result)
        timings["one transaction per sweep"] = time.perf_counter() - t0
        db = store.db
        t0 = time.perf_counter()
        for _ in range(sweeps):
            runs = db["bench_runs"]
            runs.insert({"experiment_id": e.id, "spec_json": "{}", "engine": "sim", "source": "simulated",
                                     "started_at": "t", "interrupted": 0})  # fmt: skip
            run_id = runs.last_pk
            for lv in levels:  # each insert commits on its own
                db["bench_levels"].insert({"run_id": run_id, "experiment_id": e.id, "level_json": lv.model_dump_json()})
        timings["one commit per row"] = time.perf_counter() - t0
        store.close()
    base = timings["one transaction per sweep"]
    print(f"\nrecording {sweeps} sweeps of 5 levels")
    for label, seconds in timings.items():
        print(f"{label:<34}{seconds:>9.3f} s   x{seconds / base:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=6)
    ap.add_argument("--writes", type=int, default=200)
    ap.add_argument("--sweeps", type=int, default=200)
    args = ap.parse_args()
    contention(args.procs, args.writes)
    batching(args.sweeps)
