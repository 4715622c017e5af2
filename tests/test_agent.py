"""The agent loop with the autopilot: the demo, resumes, other plans, and kills at any point.

Campaigns run on the twin (`sim`, in process) through the real CLI as subprocesses where a process is the point
(the demo, SIGKILL), and in process otherwise. Assertions are on the ledger and the documents, not on replies.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent import loop
from agent import models as m
from agent.plans import load_plan, parse_plan
from agent.session import Paths, Session
from agent.store import Store
from tests.procs import pivot_here
from tools import reports
from tools.engines.sim.twin import Twin
from tools.method import Method, interpret

PIVOT = [sys.executable, "-m", "agent.cli"]
ROOT = Path(__file__).resolve().parent.parent

# A plan written here, for no model in particular: the autopilot has no code for any plan.
TEST_PLAN = """
name = "written-in-a-test"
title = "Qwen-like 8B on one H200"

[target]
model = "org/dense-8b"
model_profile = "llama-3.3-70b-fp8"
hardware = "h200"
gpus = 1
flags = "--tp-size 1"

[workload]
random_input_len = 256
random_output_len = 128
concurrency = [1, 32, 128]

[tiers]
1 = "Flags"
2 = "Config"

[[items]]
id = "01"
tier = 1
kind = "flag"
title = "A flag that was removed"
flags = "--enable-piecewise-cuda-graph"
hypothesis = "It used to help."
expected_impact = "+5% output tok/s"

[[items]]
id = "02"
tier = 1
kind = "flag"
title = "FP8 KV cache"
flags = "--kv-cache-dtype fp8_e4m3"
hypothesis = "Half the KV bytes."
expected_impact = "+10-20% output tok/s at high concurrency"

[[items]]
id = "03"
tier = 2
kind = "config"
title = "Smaller chunks"
flags = "--chunked-prefill-size 2048"
hypothesis = "Less prefill stall."
expected_impact = "+2% output tok/s"

[[items]]
id = "04"
tier = 2
kind = "code"
title = "A kernel for you"
change = "Write it."
hypothesis = "Faster."
expected_impact = "+5%"
"""


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`pivot ARGS` with PIVOT_HOME=home, in this process (the kill tests below start real ones: `_run_until`)."""
    return pivot_here(*args, env={"PIVOT_HOME": str(home)})


def session_id(text: str) -> str:
    found = re.search(r"session ([a-z0-9]+)", text)
    assert found, text
    return found.group(1)


def new_session(
    store: Store, paths: Paths, plan: m.Plan, *, noise: float = 0.015, seed: int = 0, search: bool = True
) -> Session:
    t = plan.target
    options = {"model_profile": t.model_profile, "hardware": t.hardware, "gpus": t.gpus, "noise": noise}
    settings = m.SessionSettings(seed=seed, engine_options=options, search=search)
    return Session.create(store, paths, plan, engine_name="sim", settings=settings)


def answer_until_done(store: Store, paths: Paths, sid: str, answers: list[str]) -> loop.RunOutcome:
    with Session.open(store, paths, sid) as s:
        outcome = loop.run(s)
    for a in answers:
        if outcome.status != "pivot":
            break
        with Session.open(store, paths, sid) as s:
            outcome = loop.run(s, answer=a)
    return outcome


# ---------------------------------------------------------------------------------------------- the demo


def test_demo_reaches_its_first_pivot_then_resume_goes_into_tier_2(pivot_home):
    first = cli(pivot_home, "demo")  # how fast it is: benchmarks/, not a timed test (a busy host must not fail it)
    assert first.returncode == 0, first.stderr
    sid = session_id(first.stdout)
    assert "question:" in first.stdout and f"pivot resume {sid} --answer" in first.stdout
    assert "best: nothing has beaten the baseline yet (experiment 1," in first.stdout  # said, not left to guess
    assert "->" in first.stderr  # progress while it ran

    with Store(Paths.from_env(pivot_home).db_path) as store:
        plan = store.get_session(sid).plan
        docs = store.documents(sid)
        improvement = {d.plan_item for d in docs if d.kind == "improvement"}
        assert improvement == set(plan.item_ids())  # 01-11
        for d in docs:
            assert (pivot_home / d.path).is_file()
        (status,) = [d for d in docs if d.kind == "status" and d.path.endswith(".md")]
        text = (pivot_home / status.path).read_text()
        assert reports.check_document(text, reports.STATUS_HEADINGS) == []
        pivot = store.open_pivot(sid)
        assert pivot is not None and pivot.question in text and pivot.summary_path == status.path
        exps = store.experiments(sid)
        base = [e for e in exps if e.kind == "baseline"]
        assert len(base) == 1 and base[0].verdict == "baseline" and len(store.bench_results(base[0].id)) == 2
        tier1 = {it.id for it in plan.tier_items(1)}
        judged = {e.plan_item for e in exps if e.plan_item and e.verdict is not None}
        assert judged == tier1
        assert all(e.verdict is not None for e in exps)
        assert store.get_session(sid).status == "waiting"

    second = cli(pivot_home, "resume", sid, "--answer", "1")
    assert second.returncode == 0, second.stderr
    assert "question:" in second.stdout
    with Store(Paths.from_env(pivot_home).db_path) as store:
        exps = store.experiments(sid)
        tier2 = {it.id for it in plan.tier_items(2)}
        assert {e.plan_item for e in exps} & tier2  # it went on into Tier 2
        pivots = store.pivots(sid)
        assert pivots[0].answer == "1" and pivots[-1].open and len(pivots) == 2
        assert len([d for d in store.documents(sid) if d.kind == "status" and d.path.endswith(".md")]) == 2


