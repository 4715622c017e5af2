"""`pivot mcp` driven by a real MCP client (fastmcp's own): over stdio from the plan check to a pivot on the twin and
its answer, the summary read as a resource; a cancel that stops the server and leaves the session resumable; errors
as one clear line; streamable HTTP on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from fastmcp.exceptions import ToolError

from agent import models as m
from agent.mcp.server import build_server
from agent.store import Store
from tests.procs import gone

ROOT = Path(__file__).resolve().parent.parent
DEMO = "glm5-nvfp4-rtxpro6000x8"
TOOLS = {"list_plans", "check_plan", "start_campaign", "answer_pivot", "resume_campaign", "list_sessions",
         "show_session", "write_summary", "investigate", "predict", "audit_flags"}  # fmt: skip


def pivot_mcp(home: Path) -> StdioTransport:
    return StdioTransport(sys.executable, ["-m", "agent.cli", "--home", str(home), "mcp"], cwd=str(ROOT),
                          keep_alive=False)  # fmt: skip


async def test_a_client_runs_a_plan_to_its_first_pivot_over_stdio_and_answers_it(pivot_home):
    progress: list[str] = []

    async def on_progress(done, total, message):
        progress.append(message or "")

    async with Client(pivot_mcp(pivot_home), timeout=300) as client:
        tools = {t.name: t for t in await client.list_tools()}
        assert set(tools) == TOOLS
        start = tools["start_campaign"]
        assert start.input_schema["required"] == ["plan"]
        assert start.input_schema["properties"]["engine"]["default"] == "sim"
        assert "first pivot" in (start.description or "") and start.output_schema is not None
        assert all(t.description for t in tools.values())

        plans = (await client.call_tool("list_plans")).structured_content["result"]
        assert DEMO in [p["name"] for p in plans]
        check = (await client.call_tool("check_plan", {"plan": DEMO})).structured_content
        assert check["ok"] is False and check["errors"] == 2  # the seeds' plan: 02's removed flag, 05's direction
        assert {p["where"] for p in check["problems"] if p["severity"] == "error"} == {"item 02", "item 05"}

        first = (
            await client.call_tool("start_campaign", {"plan": DEMO}, progress_handler=on_progress)
        ).structured_content
        assert first["status"] == "pivot" and first["question"] and len(first["options"]) >= 2
        assert any("launch_server" in p for p in progress) and any("write_status_summary" in p for p in progress)
        sid = first["session"]
        assert first["summary_resource"] == f"pivot://sessions/{sid}/status"
        listed = {str(r.uri) for r in await client.list_resources()}
        assert first["summary_resource"] in listed
        summary = (await client.read_resource(first["summary_resource"]))[0].text
        assert summary.startswith("# Status 001") and first["question"] in summary
        assert Path(first["summary_path"]).read_text() == summary

        from agent import __version__

        assert client.server_info.version == __version__  # pivot's, not the MCP library's
        with pytest.raises(ToolError, match="did not understand 'banana'"):  # refused: the question is kept
            await client.call_tool("answer_pivot", {"session": sid, "answer": "banana"})
        second = (await client.call_tool("answer_pivot", {"session": sid, "answer": "1"})).structured_content
        assert second["status"] == "pivot" and second["question"] != first["question"]
        assert "07 Expert parallelism EP8 crashed" in second["question"]  # the seeds' Tier 2, as the CLI runs it
        shown = (await client.call_tool("show_session", {"session": sid})).structured_content
        assert [p["answer"] for p in shown["pivots"]] == ["1", None]
        assert any(e["verdict"] == "crashed" and e["plan_items"] == ["07"] for e in shown["experiments"])
        latest = (await client.read_resource(f"pivot://sessions/{sid}/status"))[0].text
        assert latest.startswith("# Status 002")
    with Store(pivot_home / "state" / "pivot.db") as store:
        assert store.session_lock(sid) is None  # held only while a step runs
        assert store.get_session(sid).status == "active" or store.open_pivot(sid) is not None


async def test_reads_the_twin_audit_and_errors_in_process(store, paths):
    async with Client(build_server(paths, store)) as client:
        pred = (await client.call_tool("predict", {"flags": "--tp-size 8", "concurrency": [1, 256]})).structured_content
        assert pred["source"] == "simulated" and [lv["max_concurrency"] for lv in pred["levels"]] == [1, 256]
        assert pred["levels"][1]["output_throughput"] > pred["levels"][0]["output_throughput"] > 0
        audit = await client.call_tool("audit_flags", {"flags": "--tp-size 8 --enable-piecewise-cuda-graph"})
        rows = {r["flag"]: r for r in audit.structured_content["rows"]}
        assert (
            audit.structured_content["would_start"] is False
            and rows["--enable-piecewise-cuda-graph"]["status"] == "unknown"
        )
        with pytest.raises(ToolError, match="no-such-plan"):
            await client.call_tool("check_plan", {"plan": "no-such-plan"})
        with pytest.raises(ToolError, match="no-such-plan"):
            await client.call_tool("start_campaign", {"plan": "no-such-plan"})
        with pytest.raises(ToolError, match="no session"):
            await client.call_tool("answer_pivot", {"session": "nosuch", "answer": "1"})
        with pytest.raises(Exception, match="no session"):
            await client.read_resource("pivot://sessions/nosuch/status")
        assert (await client.call_tool("list_sessions")).structured_content["result"] == []
        with pytest.raises(ToolError, match="unknown SLO 'itl'"):  # checked before anything is recorded
            await client.call_tool("start_campaign", {"plan": DEMO, "objective": "goodput", "slo": "itl:5"})
        assert (await client.call_tool("list_sessions")).structured_content["result"] == []
        out = (await client.call_tool("start_campaign", {"plan": DEMO, "objective": "goodput",
                                                         "slo": "ttft:1,tpot:1"})).structured_content  # fmt: skip
        assert out["status"] == "pivot" and "gives 0 for the objective" in out["question"]
        assert store.get_session(out["session"]).plan.objective == m.Objective(kind="goodput", ttft_ms=1, tpot_ms=1)


async def test_a_cancel_stops_the_server_and_the_session_resumes(store, paths):
    plan = str(ROOT / "plans" / "llama70b-fp8-h200x1.toml")
    benchmarking = asyncio.Event()

    async def on_progress(done, total, message):
        if "run_benchmark(" in (message or ""):
            benchmarking.set()

    async with Client(build_server(paths, store), timeout=300) as client:
        call = asyncio.ensure_future(client.call_tool(
            "start_campaign", {"plan": plan, "engine": "sim-http", "concurrency": [1, 16]}, progress_handler=on_progress
        ))  # fmt: skip
        await asyncio.wait_for(benchmarking.wait(), 120)
        [session] = store.session_summaries()
        running = store.servers(session.id, running_only=True)
        assert len(running) == 1 and not gone(running[0].pid, 0.1)  # the baseline's server serves the benchmark
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        deadline = time.monotonic() + 60
        while store.session_lock(session.id) is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # the server settles the ledger, then lets the session go
        assert store.session_lock(session.id) is None
        assert gone(running[0].pid, 10)
        assert store.servers(session.id, running_only=True) == []
        assert store.get_session(session.id).status == "stopped"
        assert [e.status for e in store.experiments(session.id)] == ["interrupted"]  # redone in place on resume
        after = (await client.call_tool("resume_campaign", {"session": session.id})).structured_content
        assert after["status"] == "pivot", after
    runs = store.bench_results(store.experiments(session.id)[0].id)
    assert len(runs) >= 2 and all(not r.interrupted for r in runs)  # the cut-short run left nothing half recorded


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_http_serves_on_loopback_until_sigterm(pivot_home):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "--home", str(pivot_home), "mcp", "--http", "--port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 60
        while True:
            try:
                async with Client(url) as client:
                    assert {t.name for t in await client.list_tools()} >= TOOLS
                    plans = (await client.call_tool("list_plans")).structured_content["result"]
                    assert DEMO in [p["name"] for p in plans]
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                await asyncio.sleep(0.5)
        listening = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
        local = {row[1] for row in listening if row[3] == "0A"}  # LISTEN
        assert f"0100007F:{port:04X}" in local and f"00000000:{port:04X}" not in local  # 127.0.0.1 only
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, 128 + signal.SIGTERM), err[-2000:]  # pivot's SIGTERM: servers stopped, then exit
    assert "Uvicorn running on http://127.0.0.1:" in err


async def test_two_step_calls_on_one_session_at_once_are_not_both_admitted(store, paths):
    """G1: the ledger's lock is per process and every request of the server runs in its one process: the second
    step call on a session while one runs is refused with the CLI's words, and the answer is recorded once."""
    async with Client(build_server(paths, store)) as client:
        first = (await client.call_tool("start_campaign", {"plan": DEMO})).structured_content
        sid = first["session"]
        calls = [
            client.call_tool("answer_pivot", {"session": sid, "answer": "1"}),
            client.call_tool("answer_pivot", {"session": sid, "answer": "stop"}),
            client.call_tool("resume_campaign", {"session": sid}),
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
    refused = [r for r in results if isinstance(r, ToolError)]
    done = [r for r in results if not isinstance(r, BaseException)]
    assert len(done) == 1 and len(refused) == 2, results
    assert all("is in use by pid" in str(r) for r in refused)
    answered = [p.answer for p in store.pivots(sid) if p.answer is not None]
    assert len(answered) == 1  # one answer recorded, not one per caller


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip


async def test_http_checks_host_origin_and_the_bearer_token(pivot_home, tmp_path):
    """G2: a foreign Host (DNS rebinding) or Origin (a web page) is refused, and so is a request without the token."""
    import httpx

    token = "t0ken-" + "x" * 26
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "--home", str(pivot_home), "mcp", "--http", "--port", str(port),
         "--token-file", str(token_file)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/mcp"
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    good = {**accept, "Authorization": f"Bearer {token}"}
    try:
        deadline = time.monotonic() + 120
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                try:
                    first = await http.post(url, json=INITIALIZE, headers=good)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    await asyncio.sleep(0.3)
            assert first.status_code == 200, first.text
            assert (await http.post(url, json=INITIALIZE, headers=accept)).status_code == 401
            wrong = {**accept, "Authorization": "Bearer " + "y" * 32}
            assert (await http.post(url, json=INITIALIZE, headers=wrong)).status_code == 401
            rebound = await http.post(url, json=INITIALIZE, headers={**good, "Host": "evil.example"})
            assert rebound.status_code in (403, 421), rebound.status_code
            page = await http.post(url, json=INITIALIZE, headers={**good, "Origin": "http://evil.example"})
            assert page.status_code == 403, page.status_code
            # G13 over HTTP: a body that is not JSON, or JSON nested past the parser's limit, is answered -32700
            for body in (b"not json", b"[" * 100_000 + b"]" * 100_000):
                bad = await http.post(url, content=body, headers=good)
                assert bad.status_code == 400 and bad.json()["error"]["code"] == -32700, bad.text[:300]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


async def test_file_arguments_stay_under_the_roots_and_bounds_hold(store, paths, tmp_path):
    """G2 (files), G4, G8: a plan or profile named by path outside the roots is refused without being read (its
    content and positions never echoed); out-of-range numbers and an engine its options cannot build are refused
    before anything is recorded."""
    foreign = tmp_path / "elsewhere" / "secret.toml"
    foreign.parent.mkdir()
    foreign.write_text("password = 'hunter2'\n[[[broken")
    async with Client(build_server(paths, store)) as client:
        for tool, args in (("check_plan", {"plan": str(foreign)}),
                           ("predict", {"model_profile": str(foreign)}),
                           ("start_campaign", {"plan": str(foreign)})):  # fmt: skip
            with pytest.raises(ToolError) as info:
                await client.call_tool(tool, args)
            assert "outside the folders" in str(info.value) and "hunter2" not in str(info.value)
            assert "line" not in str(info.value).split("outside")[0]
        for args in ({"num_prompts": 10**9}, {"noise": 1e308}, {"concurrency": [0]}, {"gpus": 10**6}):
            with pytest.raises(ToolError) as info:
                await client.call_tool("predict", args)
            assert "Traceback" not in str(info.value) and len(str(info.value)) < 2000
        for args in ({"engine": "command"}, {"noise": 1e300}, {"seed": -1}):
            with pytest.raises(ToolError):
                await client.call_tool("start_campaign", {"plan": DEMO, **args})
        assert (await client.call_tool("list_sessions")).structured_content["result"] == []  # nothing recorded
        inside = paths.home / "plans" / "mine.toml"
        inside.parent.mkdir(parents=True, exist_ok=True)
        inside.write_text((ROOT / "plans" / f"{DEMO}.toml").read_text())
        assert (await client.call_tool("check_plan", {"plan": str(inside)})).structured_content["plan"]
