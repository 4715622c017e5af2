"""`pivot sim serve` as a real process with a real HTTP client: readiness, streaming, metrics, profile, failures."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import models as m
from tools.engines.catalog import CatalogError, load_catalog
from tools.profiles import load_hardware, load_model

ROOT = Path(__file__).resolve().parents[1]
READY_LINE = "The server is fired up and ready to roll!"
TOKEN = " tok"
CRASH_LINE = "RuntimeError: CUDA error: an illegal memory access was encountered"
OOM_LINE = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
METRIC_NAMES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:gen_throughput",
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:prompt_tokens",
    "sglang:generation_tokens",
    "sglang:max_total_num_tokens",
)

_PROCS: list[subprocess.Popen[bytes]] = []


@pytest.fixture(scope="session", autouse=True)
def _no_server_outlives_the_tests() -> Iterator[None]:
    """Fail the run if a server process started here is still alive at the end (and kill it)."""
    yield
    alive = [p for p in _PROCS if p.poll() is None]
    for p in alive:
        _kill(p)
    assert not alive, f"server processes outlived the tests: {[p.pid for p in alive]}"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(*flags: str, time_scale: float = 50, startup_s: float = 1) -> list[str]:
    return [sys.executable, "-m", "agent.cli", "sim", "serve", "--time-scale", str(time_scale),
            "--startup-s", str(startup_s), "--", *flags]  # fmt: skip


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    statuses: list[int]  # /health answers while it started (0: connection refused)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _start(tmp: Path, *flags: str, startup_s: float = 1, timeout_s: float = 30) -> Server:
    port = _free_port()
    log = tmp / f"serve-{port}.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(_command(*flags, "--port", str(port), startup_s=startup_s), cwd=ROOT,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    _PROCS.append(proc)
    server = Server(proc, f"http://127.0.0.1:{port}", log, [])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{server.log_text()}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as r:
                server.statuses.append(r.status)
                return server
        except urllib.error.HTTPError as e:
            server.statuses.append(e.code)
        except (urllib.error.URLError, ConnectionError):
            server.statuses.append(0)
        time.sleep(0.05)
    _kill(proc)
    raise AssertionError(f"the server was not ready in {timeout_s} s:\n{server.log_text()}")


def _stop(server: Server) -> int:
    """SIGTERM, as a launcher stops it; the exit code (killed after 10 s)."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            return server.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill(server.proc)
    return server.proc.returncode


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """GLM-5-NVFP4 on 8 simulated RTX PRO 6000, TP8, 50x faster than real time, metrics on."""
    s = _start(tmp_path_factory.mktemp("serve"), "--tp-size", "8", "--enable-metrics")
    yield s
    assert _stop(s) == 0, f"SIGTERM should stop the server with 0:\n{s.log_text()[-2000:]}"
    assert "Received SIGTERM" in s.log_text()


def _session(url: str, limit: int = 100) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)
    return aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=limit), timeout=timeout)


