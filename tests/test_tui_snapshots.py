"""What `pivot chat` shows in each state a user meets, compared with SVG snapshots in tests/snapshots/: the picker,
the main screen, a running step, a pivot with its options, the pivot after a crash, a finished campaign, the summary
viewer, and a cancelled step. The ledgers are written by hand and the step's model is scripted, so a snapshot changes
only when the TUI does (tests/snapshot.py says how to look at and rewrite them; CI never does)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import FunctionModel

from agent import models as m
from agent.session import Paths, Session
from agent.store import Store
from agent.tui.app import PivotApp
from agent.tui.controller import ChatController, PickerRows
from agent.tui.screens import PickerScreen, SummaryScreen
from tests.factories import bench_level
from tests.snapshot import assert_snapshot
from tests.test_tui import FROZEN, PLAN, SIZE, wait_for

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
SUMMARY = """# Status summary 1: snapshot (snap01)

Tier 1 (Flags) is done. The best configuration so far is experiment 2: **700 output tok/s** at concurrency 32,
+12.9% over the baseline (620 tok/s), beyond the measured noise band.

| # | item | verdict | best tok/s | change |
|---|------|---------|-----------:|-------:|
| 1 | baseline | baseline | 620 | |
| 2 | 01 FP8 KV cache | adopted | 700 | +12.9% |

