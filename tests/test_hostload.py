"""What other processes took of the host's CPUs during a level (tools/hostload.py), and how the method reads it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from agent import models as m
from agent.session import Session
from tests.factories import baseline_and_change, bench_level
from tools.hostload import HostLoad, _group_s
from tools.method import Method

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_busy_process_counts_as_other_load_unless_it_is_the_servers_group():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        tick = HostLoad().tick
        start_cpu = _group_s(busy.pid, tick)
        as_server, as_other = HostLoad(busy.pid), HostLoad(None)
        a, b = as_server.mark(), as_other.mark()
        deadline = time.monotonic() + 120  # only against a hang: the loop waits on the process's own CPU time
        while _group_s(busy.pid, tick) - start_cpu < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        server_view, other_view = as_server.other_cores(a), as_other.other_cores(b)
    finally:
        busy.kill()
        busy.wait()
    assert server_view is not None and other_view is not None
    assert other_view > server_view  # the same span: the busy loop is others' load only when it is not the server
    assert HostLoad().other_cores(None) is None


def test_a_change_measured_while_the_host_was_busier_says_so_and_is_measured_again(store, paths, small_plan):
    top = max(small_plan.workload.concurrency)
    with Session.create(store, paths, small_plan, engine_name="sim") as s:
        base, change = baseline_and_change(store, s.id, small_plan)
        for eid, value, others in ((base.id, 400.0, 0.1), (base.id, 402.0, 0.2), (change.id, 300.0, 1.8)):
            level = bench_level(top, value).model_copy(update={"host_other_cores": others})
            store.add_bench_result(eid or 0, m.BenchResult(spec=small_plan.workload, engine="vllm",
                                                           source="measured", levels=[level]))  # fmt: skip
        j = Method.read(store, s.id).judge(change)
    assert "kept 1.8 cores of this host busy during its runs" in j.text and "load moved" in j.text
    assert "beyond the 3.0% noise band on one run" in j.text
    assert j.suggestion == "rerun"  # one run on a moved host is not a regression yet


def test_a_baseline_whose_runs_saw_the_host_move_says_so(store, paths, small_plan):
    """[safety] G12: a baseline run again while other processes took more of the host (a resume after a kill, say)
    names the host's load beside its spread, so a wide noise band is read for what it may be."""
    top = max(small_plan.workload.concurrency)
    with Session.create(store, paths, small_plan, engine_name="sim") as s:
        base, _ = baseline_and_change(store, s.id, small_plan)
        for value, others in ((400.0, 0.1), (344.0, 1.4)):
            level = bench_level(top, value).model_copy(update={"host_other_cores": others})
            store.add_bench_result(base.id or 0, m.BenchResult(spec=small_plan.workload, engine="sim-http",
                                                               source="simulated", levels=[level]))  # fmt: skip
        moved = Method.read(store, s.id).judge(base)
    assert "kept 0.1 to 1.4 cores of this host busy across its runs" in moved.text and "noise band" in moved.text