async def _sse(session: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON events of an SSE response, after checking its framing: `data: ...` blocks, then `data: [DONE]`."""
    async with session.post(path, json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    blocks = raw.split("\n\n")
    assert blocks[-1] == "", "the stream must end with a blank line"
    blocks = blocks[:-1]
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), raw[:500]
    assert blocks[-1] == "data: [DONE]"
    return [json.loads(b[len("data: ") :]) for b in blocks[:-1]]


async def _metrics(session: aiohttp.ClientSession) -> dict[str, float]:
    async with session.get("/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


# ---------------------------------------------------------------------------------------------- readiness


def test_health_is_503_while_starting_then_200_with_the_ready_line(server: Server) -> None:
    answered = [s for s in server.statuses if s]
    assert answered[0] == 503 and answered[-1] == 200, server.statuses
    log = server.log_text()
    assert READY_LINE in log
    assert "max_total_num_tokens=" in log and "max_running_requests=" in log and "context_len=202752" in log


async def test_info_endpoints_report_the_twin_and_its_time_scale(server: Server) -> None:
    async with _session(server.url) as s:
        async with s.get("/server_info") as r:
            info = await r.json()
        async with s.get("/model_info") as r:
            model_info = await r.json()
        async with s.get("/v1/models") as r:
            models = await r.json()
    model = load_model("glm-5-nvfp4")
    assert info["time_scale"] == 50
    assert info["version"] == "0.5.23 (pivot twin)"
    assert info["tp_size"] == 8 and info["max_running_requests"] > 0
    assert info["max_total_num_tokens"] > 100_000
    assert "last_gen_throughput" in info["internal_states"][0]
    assert model_info["model_path"] == model.model_path and model_info["architectures"] == [model.architecture]
    card = models["data"][0]
    assert card["id"] == model.model_path and card["max_model_len"] == model.context_length
    assert card["owned_by"] == "sglang"


# ---------------------------------------------------------------------------------------------- streaming


async def test_generate_streams_exactly_max_new_tokens_with_cumulative_text(server: Server) -> None:
    lengths = [1, 5, 12, 20]
    async with _session(server.url) as s:
        results = await asyncio.gather(
            *(
                _sse(s, "/generate", {"input_ids": list(range(30)), "stream": True, "sampling_params":
                                      {"max_new_tokens": n, "ignore_eos": True}})
                for n in lengths
            )
        )  # fmt: skip
    for n, events in zip(lengths, results, strict=True):
        assert len(events) == n
        assert [e["meta_info"]["completion_tokens"] for e in events] == list(range(1, n + 1))
        assert events[-1]["text"] == TOKEN * n
        assert events[-1]["meta_info"]["prompt_tokens"] == 30
        assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": n}
        assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])


async def test_openai_completions_and_chat_stream_tokens_and_usage(server: Server) -> None:
    usage = {"include_usage": True}
    async with _session(server.url) as s:
        completion, chat = await asyncio.gather(
            _sse(s, "/v1/completions", {"model": "m", "prompt": list(range(10)), "max_tokens": 9, "stream": True,
                                        "stream_options": usage}),
            _sse(s, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi " * 40}],
                                             "max_completion_tokens": 7, "stream": True, "stream_options": usage}),
        )  # fmt: skip
        async with s.post("/v1/completions", json={"prompt": "once upon a time", "max_tokens": 3}) as r:
            whole = await r.json()
    *tokens, last = completion
    assert "".join(e["choices"][0]["text"] for e in tokens) == TOKEN * 9
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 10, "completion_tokens": 9, "total_tokens": 19}
    role, *tokens, last = chat
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"]["content"] for e in tokens) == TOKEN * 7
    assert last["usage"]["completion_tokens"] == 7
    assert whole["choices"][0]["text"] == TOKEN * 3 and whole["usage"]["completion_tokens"] == 3


async def test_a_client_that_leaves_does_not_disturb_the_server(server: Server) -> None:
    async with _session(server.url) as s:
        before = await _metrics(s)
        body = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 100}}
        async with s.post("/generate", json=body) as r:
            assert (await r.content.readline()).startswith(b"data: ")
            r.close()  # gone after the first token
        async with s.post("/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 4}}) as r:
            assert (await r.json())["meta_info"]["completion_tokens"] == 4
        deadline = time.monotonic() + 10
        while (after := await _metrics(s))["sglang:num_running_reqs"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the abandoned request finishes silently
    assert after["sglang:num_running_reqs"] == 0
    assert after["sglang:num_aborted_requests_total"] == before["sglang:num_aborted_requests_total"] + 1
    assert server.proc.poll() is None


# ---------------------------------------------------------------------------------------------- metrics, profile, telemetry


async def test_metrics_use_sglang_names_and_count_the_tokens(server: Server) -> None:
    requests = [(8, 5), (16, 9), (40, 3)]  # (prompt tokens, max_new_tokens)
    async with _session(server.url) as s:
        async with s.get("/metrics") as r:
            text = await r.text()
        before = await _metrics(s)
        await asyncio.gather(
            *(
                _sse(s, "/generate", {"input_ids": [7] * p, "stream": True, "sampling_params": {"max_new_tokens": n}})
                for p, n in requests
            )
        )
        after = await _metrics(s)
    for name in METRIC_NAMES:
        assert f"# TYPE {name}" in text, name
    assert 'model_name="lukealonso/GLM-5-NVFP4"' in text
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta["sglang:generation_tokens_total"] == sum(n for _, n in requests)
    assert delta["sglang:prompt_tokens_total"] == sum(p for p, _ in requests)
    assert delta["sglang:time_to_first_token_seconds_count"] == len(requests)
    assert delta["sglang:inter_token_latency_seconds_count"] == sum(n - 1 for _, n in requests)
    assert after["sglang:max_total_num_tokens"] > 100_000


async def test_profile_window_returns_the_step_time_breakdown(server: Server) -> None:
    async with _session(server.url) as s:
        async with s.post("/start_profile") as r:
            assert r.status == 200
        await asyncio.gather(
            *(
                _sse(s, "/generate", {"input_ids": [1] * 64, "stream": True, "sampling_params": {"max_new_tokens": 16}})
                for _ in range(8)
            )
        )
        async with s.post("/stop_profile") as r:
            assert r.status == 200
            profile = await r.json()
        async with s.post("/stop_profile") as r:
            assert r.status == 400  # no window open
    parts = profile["breakdown"]
    assert set(parts) == {"expert_gemm", "dense_gemm", "attention", "communication", "host_overhead"}
    assert sum(p["share"] for p in parts.values()) == pytest.approx(1.0, abs=1e-6)
    assert sum(p["seconds"] for p in parts.values()) == pytest.approx(profile["step_time_s"])
    assert parts["expert_gemm"]["seconds"] > 0 and parts["communication"]["seconds"] > 0
    assert profile["prefill_steps"] >= 1 and profile["decode_steps"] >= 15
    assert profile["window_s"] >= profile["step_time_s"] * 0.9


async def test_sim_telemetry_is_pivots_telemetry_model(server: Server) -> None:
    async with _session(server.url) as s, s.get("/sim/telemetry") as r:
        telemetry = m.Telemetry.model_validate_json(await r.text())
    hw = load_hardware("rtx-pro-6000-blackwell")
    assert telemetry.source == "simulated" and len(telemetry.gpus) == 8
    for gpu in telemetry.gpus:
        assert hw.idle_w <= gpu.power_w_mean <= hw.tdp_w
        assert gpu.energy_j > 0 and gpu.mem_used_mib_max > 50 * 1024
    assert telemetry.server_metrics["sim_time_s"] > 0


# ---------------------------------------------------------------------------------------------- failures


def _run(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(*flags), cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_flag_sglang_refuses_exits_2_with_sglangs_message() -> None:
    result = _run("--tp-size", "8", "--enable-piecewise-cuda-graph")
    assert result.returncode == 2
    assert "sglang serve: error: unrecognized arguments: --enable-piecewise-cuda-graph\n" in result.stderr
    with pytest.raises(CatalogError) as refused:
        load_catalog("sglang", "0.5.23").parse(["--tp-size", "8", "--enable-piecewise-cuda-graph"],
                                               require_model=False)  # fmt: skip
    assert result.stderr == refused.value.stderr  # exactly what SGLang prints, nothing else
    assert result.stdout == ""


def test_weights_that_do_not_fit_exit_1_with_the_oom_line() -> None:
    result = _run("--tp-size", "8", "--mem-fraction-static", "0.5", "--port", str(_free_port()))
    assert result.returncode == 1
    assert OOM_LINE in result.stderr
    assert READY_LINE not in result.stderr


async def test_ep8_serves_light_load_then_crashes_under_load(tmp_path: Path) -> None:
    server = _start(tmp_path, "--tp-size", "8", "--ep-size", "8", startup_s=0.5)
    try:
        async with _session(server.url, limit=1024) as s:
            async with s.get("/metrics") as r:
                assert r.status == 404  # no --enable-metrics
            async with s.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}}) as r:
                assert (await r.json())["meta_info"]["completion_tokens"] == 4

            async def one() -> bool:
                body = {"input_ids": [3] * 8, "stream": True, "sampling_params": {"max_new_tokens": 512}}
                async with s.post("/generate", json=body) as r:
                    return (await r.read()).rstrip().endswith(b"data: [DONE]")

            results = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(600)), return_exceptions=True), 30)
        failed = [r for r in results if r is not True]
        assert len(failed) >= 512, f"{len(failed)} of 600 streams failed"
        assert all(isinstance(r, aiohttp.ClientError | ConnectionError) for r in failed), {type(r) for r in failed}
        assert await asyncio.to_thread(server.proc.wait, 15) == 1
        log = server.log_text()
        assert CRASH_LINE in log and "Scheduler hit an exception" in log
        assert log.index(READY_LINE) < log.index(CRASH_LINE)
    finally:
        if server.proc.poll() is None:
            _kill(server.proc)