@pytest.fixture(scope="module")
def demo_ledger(tmp_path_factory) -> tuple[Path, str]:
    """The demo campaign run to its end in process (answers: 1, continue, 1)."""
    home = tmp_path_factory.mktemp("demo")
    paths = Paths.from_env(home)
    store = Store(paths.db_path)
    plan = load_plan("glm5-nvfp4-rtxpro6000x8")
    with new_session(store, paths, plan) as s:
        sid = s.id
    outcome = answer_until_done(store, paths, sid, ["1", "continue", "1", "1"])
    assert outcome.status == "finished", outcome.message
    store.close()
    return home, sid


def test_the_demos_findings_are_true_to_the_twin(demo_ledger):
    home, sid = demo_ledger
    with Store(Paths.from_env(home).db_path) as store:
        method = Method.read(store, sid)
        by_item = {e.plan_item: e for e in method.experiments if e.plan_item and e.kind == "change"}
        removed = by_item["02"]  # --enable-piecewise-cuda-graph: gone in 0.5.23
        assert removed.verdict == "ruled_out" and removed.failure == "unrecognized-argument"
        assert "unrecognized arguments" in (removed.reason or "")
        assert method.run_count(removed) == 0 and removed.log_path is None  # never launched
        assert not [srv for srv in store.servers(sid) if srv.experiment_id == removed.id]
        noop = by_item["01"]  # --num-continuous-decode-steps: read nowhere in 0.5.23
        assert "--num-continuous-decode-steps" in (noop.reason or "") and "no-op" in (noop.reason or "")
        ep8 = by_item["07"]
        assert ep8.verdict == "crashed" and ep8.failure == "cuda-error"
        assert "illegal memory access" in (ep8.reason or "")
        checked = verdicts_true_to_the_noise(method)  # nothing inside the measured noise is called an improvement
        assert "predicted" in checked  # the demo's search predicts most items inside the band: those are checked
        assert method.noise_pct() is not None  # the noise was measured, not assumed
        pivots = store.pivots(sid)
        assert any("crashed" in p.question and "07" in p.question for p in pivots)  # a pivot after EP8's crash
        assert store.get_session(sid).status == "finished"


def verdicts_true_to_the_noise(method: Method) -> set[str]:
    """Check every verdict that rests on the noise band against the method's own judgement of the measurements (or,
    for `predicted`, against the prediction it was given); return the verdicts checked, so a caller can require
    that the ones it means to prove were there."""
    band = method.noise_pct()
    checked = set()
    for e in method.experiments:
        if e.verdict in ("adopted", "no_gain", "regressed"):
            j = method.judge(e)
            change = j.judged_pct  # the change the verdict rests on (the measured one, or weighted with the twin's)
            assert change is not None and j.change_pct is not None, e
            if e.verdict == "adopted":
                assert change > j.band_pct, e
            elif e.verdict == "no_gain":
                assert abs(change) < j.band_pct or change < 0, e
            else:
                assert change <= -j.band_pct, e
        elif e.verdict == "predicted":  # not launched: the prediction, not a measurement, put it inside the band
            assert method.run_count(e) == 0 and e.log_path is None, e
            assert e.predicted_change_pct is not None and band is not None, e
            assert e.predicted_change_pct < band, e
        else:
            continue
        checked.add(e.verdict)
    return checked


