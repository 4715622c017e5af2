"""Executors without Ray: the driver's side (tools/executors/driver.py), run_experiments and the method's steps.

The Ray executor itself is tested in tests/test_ray_executor.py; here the executor is the local one, or a fake that
stands for a remote node (its files come back as text) or loses a task (a node that died), so what the driver writes
to the ledger and what the autopilot and the guard make of a step are tested on their own.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from agent import loop
from agent import models as m
from agent.contracts import EventCallback, ExperimentTask, LedgerLink, TaskOutcome
from agent.defaults import session_settings
from agent.errors import PivotError
from agent.plans import load_plan
from agent.session import Paths, Session
from agent.store import Store
from tools.executors.driver import LOST_RERUNS, run_batch
from tools.executors.local import LocalExecutor
from tools.executors.task import run_task
from tools.method import Method
from tools.method.guard import refusal

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "benchmarks" / "search_plans"


def _session(store: Store, paths: Paths, plan_ref: str | Path, *, parallel: int = 1, executor=None) -> Session:
    plan = load_plan(str(plan_ref))
    method = {"seed": 0} | ({"parallel": parallel, "ray": "test"} if executor is not None else {})
    settings = session_settings(plan.target, "sim", {}, 0.015, method)
    session = Session.create(store, paths, plan, engine_name="sim", settings=settings)
    if executor is not None:
        session.executor = executor(store, session, paths)
    return session


def _local(store: Store, session: Session, paths: Paths) -> LocalExecutor:
    return LocalExecutor(
        ledger_for=lambda t: LedgerLink(store, session.id, t.experiment_id, paths), engine_for=session.engine_for
    )


def _campaign(session: Session, answers: Sequence[str | None] = (None, "continue", "stop")) -> list[tuple]:
    """Run the session through `answers` (one per pivot) and return every experiment's items, kind, verdict, config
    and measured output tok/s per run at the judged level."""
    for answer in answers:
        outcome = loop.run(session, answer=answer)
        if outcome.status != "pivot":
            break
    store = session.store
    top = max(session.plan.workload.concurrency)
    rows = []
    for e in store.experiments(session.id):
        runs = [lv.output_throughput for r in store.bench_results(e.id or 0) for lv in r.levels
                if lv.max_concurrency == top]  # fmt: skip
        rows.append((e.id, tuple(e.plan_items), e.kind, e.verdict, str(e.config), tuple(runs)))
    return rows


def test_a_campaign_through_an_executor_one_at_a_time_is_the_serial_campaign_exactly(tmp_path):
    """--ray with --parallel 1 runs the same experiments with the same seeds: the ledger's numbers are identical."""
    plan = PLANS / "eval-llama70b-h200x2.toml"
    results = []
    for name, executor in (("serial", None), ("through", _local)):
        paths = Paths(tmp_path / name)
        with Store(paths.db_path) as store, _session(store, paths, plan, executor=executor) as session:
            results.append(_campaign(session))
            placed = [e.placement for e in store.experiments(session.id) if e.placement is not None]
    a, b = results
    assert b == a
    assert sum(1 for row in a if row[5]) >= 3  # it measured something worth comparing
    assert placed and all(p.executor == "local" for p in placed)


def _steps(store: Store, session: Session) -> list[dict]:
    """The run_experiments calls of the session's history, in order."""
    calls = [part.get("args") for msg in store.messages(session.id) for part in json.loads(msg).get("parts", [])
             if part.get("tool_name") == "run_experiments" and part.get("args")]  # fmt: skip
    return [c if isinstance(c, dict) else json.loads(c) for c in calls]


def test_with_room_the_baseline_runs_twice_at_once_with_the_serial_runs_seeds(tmp_path):
    plan = PLANS / "eval-llama70b-h200x2.toml"
    baselines = []
    for name, parallel, executor in (("serial", 1, None), ("two", 2, _local)):
        paths = Paths(tmp_path / name)
        with Store(paths.db_path) as store, _session(store, paths, plan, parallel=parallel, executor=executor) as s:
            rows = _campaign(s, (None,))
            baselines.append(sorted(rows[0][5]))
            steps = _steps(store, s)
    assert steps[0] == {"experiments": [{"baseline": True, "runs": 2}]}
    assert all(sum(x.get("runs", 1) for x in step["experiments"]) <= 2 for step in steps)
    assert baselines[0] == baselines[1] and len(baselines[0]) == 2  # the same two runs, at once


def test_a_step_of_two_runs_both_and_the_smaller_gain_is_superseded(store, paths):
    plan = ROOT / "benchmarks" / "parallel_plans" / "llama70b-h200-tp2.toml"  # values of one flag: close calls
    with _session(store, paths, plan, parallel=2, executor=_local) as session:
        rows = _campaign(session, (None,))
        steps = _steps(store, session)
        method = Method.read(store, session.id)
    assert any(len(step["experiments"]) == 2 for step in steps), steps
    by_verdict = {r[3]: r for r in rows}
    adopted, superseded = by_verdict["adopted"], by_verdict["superseded"]
    # both were run on the same base (each gain confirmed by a second run, unless it clears the band by CLEAR_SE
    # standard errors as the twin predicted), and the larger one won
    a, s = method.experiment(adopted[0]), method.experiment(superseded[0])
    assert a is not None and s is not None and a.base_experiment_id == s.base_experiment_id
    assert len(adopted[5]) in (1, 2) and len(superseded[5]) in (1, 2)
    ja, js = method.judge(a), method.judge(s)
    assert (ja.change_pct or 0) >= (js.change_pct or 0) >= js.band_pct
    assert s.reason and "became the best" in s.reason and f"experiment {a.id}" in s.reason


