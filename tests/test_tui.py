"""`pivot chat`: the textual app driven headless with Pilot, on the autopilot and the twin (no model requests).

A chat message gets its reply; a pivot's button sends the agent on; the picker opens a session; Escape cancels a
running step (the server stops, the ledger is as a resume finds it, and the session goes on). What the screen shows
in each state is compared with SVG snapshots in tests/test_tui_snapshots.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.messages import ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import FunctionModel
from textual.pilot import Pilot
from textual.widgets import Button, Markdown

from agent import loop
from agent import models as m
from agent.session import Paths, Session
from agent.store import Store
from agent.tui import view
from agent.tui.app import PivotApp
from agent.tui.cancel import CancellableEngine, Canceller, StepCancelled
from agent.tui.controller import ChatController, default_engine
from agent.tui.screens import PickerScreen

SIZE = (120, 40)
FROZEN: Callable[[], float] = lambda: 0.0  # noqa: E731  (elapsed times in snapshots never move)

PLAN = """
name = "tui-test"
title = "A dense model on one H200, for the TUI's tests"

[target]
model = "org/dense-8b"
model_profile = "llama-3.3-70b-fp8"
hardware = "h200"
gpus = 1
flags = "--tp-size 1"

[workload]
random_input_len = 256
random_output_len = 128
concurrency = [1, 32]

[tiers]
1 = "Flags"
2 = "Config"

[[items]]
id = "01"
tier = 1
kind = "flag"
title = "FP8 KV cache"
flags = "--kv-cache-dtype fp8_e4m3"
hypothesis = "Half the KV bytes."
expected_impact = "+10% output tok/s at high concurrency"