def test_every_message_was_persisted_and_parses(demo_ledger):
    home, sid = demo_ledger
    paths = Paths.from_env(home)
    with Store(paths.db_path) as store, Session.open(store, paths, sid) as s:
        history = loop.load_history(s)
        calls = [p for msg in history if isinstance(msg, m_response()) for p in msg.parts if p.part_kind == "tool-call"]
        returns = {p.tool_call_id for msg in history for p in msg.parts if p.part_kind == "tool-return"}
        assert len(calls) > 50
        assert all(c.tool_call_id in returns for c in calls)  # every call has its result stored


def m_response():
    from pydantic_ai.messages import ModelResponse

    return ModelResponse


# ---------------------------------------------------------------------------------------------- other plans


def test_the_autopilot_reaches_a_pivot_on_the_dense_plan(store, paths):
    plan = load_plan("llama70b-fp8-h200x1")
    with new_session(store, paths, plan) as s:
        outcome = loop.run(s)
    assert outcome.status == "pivot"
    exps = store.experiments(s.id)
    # every Tier 1 item is settled: measured (alone or inside a combined step), ruled out, or predicted not worth a launch
    assert {i for e in exps for i in e.plan_items} == {it.id for it in plan.tier_items(1)}
    assert all(e.verdict for e in exps)
    # the dense plan's Tier 1 has a change that gains beyond the noise: adoption is judged on measurements here
    assert "adopted" in verdicts_true_to_the_noise(Method.read(store, s.id))


def test_the_autopilot_works_a_plan_written_here_to_the_end(store, paths):
    plan = parse_plan(TEST_PLAN, source="test.toml")
    with new_session(store, paths, plan) as s:
        sid = s.id
    outcome = answer_until_done(store, paths, sid, ["continue", "continue"])
    assert outcome.status == "finished", outcome.message
    exps = {e.plan_item: e for e in store.experiments(sid) if e.plan_item}
    assert exps["01"].verdict == "ruled_out" and exps["01"].failure == "unrecognized-argument"
    assert exps["02"].verdict in ("adopted", "no_gain", "regressed", "predicted")  # predicted: not launched
    assert exps["03"].verdict is not None and exps["03"].base_experiment_id is not None
    assert "04" not in exps  # a code item is documented, not run
    docs = [d for d in store.documents(sid) if d.kind == "improvement"]
    assert sorted(d.plan_item for d in docs) == ["01", "02", "03", "04"]
    assert store.get_session(sid).status == "finished"


@pytest.mark.parametrize(
    ("answer", "meaning"),
    [
        ("1", ("continue", None)),
        ("3", ("item", "02")),
        ("02", ("item", "02")),
        ("let's try the FP8 KV cache", ("item", "02")),
        ("smaller chunks please", ("item", "03")),
        ("continue", ("continue", None)),
        ("Stop here", ("stop", None)),
        ("make it faster somehow", ("unclear", None)),
        ("7", ("unclear", None)),
    ],
)
def test_answers_the_autopilot_understands(answer, meaning):
    plan = parse_plan(TEST_PLAN, source="test.toml")
    options = ["continue: Tier 2", "stop: the end", "02 FP8 KV cache: test it next"]
    assert interpret(answer, options, plan) == meaning


def test_an_answer_it_does_not_understand_is_asked_again_with_what_it_understands(store, paths):
    plan = parse_plan(TEST_PLAN, source="test.toml")
    with new_session(store, paths, plan) as s:
        first = loop.run(s)
        assert first.status == "pivot"
        again = loop.run(s, answer="make it faster somehow")
    assert again.status == "pivot"
    assert "did not understand" in again.message and "'continue'" in again.message
    before = len(store.experiments(s.id))
    with Session.open(store, paths, s.id) as s2:
        third = loop.run(s2, answer="FP8 KV")  # words of a title: that item is tested again
    assert third.status == "pivot"
    assert len(store.experiments(s.id)) == before + 1
    assert store.experiments(s.id)[-1].plan_item == "02"


def test_stop_writes_the_final_summary_and_finishes(store, paths):
    plan = parse_plan(TEST_PLAN, source="test.toml")
    with new_session(store, paths, plan) as s:
        assert loop.run(s).status == "pivot"
        done = loop.run(s, answer="stop")
    assert done.status == "finished" and "stopped as you asked" in done.message
    statuses = [d for d in store.documents(s.id) if d.kind == "status" and d.path.endswith(".md")]
    assert len(statuses) == 2 and not any(e.plan_item == "03" for e in store.experiments(s.id))


# ---------------------------------------------------------------------------------------------- kills


def _mask(text: str, sid: str) -> str:
    return text.replace(sid, "SESSION")


def _final_summary(home: Path, sid: str) -> str:
    with Store(Paths.from_env(home).db_path) as store:
        docs = [d for d in store.documents(sid) if d.kind == "status" and d.path.endswith(".md")]
        latest = max(docs, key=lambda d: d.number or 0)
        return _mask((home / latest.path).read_text(), sid)