def test_the_guard_checks_a_step_as_a_whole_and_member_by_member(store, paths, small_plan):
    session = Session.create(store, paths, small_plan, engine_name="sim",
                             settings=m.SessionSettings(parallel=2, executor="test"))  # fmt: skip
    with session:
        many = {"experiments": [{"baseline": True}, {"plan_item": "01"}, {"plan_item": "02"}]}
        assert "runs 2 at once" in (refusal(session, "run_experiments", many) or "")
        twice = {"experiments": [{"plan_item": "01"}, {"plan_item": "01"}]}
        assert "named twice" in (refusal(session, "run_experiments", twice) or "")
        # a member is a launch: no change before the documents and the baseline
        why = refusal(session, "run_experiments", {"experiments": [{"plan_item": "01"}]})
        assert why is not None and "documents" in why
        assert store.experiments(session.id) == []  # a refused step leaves nothing behind
        # with an executor, servers never run in this process
        assert "run_experiments" in (refusal(session, "launch_server", {"baseline": True}) or "")


class _Remote:
    """An executor that stands for another node: it runs the task in a directory of its own and brings the log and
    the raw file back as text, with a placement on host `node-b`."""

    name, parallel = "fake-remote", 2

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp())

    def describe(self) -> str:
        return "a fake node"

    def run(self, tasks: Sequence[ExperimentTask], on_event: EventCallback) -> Iterator[TaskOutcome]:
        for t in tasks:
            log, raw = self.dir / f"{t.experiment_id}.log", self.dir / f"{t.experiment_id}.jsonl"
            place = m.Placement(executor="ray", host="node-b", gpu_ids=["2", "3"], log_path=str(log))
            out = run_task(t, on_event, placement=place, log_path=log, raw_path=raw)
            out.log_text = log.read_text() if log.exists() else "no log"
            out.raw_jsonl = raw.read_text() if raw.exists() else None
            yield out

    def close(self) -> None:
        pass


class _LosesFirst(_Remote):
    """Loses every task `lose` times (its node died) before it runs."""

    def __init__(self, lose: int) -> None:
        super().__init__()
        self.lose, self.seen = lose, {}

    def run(self, tasks, on_event):  # type: ignore[no-untyped-def]
        for t in tasks:
            self.seen[t.experiment_id] = self.seen.get(t.experiment_id, 0) + 1
            if self.seen[t.experiment_id] <= self.lose:
                now = m.utcnow()
                yield TaskOutcome(t, "lost", now, now, m.Placement(executor="ray", host="node-c"),
                                  message="the node died")  # fmt: skip
            else:
                yield from super().run([t], on_event)


def _baseline(store: Store, session: Session) -> m.Experiment:
    plan = session.plan
    e = m.Experiment(kind="baseline", title="baseline", config=plan.target.base_config(), workload=plan.workload)
    return store.add_experiment(session.id, e)


def test_a_remote_outcome_brings_its_log_and_raw_file_to_this_host(store, paths, small_plan):
    small_plan.target.model_profile = "llama-3.3-70b-fp8"
    session = Session.create(store, paths, small_plan, engine_name="sim", settings=m.SessionSettings(
        executor="test", engine_options={"model_profile": "llama-3.3-70b-fp8", "hardware": "h200", "gpus": 1}))  # fmt: skip
    with session:
        session.executor = _Remote()
        e = _baseline(store, session)
        (entry,) = run_batch(session, [e])
        e = store.get_experiment(e.id or 0)
        (run,) = store.bench_results(e.id or 0)
    assert entry.status == "measured" and e.status == "finished"
    assert e.placement is not None and e.placement.host == "node-b" and e.placement.gpu_ids == ["2", "3"]
    assert e.log_path and "node-b" in (paths.home / e.log_path).read_text()
    assert run.raw_path and len((paths.home / run.raw_path).read_text().splitlines()) == len(run.levels) == 2
    assert len(store.telemetry(e.id or 0)) == 2


@pytest.mark.parametrize("lose", [1, LOST_RERUNS + 1])
def test_a_lost_task_is_recorded_interrupted_and_run_again_a_bounded_number_of_times(store, paths, small_plan, lose):
    session = Session.create(store, paths, small_plan, engine_name="sim", settings=m.SessionSettings(
        executor="test", engine_options={"model_profile": "llama-3.3-70b-fp8", "hardware": "h200", "gpus": 1}))  # fmt: skip
    with session:
        session.executor = executor = _LosesFirst(lose)
        e = _baseline(store, session)
        if lose <= LOST_RERUNS:
            (entry,) = run_batch(session, [e])
        else:  # given up: the run stops there, saying the executor lost it (never the engine's crash)
            with pytest.raises(PivotError, match="recorded interrupted, not crashed: the executor lost them"):
                run_batch(session, [e])
        e = store.get_experiment(e.id or 0)
        runs = store.bench_results(e.id or 0)
    if lose <= LOST_RERUNS:
        assert entry.status == "measured" and e.status == "finished" and len(runs) == 1
        assert e.placement is not None and e.placement.attempt == lose + 1
    else:  # left interrupted with nothing measured, for `pivot resume` to run
        assert e.status == "interrupted" and runs == [] and e.verdict is None
    assert executor.seen[e.id or 0] == min(lose, LOST_RERUNS) + 1
