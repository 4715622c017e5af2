"""Campaigns on a local Ray instance (fake GPUs), through the `pivot` command: the same numbers as the serial run,
experiments that overlap in time on disjoint GPUs, and a driver killed mid-step that leaves no server and resumes.

The executor itself (placement, lost tasks, cancels, the keeper) is tested in tests/test_ray_executor.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray executor needs the ray extra: pip install -e '.[ray]'")

from agent.servers import marked_processes, server_mark
from agent.session import Paths
from agent.store import Store
from tools.method.moves import BASELINE_RUNS_MAX

ROOT = Path(__file__).resolve().parent.parent
PIVOT = [sys.executable, "-m", "agent.cli"]
PLAN = ROOT / "benchmarks" / "parallel_plans" / "llama70b-h200-tp2.toml"
RAY = ["--ray", "local", "--ray-gpus", "4"]
SIM_HTTP = ["--engine", "sim-http", "-o", "time_scale=100", "-o", "startup_s=0.2", "--concurrency", "1,32"]


def _pivot(home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIVOT_HOME": str(home)}
    return subprocess.run([*PIVOT, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def _ledger(home: Path) -> tuple[str, list[tuple]]:
    """The session's id and each experiment's items, kind, verdict, config and output tok/s per run at the top."""
    with Store(Paths(home).db_path) as store:
        (session,) = store.list_sessions()
        rows = []
        for e in store.experiments(session.id):
            level = max(e.workload.concurrency)
            runs = sorted(lv.output_throughput for r in store.bench_results(e.id or 0) for lv in r.levels
                          if lv.max_concurrency == level)  # fmt: skip
            rows.append((e.id, tuple(e.plan_items), e.kind, e.verdict, str(e.config), tuple(runs)))
        return session.id, rows


def test_a_campaign_on_ray_gives_the_serial_campaigns_numbers(tmp_path):
    """The same seeds on a Ray worker as in this process: with --parallel 1 the ledger is the serial run's, to the
    last digit (the in-process twin draws its noise from the seed alone)."""
    common = [str(PLAN), "--engine", "sim", "--noise", "0.015", "--seed", "3", "-q"]
    serial = _pivot(tmp_path / "serial", "run", *common)
    assert serial.returncode == 0, serial.stderr
    on_ray = _pivot(tmp_path / "ray", "run", *common, *RAY)
    assert on_ray.returncode == 0, on_ray.stderr
    (_, a), (sid, b) = _ledger(tmp_path / "serial"), _ledger(tmp_path / "ray")
    assert b == a
    assert sum(1 for row in a if row[5]) >= 2
    with Store(Paths(tmp_path / "ray").db_path) as store:
        placed = [e.placement for e in store.experiments(sid) if e.placement is not None]
    assert placed and all(p.executor == "ray" and len(p.gpu_ids) == 2 for p in placed)


def test_a_step_on_ray_runs_its_experiments_at_once_on_disjoint_gpus(tmp_path):
    home = tmp_path / "home"
    result = _pivot(home, "run", str(PLAN), *SIM_HTTP, "--noise", "0.01", *RAY, "--parallel", "2")
    assert result.returncode == 0, result.stderr
    assert "pivot: session" in result.stdout  # Tier 1 ended at its pivot
    with Store(Paths(home).db_path) as store:
        (session,) = store.list_sessions()
        experiments = store.experiments(session.id)
        runs = [
            (r.started_at, r.finished_at, e.id, r.placement)
            for e in experiments
            for r in store.bench_results(e.id or 0)
        ]
    assert runs and all(p is not None and p.executor == "ray" and len(p.gpu_ids) == 2 for *_, p in runs)
    overlapping = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1 :] if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, "no two runs overlapped in time"
    for a, b in overlapping:  # runs at once had GPUs of their own (CUDA_VISIBLE_DEVICES, set by Ray per task)
        assert set(a[3].gpu_ids).isdisjoint(b[3].gpu_ids), (a, b)
    assert all(e.verdict is not None for e in experiments if e.status == "finished")  # the step was judged
    assert all(e.status != "running" for e in experiments)


def test_a_driver_killed_mid_step_leaves_no_server_and_resume_runs_nothing_twice(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "PIVOT_HOME": str(home)}
    args = [*PIVOT, "run", str(PLAN), *SIM_HTTP, "--noise", "0.01", *RAY, "--parallel", "2"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stderr is not None
    session_id, ready, seen = None, 0, []
    deadline = time.monotonic() + 180
    for line in proc.stderr:
        seen.append(line)
        found = re.search(r"session ([a-z0-9]+): plan", line)
        session_id = session_id or (found.group(1) if found else None)
        ready += "server ready at" in line
        if ready >= 2 or time.monotonic() > deadline:  # the baseline's two runs are up at once: kill the driver
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()
    assert session_id is not None and ready >= 2, "".join(seen[-40:])
    mark = server_mark(Paths(home).db_path, session_id)
    deadline = time.monotonic() + 30
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert marked_processes(mark) == [], "a server outlived the killed driver"
    resumed = _pivot(home, "resume", session_id, *RAY)
    assert resumed.returncode == 0, resumed.stderr
    assert "interrupted" in resumed.stderr
    with Store(Paths(home).db_path) as store:
        experiments = store.experiments(session_id)
        keys = [(tuple(e.plan_items), e.kind, str(e.config)) for e in experiments if e.kind == "change"]
        assert len(keys) == len(set(keys)), "an experiment was recorded twice"
        (base,) = [e for e in experiments if e.kind == "baseline"]  # relaunched in place, not recorded again
        base_runs = store.bench_results(base.id or 0)
        # two runs measure the noise; more (up to BASELINE_RUNS_MAX) when these two disagree beyond the band
        assert base.verdict == "baseline" and 2 <= len(base_runs) <= BASELINE_RUNS_MAX
        for e in experiments:
            assert e.status != "running"
            runs = store.bench_results(e.id or 0)
            # a run cut short was run again, never kept twice
            assert len(runs) <= (BASELINE_RUNS_MAX if e.kind == "baseline" else 2)
        assert store.open_pivot(session_id) is not None
    assert marked_processes(mark) == []