Next: Tier 2 (Config), 02 Smaller chunks.
"""


@pytest.fixture
def plan(tmp_path):
    from agent.plans import load_plan

    path = tmp_path / "tui-test.toml"
    path.write_text(PLAN)
    return load_plan(path)


def _measured(store: Store, sid: str, plan: m.Plan, e: m.Experiment, low: float, high: float, verdict: m.Verdict):
    e = store.add_experiment(sid, e)
    result = m.BenchResult(spec=plan.workload, engine="sim", source="simulated", started_at=T0)
    result.levels = [bench_level(1, low), bench_level(32, high)]
    store.add_bench_result(e.id or 0, result)
    return store.update_experiment(e.model_copy(update={"status": "finished", "verdict": verdict}))


def ledger(store: Store, paths: Paths, plan: m.Plan, monkeypatch: pytest.MonkeyPatch, *, state: str = "main") -> str:
    """A session written by hand (no twin, no autopilot): a baseline and an adopted change, their tool calls, and
    for `state` pivot a pivot (with its status summary on disk), crash a crashed experiment and the pivot it asks,
    finished a campaign at its end."""
    monkeypatch.setattr("agent.session.new_session_id", lambda: "snap01")
    with Session.create(store, paths, plan, name="snapshot", engine_name="sim") as s:
        sid = s.id
    store.replace_todos(sid, [
        m.Todo(content="Measure the baseline", status="completed", priority="high"),
        m.Todo(content="01 FP8 KV cache", status="completed", priority="high", plan_item="01"),
        m.Todo(content="02 Smaller chunks", status="completed" if state == "crash" else "pending", priority="medium",
               plan_item="02"),
    ])  # fmt: skip
    base_config = plan.target.base_config()
    base = _measured(store, sid, plan, m.Experiment(kind="baseline", title="baseline", config=base_config,
                                                    workload=plan.workload), 9.8, 620.0, "baseline")  # fmt: skip
    change = _measured(store, sid, plan, m.Experiment(
        kind="change", plan_item="01", title="FP8 KV cache", base_experiment_id=base.id, workload=plan.workload,
        config=m.ServerConfig.parse(f"{base_config} --kv-cache-dtype fp8_e4m3"),
    ), 9.9, 700.0, "adopted")  # fmt: skip
    report = {"experiment_id": change.id, "run": 1, "levels": [{"concurrency": 1, "output_tok_s": 9.9, "failed": 0},
              {"concurrency": 32, "output_tok_s": 700.0, "failed": 0}]}  # fmt: skip
    messages: list[Any] = [
        ModelRequest(parts=[UserPromptPart("Work through the plan with the method.")]),
        ModelResponse(parts=[ToolCallPart("launch_server", {"plan_item": "01"}, tool_call_id="c1")]),
        ModelRequest(
            parts=[ToolReturnPart("launch_server", {"experiment_id": change.id, "status": "ready"}, tool_call_id="c1")]
        ),
        ModelResponse(parts=[ToolCallPart("run_benchmark", {}, tool_call_id="c2")]),
        ModelRequest(parts=[ToolReturnPart("run_benchmark", report, tool_call_id="c2")]),
        ModelResponse(parts=[TextPart("Experiment 2 (**FP8 KV cache**) is adopted: +12.9% output tok/s at 32.")]),
    ]
    summary = "docs_out/snap01/status-001.md"
    if state == "crash":
        crashed = store.add_experiment(sid, m.Experiment(
            kind="change", plan_item="02", title="Smaller chunks", base_experiment_id=change.id,
            workload=plan.workload, config=m.ServerConfig.parse(f"{change.config} --chunked-prefill-size 2048"),
        ))  # fmt: skip
        store.update_experiment(crashed.model_copy(update={
            "status": "failed", "verdict": "crashed", "failure": "cuda-error",
            "reason": "RuntimeError: CUDA error: an illegal memory access was encountered",
        }))  # fmt: skip
        messages += [
            ModelResponse(parts=[ToolCallPart("launch_server", {"plan_item": "02"}, tool_call_id="c3")]),
            ModelRequest(
                parts=[
                    ToolReturnPart(
                        "launch_server",
                        {"experiment_id": crashed.id, "status": "failed", "failure": "cuda-error"},
                        tool_call_id="c3",
                    )
                ]
            ),
        ]
        store.add_pivot(sid, m.Pivot(
            question="Experiment 3 (02 Smaller chunks) crashed: cuda-error (RuntimeError: CUDA error: an illegal "
            "memory access was encountered). Best so far: 700 output tok/s at 32 (experiment 2). Which way next?",
            options=["retry 02 once: a CUDA error can be transient", "continue: rule 02 out and go on",
                     "stop: write the final summary and end the campaign"],
            summary_path=summary,
        ))  # fmt: skip
    elif state == "pivot":
        store.add_pivot(sid, m.Pivot(
            question="Tier 1 (Flags) done. Best so far: 700 output tok/s at concurrency 32 (experiment 2). Which way next?",
            options=["continue: Tier 2 (Config): 02 Smaller chunks", "stop: write the final summary and end the campaign"],
            summary_path=summary,
        ))  # fmt: skip
    store.append_messages(sid, [ModelMessagesTypeAdapter.dump_json([x]).decode()[1:-1] for x in messages])
    if state in ("pivot", "crash"):
        import hashlib

        (paths.home / summary).parent.mkdir(parents=True, exist_ok=True)
        (paths.home / summary).write_text(SUMMARY, encoding="utf-8")
        store.upsert_document(m.Document(
            session_id=sid, kind="status", number=1, title="Status summary 1", path=summary, created_at=T0,
            updated_at=T0, sha256=hashlib.sha256(SUMMARY.encode()).hexdigest(), experiment_ids=[1, 2],
        ))  # fmt: skip
    if state == "finished":
        store.set_session_status(sid, "finished")
    return sid


async def _opened(app: PivotApp, pilot: Any) -> None:
    await wait_for(pilot, lambda: app.sessions_shown == 1 and app.board is not None)


async def _show(store: Store, paths: Paths, sid: str, name: str, config: pytest.Config, **kw: Any) -> None:
    controller = ChatController(paths, store, **kw)
    controller.open(sid)
    app = PivotApp(controller, clock=FROZEN)
    async with app.run_test(size=SIZE) as pilot:
        await _opened(app, pilot)
        await assert_snapshot(pilot, name, config)


async def test_the_picker(store, paths, plan, monkeypatch, pytestconfig):
    ledger(store, paths, plan, monkeypatch, state="pivot")
    rows = PickerRows(sessions=store.session_summaries(), plans=[("tui-test", plan.title, len(plan.items))])
    monkeypatch.setattr("agent.tui.app.picker_rows", lambda store: rows)  # the shipped plans change; this does not
    app = PivotApp(ChatController(paths, store), clock=FROZEN)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen))
        await assert_snapshot(pilot, "picker", pytestconfig)


async def test_the_main_screen(store, paths, plan, monkeypatch, pytestconfig):
    await _show(store, paths, ledger(store, paths, plan, monkeypatch), "main", pytestconfig)


async def test_a_pivot_with_its_options(store, paths, plan, monkeypatch, pytestconfig):
    await _show(store, paths, ledger(store, paths, plan, monkeypatch, state="pivot"), "pivot", pytestconfig)


async def test_the_pivot_after_a_crash(store, paths, plan, monkeypatch, pytestconfig):
    await _show(store, paths, ledger(store, paths, plan, monkeypatch, state="crash"), "crash-pivot", pytestconfig)


async def test_a_finished_campaign(store, paths, plan, monkeypatch, pytestconfig):
    await _show(store, paths, ledger(store, paths, plan, monkeypatch, state="finished"), "finished", pytestconfig)


async def test_the_summary_viewer(store, paths, plan, monkeypatch, pytestconfig):
    sid = ledger(store, paths, plan, monkeypatch, state="pivot")
    controller = ChatController(paths, store)
    controller.open(sid)
    app = PivotApp(controller, clock=FROZEN)
    async with app.run_test(size=SIZE) as pilot:
        await _opened(app, pilot)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, SummaryScreen))
        await assert_snapshot(pilot, "summary", pytestconfig)


class HeldStep:
    """A scripted model whose step reads the server's state, then waits (a model thinking) until released."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, messages: list[Any], info: Any) -> ModelResponse:
        if not any(isinstance(x, ModelResponse) for x in messages[-1:]) and self._calls(messages) == 0:
            return ModelResponse(parts=[ToolCallPart("server_status", {}, tool_call_id="h1")])
        self.waiting.set()
        await self.release.wait()
        return ModelResponse(parts=[TextPart("Nothing runs; the next step is the baseline of tier 2.")])

    @staticmethod
    def _calls(messages: list[Any]) -> int:
        return sum(1 for x in messages for p in x.parts if getattr(p, "tool_call_id", None) == "h1")