def _fingerprint(home: Path, sid: str) -> dict:
    with Store(Paths.from_env(home).db_path) as store:
        exps = store.experiments(sid)
        return {
            "experiments": [(e.plan_item, e.kind, e.verdict, len(store.bench_results(e.id))) for e in exps],
            "documents": sorted((_mask(d.path, sid), d.kind) for d in store.documents(sid)),
            "pivots": [(p.question, p.answer) for p in store.pivots(sid)],
            "running_servers": store.servers(sid, running_only=True),
        }


def _run_until(home: Path, args: list[str], kill_after_calls: int | None) -> subprocess.CompletedProcess[str] | None:
    """Run a pivot command; with `kill_after_calls`, SIGKILL it after that many tool calls (None if killed), unless
    it ends first."""
    if kill_after_calls is None:  # nothing to kill: no process of its own
        return cli(home, *args)
    env = {**os.environ, "PIVOT_HOME": str(home)}
    proc = subprocess.Popen(
        [*PIVOT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    calls = 0
    assert proc.stderr is not None
    for line in proc.stderr:
        if "] -> " in line:
            calls += 1
            if calls >= kill_after_calls:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                proc.stdout.close()
                proc.stderr.close()
                return None
    out = proc.stdout.read() if proc.stdout else ""
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")  # it ended before the kill point


def test_killed_at_several_points_resume_finishes_the_same_campaign(tmp_path):
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(TEST_PLAN)
    start = ["run", str(plan_file), "--noise", "0.015", "--seed", "7", "-q"]

    def drive(home: Path, kills: list[int]) -> str:
        first = _run_until(home, start[:-1], kills[0] if kills else None)  # progress on: the kill points count it
        with Store(Paths.from_env(home).db_path) as store:
            sid = store.list_sessions()[0].id
        rest = kills[1:]
        answers = ["continue", "continue", "continue"]
        done = first is not None and "finished:" in first.stdout
        while not done:
            with Store(Paths.from_env(home).db_path) as store:
                pivot = store.open_pivot(sid)
            args = ["resume", sid] + (["--answer", answers.pop(0)] if pivot is not None else [])
            result = _run_until(home, args, rest.pop(0) if rest else None)
            if result is not None:
                assert result.returncode == 0, result.stderr
                done = "finished:" in result.stdout
        return sid

    whole = tmp_path / "whole"
    broken = tmp_path / "broken"
    sid_a = drive(whole, [])
    sid_b = drive(broken, [4, 6, 9, 5, 12])
    assert _final_summary(broken, sid_b) == _final_summary(whole, sid_a)
    a, b = _fingerprint(whole, sid_a), _fingerprint(broken, sid_b)
    assert b == a  # no experiment run twice, no document duplicated, no server left
    assert a["running_servers"] == []


# A kill mid-benchmark on sim-http (a server left running, stopped by resume, the baseline relaunched in place):
# tests/test_faults.py test 8.


def test_run_on_sim_http_runs_the_campaign_against_real_processes(tmp_path):
    home = tmp_path / "home"
    result = cli(
        home,
        "run",
        "glm5-nvfp4-rtxpro6000x8",
        "--engine",
        "sim-http",
        "--concurrency",
        "1,16,64",
        "--noise",
        "0.01",
        "--json",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout)
    assert outcome["status"] == "pivot" and outcome["question"]
    sid = outcome["session"]
    with Store(Paths.from_env(home).db_path) as store:
        exps = store.experiments(sid)
        servers = store.servers(sid)
        assert servers and all(srv.status in ("stopped", "crashed") for srv in servers)
        launched = {srv.experiment_id for srv in servers}
        by_item = {e.plan_item: e for e in exps if e.plan_item}
        assert by_item["02"].verdict == "ruled_out" and by_item["02"].id not in launched
        assert all(e.verdict is not None for e in exps)
        assert {r.source for e in exps for r in store.bench_results(e.id)} == {"simulated"}
        assert all(srv.argv[1:5] == ["-m", "agent.cli", "sim", "serve"] for srv in servers)
        # numbers in simulated time, as the in-process twin gives them (time scale 20 by default)
        base = next(e for e in exps if e.kind == "baseline")
        (top,) = [lv for lv in store.bench_results(base.id)[0].levels if lv.max_concurrency == 64]
        twin = Twin.build("glm-5-nvfp4", "rtx-pro-6000-blackwell", 8, base.config)
        ((level, _),) = twin.predict(base.workload.model_copy(update={"concurrency": [64]}))
        behind = [w for w in top.warnings if "behind the twin's clock" in w]
        if behind:  # a loaded host could not keep time scale 20: pivot says so, and the numbers are slower, not wrong
            assert top.output_throughput < level.output_throughput, behind
        else:
            assert top.output_throughput == pytest.approx(level.output_throughput, rel=0.25)


def test_a_baseline_that_cannot_start_stops_at_a_pivot_that_says_why(tmp_path):
    home = tmp_path / "home"
    command = f'{sys.executable} -c "import sys; sys.exit(\\"No module named \'sglang\'\\")"'
    first = cli(home, "run", "llama70b-fp8-h200x1", "--engine", "sglang", "-o", f"command={command}", "--json")
    assert first.returncode == 0, first.stderr
    outcome = json.loads(first.stdout)
    assert outcome["status"] == "pivot" and "engine-not-installed" in outcome["question"]
    assert "No module named 'sglang'" in outcome["question"]
    again = cli(home, "resume", outcome["session"], "--answer", "continue", "--json")
    assert json.loads(again.stdout)["status"] == "pivot"  # tried again, failed again, asked again
    done = cli(home, "resume", outcome["session"], "--answer", "stop", "--json")
    assert json.loads(done.stdout)["status"] == "finished"
    with Store(Paths.from_env(home).db_path) as store:
        base = [e for e in store.experiments(outcome["session"]) if e.kind == "baseline"]
        assert len(base) == 2 and all(e.verdict == "crashed" for e in base)
        assert store.servers(outcome["session"], running_only=True) == []


def test_asking_for_a_code_item_says_there_is_nothing_to_run(store, paths):
    plan = parse_plan(TEST_PLAN, source="test.toml")
    with new_session(store, paths, plan) as s:
        assert loop.run(s).status == "pivot"
        again = loop.run(s, answer="04")
    assert again.status == "pivot" and "code change for you" in again.message
    assert store.get_session(s.id).status == "waiting"


def test_a_model_without_its_key_records_no_session(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    home = tmp_path / "home"
    result = cli(home, "run", "llama70b-fp8-h200x1", "--model", "anthropic:claude-sonnet-4-5")
    assert result.returncode == 1 and "ANTHROPIC_API_KEY" in result.stderr
    with Store(Paths.from_env(home).db_path) as store:
        assert store.list_sessions() == []


def test_an_item_with_its_own_workload_gets_its_own_baseline(store, paths):
    text = TEST_PLAN.replace(
        '''[[items]]
id = "02"
tier = 1
kind = "flag"
title = "FP8 KV cache"
flags = "--kv-cache-dtype fp8_e4m3"''',
        """[[items]]
id = "02"
tier = 1
kind = "workload"
title = "FP8 KV cache on long outputs"
flags = "--kv-cache-dtype fp8_e4m3"
workload = { random_output_len = 512 }""",
    )
    plan = parse_plan(text, source="test.toml")
    with new_session(store, paths, plan) as s:
        assert loop.run(s).status == "pivot"
    exps = store.experiments(s.id)
    long = [e for e in exps if e.workload.random_output_len == 512]
    base, change = [e for e in long if e.kind == "baseline"], [e for e in long if e.kind == "change"]
    assert len(base) == 1 and base[0].plan_item == "02" and base[0].verdict == "baseline"
    assert len(change) == 1 and change[0].base_experiment_id == base[0].id and change[0].verdict is not None
    plan_base = [e for e in exps if e.kind == "baseline" and e.workload.random_output_len == 128]
    assert len(plan_base) == 1  # the plan's own baseline is not the one item 02 is compared with


def test_a_script_tells_a_pivot_from_the_end_and_reads_the_experiments_as_csv(pivot_home):
    import csv
    import io

    first = cli(pivot_home, "demo", "--detailed-exitcode")
    assert first.returncode == 3, first.stderr  # waiting at a pivot (without the flag: 0, a success)
    sid = session_id(first.stdout)
    shown = cli(pivot_home, "show", sid, "--csv")
    assert shown.returncode == 0, shown.stderr
    rows = list(csv.DictReader(io.StringIO(shown.stdout)))
    assert rows[0]["kind"] == "baseline" and int(rows[0]["runs"]) == 2 and float(rows[0]["value"]) > 0
    assert rows[0]["unit"] == "output tok/s" and {r["verdict"] for r in rows} >= {"baseline", "predicted"}
    stopped = cli(pivot_home, "resume", sid, "--answer", "stop", "--detailed-exitcode")
    assert stopped.returncode == 0, stopped.stderr  # finished: 0
