"""A failure of pivot's own, or of the executor's, is never the engine's crash: an experiment its twin's command line
refused, or whose task Ray lost again and again (its lease actor, a raylet), is recorded interrupted with what
happened, and no verdict blames the plan's flags."""

from __future__ import annotations

import json
import sys
import threading

import pytest

from agent import loop
from agent import models as m
from agent.errors import PivotError
from agent.session import Session
from tools.engines.failures import PIVOT_FAILURE, diagnose
from tools.engines.sglang import FAILURE_RULES, SGLangEngine
from tools.method import Method

PIVOT_LOG = [
    "error: Invalid value for '--seed': -4999 is out of range: give a whole number from 0 to 2,147,483,647",
    "hint: `pivot sim serve --help` lists the options",
]


def test_pivots_own_refusal_is_classified_as_pivots_not_sglangs():
    assert diagnose(PIVOT_LOG, FAILURE_RULES).failure == PIVOT_FAILURE
    argparse = ["sglang serve: error: unrecognized arguments: --no-such-flag"]
    assert diagnose(argparse, FAILURE_RULES).failure == "unrecognized-argument"  # SGLang's own stays SGLang's


def test_an_experiment_stopped_by_pivots_own_error_is_interrupted_not_crashed(tmp_path, store, paths, small_plan):
    """Before: `pivot run --seed -5000 --engine sim-http` recorded the twin's refusal of --seed as the baseline
    crashing, and the pivot blamed the plan's base flags."""
    script = tmp_path / "steps.jsonl"
    steps = [{"tool": "write_improvement_doc", "args": {"plan_item": i}} for i in ("01", "02")]
    steps.append({"tool": "launch_server", "args": {"baseline": True}})
    script.write_text("".join(json.dumps(x) + "\n" for x in steps))
    command = [sys.executable, "-m", "agent.cli", "sim", "serve", "--model-profile", "llama-3.3-70b-fp8",
               "--hardware", "h200", "--gpus", "1", "--noise", "inf", "--seed", "0", "--"]  # fmt: skip
    engine = SGLangEngine(name="sim-http", command=command, require_model=False, source="simulated",
                          ready_timeout_s=60.0, stop_grace_s=2.0)  # fmt: skip
    session = Session.create(store, paths, small_plan, engine_name="sim-http", model=f"script:{script}", engine=engine)
    with session, pytest.raises(PivotError, match="error of pivot's own, not the engine's"):
        loop.run(session)
    (e,) = store.experiments(session.id)
    assert e.status == "interrupted" and e.verdict is None and e.failure != "unknown"
    assert (e.failure_detail or "").startswith("pivot's own error: error: Invalid value for '--noise'")
    assert Method.read(store, session.id).judge(e).suggestion != "crashed"


pytest.importorskip("ray", reason="the Ray executor needs the pivot[ray] extra")


def test_a_task_whose_lease_actor_is_gone_is_lost_not_failed(small_plan):
    from ray import exceptions as rx

    from tools.executors.ray_cluster import RayExecutor, _Running
    from tools.executors.ray_task import DriverGone

    task = m.ServerConfig.parse("--tp-size 1")
    from agent.contracts import ExperimentTask

    t = ExperimentTask(session_id="s", experiment_id=1, run=1, engine="sim", engine_options={}, seed=0, config=task,
                       workload=small_plan.workload, gpus=1, log_path="/tmp/x.log", raw_path="/tmp/x.jsonl", mark="m",
                       ready_timeout_s=10.0)  # fmt: skip
    entry = _Running(task=t, started=m.utcnow(), stream=None, reader=threading.current_thread())
    executor = RayExecutor.__new__(RayExecutor)  # no cluster: only the classification is under test
    gone = rx.RayTaskError("task_body", "traceback", DriverGone("the driver that submitted this task is gone"))
    outcome = executor._from_error(entry, gone)
    assert outcome.status == "lost" and "lease actor is gone" in outcome.message  # before: failed, then "crashed"
    raised = rx.RayTaskError("task_body", "traceback", ValueError("a bug in the task"))
    assert executor._from_error(entry, raised).status == "failed"  # the task's own error stays a failure