[[items]]
id = "02"
tier = 2
kind = "config"
title = "Smaller chunks"
flags = "--chunked-prefill-size 2048"
hypothesis = "Less prefill stall."
expected_impact = "+2% output tok/s"
"""


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "tui-test.toml"
    path.write_text(PLAN)
    return path


async def wait_for(pilot: Pilot, condition: Callable[[], bool], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {condition}")
        await pilot.pause(0.05)


def log_text(app: PivotApp) -> list[str]:
    """The chat log as text: Markdown sources and tool lines."""
    out = []
    for widget in app.query_one("#log").children:
        if isinstance(widget, Markdown):
            out.append(widget.source)
        else:
            out.append(str(getattr(widget, "content", "")))
    return out


# ---------------------------------------------------------------------------------------------- view


def test_a_benchmark_is_one_line_with_its_levels_and_its_best():
    report = {
        "experiment_id": 1,
        "run": 1,
        "levels": [
            {"concurrency": 1, "output_tok_s": 10.2, "failed": 0},
            {"concurrency": 2048, "output_tok_s": 2095.4, "failed": 0},
            {"concurrency": 512, "output_tok_s": 1120.0, "failed": 0},
        ],
    }
    line = view.tool_line("run_benchmark", {}, report, done=True)
    assert line == "run_benchmark 1..2048 -> 2,095 tok/s at 2048 (exp 1 run 1)"
    report["levels"][1]["failed"] = 3
    report["failure"] = "oom"
    line = view.tool_line("run_benchmark", {}, report, done=True)
    # the highest level that held (512), not the maximum over levels (2048 failed; 10.2 at 1 is lower)
    assert line.startswith("run_benchmark 1..2048 -> 1,120 tok/s at 512;") and "failed at 2048 (oom)" in line
    assert view.tool_line("launch_server", {"baseline": True}) == "launch_server baseline ..."
    assert view.tool_line("ask_user", {"question": "q?", "options": ["a"]}, "2", done=True) == "ask_user -> answer: 2"


def test_history_pairs_each_call_with_its_result():
    messages = [
        ModelRequest(parts=[UserPromptPart("go")]),
        ModelResponse(parts=[TextPart("On it."), ToolCallPart("stop_server", {}, tool_call_id="c1")]),
        ModelRequest(parts=[ToolReturnPart("stop_server", {"running": False}, tool_call_id="c1")]),
        ModelResponse(parts=[ToolCallPart("todo_read", {}, tool_call_id="c2")]),  # killed before its result
    ]
    entries = view.history_entries(messages)
    assert [(e.kind, e.text) for e in entries] == [
        ("user", "go"),
        ("agent", "On it."),
        ("tool", "stop_server -> no server running"),
        ("tool", "todo_read ..."),
    ]


def test_sparkline_scales_to_the_limit():
    assert view.sparkline([0, 300, 600], 600) == "▁▅█"
    assert view.sparkline([]) == ""


def test_a_cancelled_step_refuses_engine_calls_and_the_wrappers_keep_the_contract(tmp_path):
    from agent.contracts import Deployment, Engine
    from tools.engines.sim.engine import SimEngine

    canceller = Canceller()
    calls: list[dict[str, Any]] = []

    class Recording(SimEngine):
        def launch(self, config: Any, log_path: Path, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return super().launch(config, log_path, **kwargs)

    engine = CancellableEngine(Recording(), canceller)
    assert isinstance(engine, Engine) and engine.name == "sim"
    dep = engine.launch(m.ServerConfig.parse("--tp-size 8"), tmp_path / "log", force=True)
    assert calls == [
        {"ledger": None, "force": True, "issues": None}
    ]  # keywords pass through as the protocol names them
    assert isinstance(dep, Deployment) and dep.argv is None and dep.log_path == tmp_path / "log"
    spec = m.BenchSpec(concurrency=[1], num_prompts=2, random_input_len=16, random_output_len=8)
    out = tmp_path / "runs.jsonl"
    assert dep.benchmark(spec, output_file=out).levels and out.read_text().count("\n") == 1
    assert canceller.cancel() == [dep]
    with pytest.raises(StepCancelled):
        dep.benchmark(spec)
    with pytest.raises(StepCancelled):
        engine.launch(m.ServerConfig(), tmp_path / "log2")
    dep.stop()  # stopping always goes through
    assert not dep.inner.alive()


def test_pivot_chat_is_registered_and_needs_a_terminal():
    from click.testing import CliRunner

    from agent.cli import cli

    result = CliRunner().invoke(cli, ["chat", "--help"])
    assert result.exit_code == 0 and "picker" in result.output
    result = CliRunner().invoke(cli, ["chat", "--demo"])  # CliRunner's stdin and stdout are not terminals
    assert result.exit_code == 1 and "pivot chat needs a terminal" in result.output
    result = CliRunner().invoke(cli, ["chat", "abc", "--demo"])
    assert result.exit_code == 1 and "not both" in result.output


def test_new_sessions_get_the_settings_of_pivot_run_and_pivot_demo(store: Store, paths: Paths, plan_file: Path):
    from agent.plans import load_plan
    from agent.tui.controller import run_settings

    run = run_settings(load_plan(plan_file))
    assert run.engine_options == {"model_profile": "llama-3.3-70b-fp8", "hardware": "h200", "gpus": 1}
    assert (run.min_gain_pct, run.reruns, run.stall_after, run.seed) == (3.0, 1, 3, 0)
    controller = ChatController(paths, store)
    session = controller.create("", demo=True)
    assert (session.record.name, session.record.engine, session.record.model) == ("demo", "sim", "autopilot")
    assert session.settings.engine_options["noise"] == 0.015
    controller.close()
    assert store.session_lock(session.id) is None


def test_the_cli_options_and_the_tui_read_one_source_of_defaults(plan_file: Path):
    """`pivot run` and `pivot demo` parsed from a bare command line give the settings the TUI gives, and every
    method option's default is SessionSettings' own; the TUI learns them without importing the CLI."""

    from agent import defaults
    from agent.cli.run import demo, run_cmd
    from agent.plans import load_plan
    from agent.tui.controller import run_settings

    plan = load_plan(plan_file)
    run = run_cmd.make_context("run", [str(plan_file)]).params
    assert run["engine"] is None and defaults.default_engine() == "sim"  # resolved from the settings when it runs
    for option, field in defaults.METHOD_SETTINGS.items():
        assert run[option] == m.SessionSettings.model_fields[field].default, option
    assert defaults.session_settings(plan.target, defaults.default_engine(), {}, run["noise"], run) == run_settings(
        plan
    )
    method = demo.make_context("demo", []).params
    from_cli = defaults.session_settings(plan.target, defaults.default_engine(), {}, defaults.demo()[1], method)
    assert from_cli == run_settings(plan, demo=True)
    tui = Path(__file__).resolve().parent.parent / "agent" / "tui"
    assert not [f"{path.name}: {name}" for path in tui.rglob("*.py") for name in _cli_imports(path)]


def _cli_imports(path: Path) -> list[str]:
    """The CLI modules a source file imports (`agent.cli...`, `from agent import cli...`)."""
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [f"{node.module}.{a.name}" for a in node.names] if node.module == "agent" else [node.module]
    return [n for n in names if n.startswith(("agent.cli.", "agent.cli_")) or n == "agent.cli"]


# ---------------------------------------------------------------------------------------------- chat


def _echo(messages: list[Any], info: Any) -> ModelResponse:
    prompts = [p.content for p in messages[-1].parts if isinstance(p, UserPromptPart)]
    prompt = prompts[-1] if prompts else "(nothing)"
    return ModelResponse(parts=[TextPart(f"You said: **{prompt}**. The ledger has 0 experiments.")])


async def test_a_message_gets_the_agents_reply(store: Store, paths: Paths, plan_file: Path):
    controller = ChatController(paths, store, model=FunctionModel(_echo))
    controller.create(str(plan_file))
    app = PivotApp(controller, clock=FROZEN)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.sessions_shown == 1)
        await pilot.press(*"how is it going?", "enter")
        await wait_for(pilot, lambda: app.steps_done == 1)
        texts = log_text(app)
        assert texts[-2:] == ["how is it going?", "You said: **how is it going?**. The ledger has 0 experiments."]
        assert app.query_one("#prompt").value == ""
    assert store.session_lock(controller_sid(store)) is None  # the app let go of the session when it closed


def controller_sid(store: Store) -> str:
    (summary,) = store.session_summaries()
    return summary.id


async def test_a_pivots_button_sends_the_agent_on(store: Store, paths: Paths, plan_file: Path):
    controller = ChatController(paths, store)
    controller.create(str(plan_file))
    sid = controller.require().id
    app = PivotApp(controller, autorun=True, clock=FROZEN)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.steps_done == 1)
        first = store.open_pivot(sid)
        assert first is not None and first.question.startswith("Tier 1 (Flags) done.")
        buttons = list(app.query(Button).results(Button))
        assert [str(b.label) for b in buttons] == [f"{i}. {o}" for i, o in enumerate(first.options, start=1)]
        assert any("run_benchmark 1..32 -> " in t and " tok/s at 32" in t for t in log_text(app))
        assert "baseline" in [row.verdict for row in app.board.experiments]
        await pilot.click("#option-1")
        await wait_for(pilot, lambda: app.steps_done == 2)
        assert store.pivots(sid)[0].answer == "1"
        # the agent went on into tier 2, the last: 02 is settled, then 01 and 02, which the plan expects +10% and +2%
        # of and the twin +0.5% and -0.1%, are checked together once (tools/probes.py: doubted), no gain; tier 2's
        # pivot offers 01 alone or the end, and "stop" ends the campaign
        assert any(row.item == "02" for row in app.board.experiments)
        assert [row.verdict for row in app.board.experiments if row.item == "01"][-1] == "no_gain"
        second = store.open_pivot(sid)
        assert second is not None and second.question.startswith("Tier 2 (Config) done."), second
        stop = next(i for i, o in enumerate(second.options, start=1) if o.startswith("stop"))
        await pilot.click(f"#option-{stop}")
        await wait_for(pilot, lambda: app.steps_done == 3)
        assert store.open_pivot(sid) is None and store.get_session(sid).status == "finished"
        assert f"**Answer 1:** {first.options[0]}" in log_text(app)


async def test_the_picker_opens_a_session(store: Store, paths: Paths, small_plan: m.Plan):
    with Session.create(store, paths, small_plan, name="picked", engine_name="sim") as s:
        store.replace_todos(s.id, [m.Todo(content="Measure the baseline", status="in_progress", priority="high")])
        store.add_pivot(s.id, m.Pivot(question="Which way?", options=["continue", "stop"]))
        sid = s.id
    app = PivotApp(ChatController(paths, store), clock=FROZEN)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen))
        await pilot.press("enter")  # the sessions table has the focus; its first row is the newest session
        await wait_for(pilot, lambda: app.sessions_shown == 1)
        assert app.controller.require().id == sid
        assert store.session_lock(sid) is not None  # opened here, locked by this process
        assert [(t.mark, t.content) for t in app.board.todos] == [("[>]", "Measure the baseline")]
        assert [str(b.label) for b in app.query(Button).results(Button)] == ["1. continue", "2. stop"]
        assert app.focused is not None and app.focused.id == "free-answer"
    assert store.session_lock(sid) is None


# ---------------------------------------------------------------------------------------------- cancel


class SlowDeployment:
    """A twin whose benchmark takes until `gate` is cleared or the server is stopped."""

    def __init__(self, inner: Any, gate: threading.Event, started: threading.Event) -> None:
        self.inner, self.gate, self.started = inner, gate, started

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def benchmark(self, spec: m.BenchSpec, on_progress: Any = None, **kwargs: Any) -> m.BenchResult:
        self.started.set()
        deadline = time.monotonic() + 240
        while self.gate.is_set() and self.inner.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.inner.benchmark(spec, on_progress, **kwargs)


class SlowEngine:
    name = "sim"

    def __init__(self, inner: Any, gate: threading.Event, started: threading.Event, launched: list) -> None:
        self.inner, self.gate, self.started, self.launched = inner, gate, started, launched

    def __getattr__(self, name: str) -> Any:  # the rest of the Engine protocol: the twin's
        return getattr(self.inner, name)

    def with_seed(self, seed: int) -> SlowEngine:
        return SlowEngine(self.inner.with_seed(seed), self.gate, self.started, self.launched)

    def validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        return self.inner.validate(config)

    def launch(self, config: m.ServerConfig, log_path: Path, **kwargs: Any) -> SlowDeployment:
        deployment = SlowDeployment(self.inner.launch(config, log_path, **kwargs), self.gate, self.started)
        self.launched.append(deployment)
        return deployment


async def test_escape_cancels_a_benchmark_the_server_stops_and_the_session_goes_on(
    store: Store, paths: Paths, plan_file: Path
):
    gate, started, launched = threading.Event(), threading.Event(), []
    gate.set()
    controller = ChatController(
        paths, store, engine_factory=lambda record: SlowEngine(default_engine(record), gate, started, launched)
    )
    controller.create(str(plan_file))
    sid = controller.require().id
    app = PivotApp(controller, autorun=True, clock=FROZEN)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, started.is_set)  # the baseline's benchmark is running
        live = controller.require().live
        assert live is not None and app.running
        eid = live.experiment_id
        assert eid is not None
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.steps_done == 1)
        assert not app.running and controller.require().live is None
        assert [d.alive() for d in launched] == [False]  # the server is stopped
        assert store.get_session(sid).status == "stopped"
        assert store.get_experiment(eid).status == "interrupted"  # as a resume after Ctrl-C finds it
        assert store.bench_results(eid) == []  # the benchmark cut short recorded nothing
        assert "▸ run_benchmark -> cancelled" in log_text(app)
        assert store.open_pivot(sid) is None
        loop.load_history(controller.require())  # the history still parses

        gate.clear()  # benchmarks are quick again: ctrl+g goes on to the first pivot
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: app.steps_done == 2)
        assert store.open_pivot(sid) is not None
        assert store.bench_results(eid)  # the interrupted baseline was measured on resume
        assert all(not d.alive() for d in launched)
    assert store.session_lock(sid) is None


@pytest.mark.slow
async def test_escape_on_sim_http_stops_the_server_process(store: Store, paths: Paths, plan_file: Path):
    from agent.plans import load_plan

    plan = load_plan(plan_file)
    t = plan.target
    options = {"model_profile": t.model_profile, "hardware": t.hardware, "gpus": t.gpus, "startup_s": 0.5}
    settings = m.SessionSettings(engine_options={**options, "time_scale": 0.5})  # a benchmark takes minutes
    with Session.create(store, paths, plan, engine_name="sim-http", settings=settings) as s:
        sid = s.id
    controller = ChatController(paths, store)
    controller.open(sid)
    app = PivotApp(controller, clock=FROZEN)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.sessions_shown == 1)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: "benchmarking" in app.activity, timeout=240)
        (server,) = store.servers(sid, running_only=True)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.steps_done == 1, timeout=240)
        assert store.servers(sid, running_only=True) == []
        assert not Path(f"/proc/{server.pid}").exists() or "zombie" in Path(f"/proc/{server.pid}/status").read_text()
        assert store.get_session(sid).status == "stopped"


def test_trace_lines_say_things_once_and_cut_at_words():
    assert view.short("a reason that ends at concurrency 2048", 36) == "a reason that ends at concurrency…"  # not "20…"
    _, predicted = view.result_text("record_verdict", {"experiment_id": 4, "verdict": "predicted",
                                                       "reason": "predicted: +0.0% inside the band"})  # fmt: skip
    assert predicted == "exp 4: predicted: +0.0% inside the band"
    _, report = view.result_text("investigate", {"investigation_id": 2, "status": "done", "report": "Experiment 7 "
                                                 "crashed under load.\nWhat to try: cap it.", "tools_used": []})  # fmt: skip
    assert report.startswith("investigation 2 done: Experiment 7 crashed under load.") and "{" not in report