async def _held(store, paths, plan, monkeypatch, config, *, cancel: bool) -> None:
    sid = ledger(store, paths, plan, monkeypatch)
    held = HeldStep()
    controller = ChatController(paths, store, model=FunctionModel(held))
    controller.open(sid)
    app = PivotApp(controller, clock=FROZEN)
    async with app.run_test(size=SIZE) as pilot:
        await _opened(app, pilot)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: held.waiting.is_set() and app.running)
        if not cancel:
            await assert_snapshot(pilot, "running", config)
            held.release.set()
            await wait_for(pilot, lambda: app.steps_done == 1)
            return
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.steps_done == 1)
        assert store.get_session(sid).status == "stopped"
        await assert_snapshot(pilot, "cancel", config)


async def test_a_running_step(store, paths, plan, monkeypatch, pytestconfig):
    await _held(store, paths, plan, monkeypatch, pytestconfig, cancel=False)


async def test_a_cancelled_step(store, paths, plan, monkeypatch, pytestconfig):
    await _held(store, paths, plan, monkeypatch, pytestconfig, cancel=True)


class _Options:
    def __init__(self, update: bool) -> None:
        self.update = update

    def getoption(self, name: str) -> bool:
        return self.update


@pytest.mark.parametrize("how", ["option", "environment"])
def test_snapshots_are_never_rewritten_in_ci(monkeypatch, how):
    from tests.snapshot import updating

    monkeypatch.delenv("PIVOT_UPDATE_SNAPSHOTS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    if how == "environment":
        monkeypatch.setenv("PIVOT_UPDATE_SNAPSHOTS", "1")
    config = _Options(update=how == "option")
    assert updating(config) is True  # asked for, outside CI
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.UsageError, match="never rewritten in CI"):
        updating(config)
