"""The Ray executor on a local Ray instance (2 CPUs of this machine, 4 GPUs declared), running sim-http experiments.

One instance serves the whole module (starting Ray takes seconds). A SIGKILLed driver's local instance, its token
and its servers are tested through the `pivot` command in tests/test_ray_campaign.py. The servers are real processes: the tests find them by the mark they carry in their environment.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray executor needs the pivot[ray] extra (pip install 'pivot[ray]')")

from agent import models as m
from agent.contracts import ExperimentTask, TaskEvent, TaskOutcome
from agent.servers import marked_processes
from tests.procs import until
from tools.executors.local import LocalExecutor
from tools.executors.ray_cluster import AUTH_VARS, RayExecutor

ROOT = Path(__file__).resolve().parents[1]
FAST = {"model_profile": "llama-3.3-70b-fp8", "hardware": "h200", "gpus": 8, "time_scale": 20.0, "startup_s": 0.5}
TWIN = {k: v for k, v in FAST.items() if k in ("model_profile", "hardware", "gpus")}
SLOW = {**FAST, "time_scale": 1.0}  # a sweep of a minute or more: long enough to kill it midway
SHORT = m.BenchSpec(random_input_len=64, random_output_len=32, concurrency=[1, 8])
LONG = m.BenchSpec(random_input_len=256, random_output_len=512, concurrency=[1, 2, 4])


def make_task(tmp: Path, exp: int, *, gpus: int = 2, engine: str = "sim-http", options: dict | None = None,
              workload: m.BenchSpec = SHORT, seed: int = 7) -> ExperimentTask:  # fmt: skip
    return ExperimentTask(
        session_id="ray-test",
        experiment_id=exp,
        run=1,
        engine=engine,
        engine_options=dict(FAST if options is None else options),
        seed=seed,
        config=m.ServerConfig.parse(f"--tp-size {gpus}"),
        workload=workload,
        gpus=gpus,
        log_path=str(tmp / f"driver-{exp}.log"),
        raw_path=str(tmp / f"driver-{exp}.jsonl"),
        mark=f"ray-test-{os.getpid()}-{exp}-{time.monotonic_ns()}",
        ready_timeout_s=60.0,
    )


def gone(mark: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not marked_processes(mark):
            return True
        time.sleep(0.2)
    return not marked_processes(mark)


def cuda_devices(mark: str) -> set[str]:
    """CUDA_VISIBLE_DEVICES of the running processes that carry `mark` (the server and its children)."""
    seen = set()
    for pid in marked_processes(mark):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"CUDA_VISIBLE_DEVICES="):
                seen.add(item.split(b"=", 1)[1].decode())
    return seen


@pytest.fixture(scope="module")
def ray_executor(tmp_path_factory: pytest.TempPathFactory):
    # whatever Ray settings this shell has (a cluster's address, its token) are not the test's
    saved = {k: os.environ.pop(k) for k in [*AUTH_VARS, "RAY_ADDRESS"] if k in os.environ}
    executor = RayExecutor("local", 2, num_gpus=4, temp_root=str(tmp_path_factory.mktemp("nodes")))
    yield executor
    executor.close()
    assert not any(k in os.environ for k in AUTH_VARS)  # the executor put back what it set
    os.environ.update(saved)


@pytest.fixture
def tmp(tmp_path: Path, ray_executor: RayExecutor):
    ray_executor.parallel = 2
    return tmp_path


def overlap(a: TaskOutcome, b: TaskOutcome) -> bool:
    return a.started_at < b.finished_at and b.started_at < a.finished_at


def test_describe_and_auth_stay_private(ray_executor: RayExecutor) -> None:
    assert ray_executor.describe() == "a local Ray instance: 1 node, 4 GPUs; up to 2 experiments at once"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")  # set by the executor while its instance runs (none was given)
    assert os.environ.get("RAY_AUTH_MODE") == "token" and path and not path.startswith(str(Path.home()))
    assert oct(Path(path).stat().st_mode & 0o777) == "0o600"


def test_two_tasks_run_at_once_on_disjoint_gpus(tmp: Path, ray_executor: RayExecutor) -> None:
    tasks = [make_task(tmp, 1), make_task(tmp, 2)]
    seen: dict[int, set[str]] = {1: set(), 2: set()}

    def on_event(event: TaskEvent) -> None:
        if "server ready" in event.message:  # read the live server's own environment
            seen[event.experiment_id] |= cuda_devices(tasks[event.experiment_id - 1].mark)

    outcomes = {o.task.experiment_id: o for o in ray_executor.run(tasks, on_event)}
    a, b = outcomes[1], outcomes[2]
    assert a.status == b.status == "measured", (a.message, a.failure_detail, b.message, b.failure_detail)
    assert overlap(a, b)
    assert len(a.placement.gpu_ids) == len(b.placement.gpu_ids) == 2
    assert not set(a.placement.gpu_ids) & set(b.placement.gpu_ids)
    assert seen[1] == {",".join(a.placement.gpu_ids)} and seen[2] == {",".join(b.placement.gpu_ids)}
    for o in (a, b):
        assert o.placement.executor == "ray" and o.placement.node_id and o.placement.log_path
        assert o.placement.log_path != o.task.log_path and Path(o.placement.log_path).is_file()
        assert o.log_text and "ready" in o.log_text.lower()
        assert o.raw_jsonl and len(o.raw_jsonl.strip().splitlines()) == 2
        assert not Path(o.task.log_path).exists() and not Path(o.task.raw_path).exists()  # the driver's paths
        assert [lv.max_concurrency for lv in o.bench.levels] == [1, 8]


def test_parallel_one_runs_them_one_after_another(tmp: Path, ray_executor: RayExecutor) -> None:
    ray_executor.parallel = 1
    outcomes = list(ray_executor.run([make_task(tmp, 1), make_task(tmp, 2)], lambda e: None))
    assert [o.status for o in outcomes] == ["measured", "measured"]
    assert not overlap(outcomes[0], outcomes[1])


def test_unschedulable_task_fails_at_once(tmp: Path, ray_executor: RayExecutor) -> None:
    ray_executor.parallel = 1
    events: list[TaskEvent] = []
    run = ray_executor.run([make_task(tmp, 1), make_task(tmp, 2, gpus=8)], events.append)
    outcome = next(run)  # before the first task, which runs first, has ended
    # the unschedulable task's outcome comes first, before the first task (which runs first) has ended
    assert (outcome.task.experiment_id, outcome.status, outcome.failure) == (2, "failed", "unschedulable")
    assert "needs 8 GPUs" in outcome.failure_detail and "has 4" in outcome.failure_detail
    assert events[0].kind == "warning" and events[0].experiment_id == 2
    assert [o.status for o in run] == ["measured"]


def test_a_task_that_waits_for_gpus_is_told_and_runs_after(
    tmp: Path, ray_executor: RayExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tools.executors.ray_cluster.WAIT_NOTICE_S", 1.0)
    events: list[TaskEvent] = []
    first, second = ray_executor.run([make_task(tmp, 1, gpus=4), make_task(tmp, 2, gpus=4)], events.append)
    assert first.status == second.status == "measured" and not overlap(first, second)
    # the second is told it waits (the first may be too, on a loaded host, while Ray frees the previous test's GPUs)
    waiting = [
        e for e in events if "waiting for 4 free GPUs" in e.message and e.experiment_id == second.task.experiment_id
    ]
    assert len(waiting) == 1 and "0 of the cluster's 4 GPUs are free" in waiting[0].message


def test_an_error_inside_the_task_is_a_failure(tmp: Path, ray_executor: RayExecutor) -> None:
    [outcome] = ray_executor.run([make_task(tmp, 1, engine="no-such-engine")], lambda e: None)
    assert (outcome.status, outcome.failure) == ("failed", "unknown")
    assert "no-such-engine" in outcome.failure_detail and outcome.placement.host != "(not placed)"


def test_same_seed_same_numbers_as_the_local_executor(tmp: Path, ray_executor: RayExecutor) -> None:
    twin = make_task(tmp, 1, engine="sim", options={**TWIN, "noise": 0.05})
    [here] = LocalExecutor().run([twin], lambda e: None)
    [there] = ray_executor.run([twin], lambda e: None)
    assert here.status == there.status == "measured"
    assert [lv.model_dump(exclude={"date"}) for lv in here.bench.levels] == [
        lv.model_dump(exclude={"date"}) for lv in there.bench.levels
    ]
    # sim-http serves the twin on the wall clock: both runs agree with the twin's numbers, or say that this loaded
    # host fell behind the twin's clock (and are slower), as the campaign test allows (tests/test_agent.py)
    [model] = LocalExecutor().run([make_task(tmp, 3, engine="sim", options=TWIN)], lambda e: None)
    http = make_task(tmp, 2, options={**FAST, "time_scale": 5.0})  # the client's own delays count 5x, not 20x
    [here] = LocalExecutor().run([http], lambda e: None)
    [there] = ray_executor.run([http], lambda e: None)
    for run in (here, there):
        assert run.status == "measured"
        for level, want in zip(run.bench.levels, model.bench.levels, strict=True):
            assert (level.completed, level.total_output_tokens) == (want.completed, want.total_output_tokens)
            behind = [w for w in level.warnings if "behind the twin's clock" in w]
            if behind:
                assert level.output_throughput < want.output_throughput, behind
            else:
                # the load generator's own delays count time_scale times too: a loaded host only ever slows a level
                # (never fails the test), while a level faster than the twin's clock would be a wrong clock
                assert 0 < level.output_throughput <= want.output_throughput * 1.4, run.placement


def test_a_killed_worker_is_lost_and_its_server_stopped(tmp: Path, ray_executor: RayExecutor) -> None:
    task = make_task(tmp, 1, options=SLOW, workload=LONG)
    killed: list[int] = []

    def on_event(event: TaskEvent) -> None:
        if "server ready" in event.message and not killed:
            worker = int(re.search(r"Ray worker pid (\d+)", placed[0]).group(1))
            assert marked_processes(task.mark)
            os.kill(worker, signal.SIGKILL)
            killed.append(worker)
        if "Ray worker pid" in event.message:
            placed.append(event.message)

    placed: list[str] = []
    [outcome] = ray_executor.run([task], on_event)
    assert killed and outcome.status == "lost", (outcome.status, outcome.message)
    assert "WorkerCrashedError" in outcome.message or "died" in outcome.message.lower()
    assert outcome.placement.host != "(not placed)"
    assert gone(task.mark, 15), "the keeper did not stop the server of the killed worker"


def test_a_task_whose_lease_is_gone_stops_its_server(tmp: Path, ray_executor: RayExecutor) -> None:
    import ray

    from tools.executors.ray_task import Lease

    task = make_task(tmp, 1, options=SLOW, workload=LONG)
    own, lease = ray_executor._lease, ray.remote(num_cpus=0)(Lease).remote()
    ray_executor._lease = lease  # a lease of this test's own, killed as the driver's death would kill it

    def on_event(event: TaskEvent) -> None:
        if "server ready" in event.message:
            assert marked_processes(task.mark)
            ray.kill(lease)

    try:
        [outcome] = ray_executor.run([task], on_event)
    finally:
        ray_executor._lease = own
    # the executor's own failure, not the engine's: lost (the driver records it interrupted and runs it again)
    assert (outcome.status, outcome.failure) == ("lost", None) and "lease actor is gone" in outcome.message
    assert not marked_processes(task.mark)


def test_an_interrupt_stops_the_running_servers(tmp: Path, ray_executor: RayExecutor) -> None:
    tasks = [make_task(tmp, 1, options=SLOW, workload=LONG), make_task(tmp, 2, options=SLOW, workload=LONG)]
    ready: set[int] = set()

    def on_event(event: TaskEvent) -> None:
        if "server ready" in event.message:
            ready.add(event.experiment_id)
            if ready == {1, 2}:
                raise KeyboardInterrupt  # as a Ctrl-C in the caller's thread

    with pytest.raises(KeyboardInterrupt):
        list(ray_executor.run(tasks, on_event))
    for t in tasks:  # stopped by the interrupt; its group's last exit is awaited, not clocked (a busy host is slow)
        assert until(lambda t=t: not marked_processes(t.mark), 5), f"{t.label}'s server outlived the interrupt"


def test_closing_the_run_early_stops_the_running_server(tmp: Path, ray_executor: RayExecutor) -> None:
    quick, slow = make_task(tmp, 1), make_task(tmp, 2, options=SLOW, workload=LONG)
    run = ray_executor.run([quick, slow], lambda e: None)
    first = next(run)
    assert first.task.experiment_id == 1 and first.status == "measured"
    assert until(lambda: bool(marked_processes(slow.mark)), 30), "the second server never started"
    run.close()  # the caller stops reading: what still runs is cancelled
    # its group's last exit is awaited, not clocked (it failed once in CI on a busy host, as the interrupt test did)
    assert until(lambda: not marked_processes(slow.mark), 5), "the second server outlived the closed run"
