"""A server that answers with JSON of the wrong types, or with an SSE line that never ends, costs pivot a failed
request with its reason (never a traceback, never unbounded memory or a copy of the line per read)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web
from click.testing import CliRunner

from agent import models as m
from agent.cli import cli
from tools import loadgen
from tools.loadgen.stream import _SSE, MAX_SSE_LINE_BYTES, StreamError, _Counters

BAD_LINES = {
    "meta_info a string": ("generate", b'data: {"text": "x", "meta_info": "nope"}\n\n'),
    "completion_tokens many": ("generate", b'data: {"text": "x", "meta_info": {"completion_tokens": "many"}}\n\n'),
    "completion_tokens 10**30": (
        "generate",
        b'data: {"text": "x", "meta_info": {"completion_tokens": ' + str(10**30).encode() + b"}}\n\n",
    ),  # F14: was 18 OverflowError tracebacks
    "usage.completion_tokens 10**30": (
        "completions",
        b'data: {"choices": [{"text": "x"}], "usage": {"completion_tokens": ' + str(10**30).encode() + b"}}\n\n",
    ),
    "usage 5": ("completions", b'data: {"choices": [{"text": "x"}], "usage": 5}\n\n'),
    "choices a string": ("completions", b'data: {"choices": "nope"}\n\n'),
    "delta a list": ("chat", b'data: {"choices": [{"delta": [1]}]}\n\n'),
    "nested 100000 deep": ("generate", b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n"),
}


@pytest.fixture
def hostile() -> Iterator[tuple[str, dict]]:
    """A server whose /generate and /v1/completions stream what `state["body"]` says; /v1/models answers `models`."""
    state: dict = {"body": [b"data: [DONE]\n\n"], "models": {"data": 5}}

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in state["body"]:
            await resp.write(piece)
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response(state["models"])

    app = web.Application()
    app.router.add_post("/generate", stream)
    app.router.add_post("/v1/completions", stream)
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_get("/v1/models", models)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


SPEC = m.BenchSpec(concurrency=[1], num_prompts=2, warmup_requests=0, random_input_len=4, random_output_len=2)


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_json_of_the_wrong_types_fails_the_request_with_its_reason(case, hostile):
    url, state = hostile
    endpoint, line = BAD_LINES[case]
    state["body"] = [line]
    result = loadgen.benchmark(url, SPEC.model_copy(update={"endpoint": endpoint}), warmup_pause_s=0)
    (level,) = result.levels
    assert level.failed == 2 and level.completed == 0
    assert all(reason.startswith("malformed SSE line") for reason in level.errors), level.errors


def test_pivot_bench_against_them_is_one_line_each(hostile):
    url, state = hostile
    state["body"] = [BAD_LINES["meta_info a string"][1]]
    result = CliRunner().invoke(cli, ["bench", "--base-url", url, "--concurrency", "1", "--num-prompts", "1",
                                      "--warmup-requests", "0", "--input-len", "4", "--output-len", "2"],
                                catch_exceptions=False)  # fmt: skip
    assert result.exit_code == 1 and "Traceback" not in result.output  # /v1/models {"data": 5} was ignored
    assert "malformed SSE line: meta_info is not an object" in result.output


def test_a_line_without_a_newline_is_bounded():
    piece = b"x" * 65536
    reads = MAX_SSE_LINE_BYTES // len(piece) + 2
    sse = _SSE("generate", _Counters())
    with pytest.raises(StreamError, match="longer than 16 MiB"):  # bounded: refused once past the cap
        for _ in range(reads):
            sse.feed(piece, 0.0)
    ok = _SSE("generate", _Counters())
    ok.feed(b'data: {"text": "a", "meta_info": {"comp', 0.0)
    ok.feed(b'letion_tokens": 1}}\n\ndata: [DONE]\n\n', 1.0)
    assert ok.done and ok.output_len == 1 and list(ok.tokens) == [1]


def test_what_a_launched_process_inherits_is_decided_by_a_rule_not_a_list(monkeypatch):
    from tools.engines.process import passed_on, scrubbed_environ, server_environ

    stripped = ["MOONSHOTAI_API_KEY", "HEROKU_INFERENCE_KEY", "OLLAMA_API_KEY", "GITHUB_API_KEY", "GITHUB_TOKEN",
                "VERCEL_AI_GATEWAY_API_KEY", "PYDANTIC_AI_GATEWAY_API_KEY", "DASHSCOPE_API_KEY", "ALIBABA_API_KEY",
                "NEBIUS_API_KEY", "OVHCLOUD_API_KEY", "SAMBANOVA_API_KEY", "AWS_SECRET_ACCESS_KEY",
                "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "SOME_NEW_PROVIDER_API_KEY", "DB_PASSWORD",
                "GOOGLE_APPLICATION_CREDENTIALS", "PIVOT_MODEL_API_KEY", "API_KEY"]  # fmt: skip
    kept = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "PATH", "CUDA_VISIBLE_DEVICES", "TOKENIZERS_PARALLELISM",
            "PIVOT_HOME", "RAY_AUTH_TOKEN_PATH"]  # fmt: skip
    for name in stripped + kept:
        monkeypatch.setenv(name, "value-0123456789")
    env = server_environ()
    assert [n for n in stripped if n in env] == [] and all(n in env for n in kept)
    assert all(not passed_on(n) for n in stripped)
    with scrubbed_environ(keep=("RAY_AUTH_TOKEN",)):
        import os

        assert "OPENAI_API_KEY" not in os.environ or not passed_on("OPENAI_API_KEY")
        assert "MOONSHOTAI_API_KEY" not in os.environ and "HF_TOKEN" in os.environ
    import os

    assert os.environ["MOONSHOTAI_API_KEY"] == "value-0123456789"  # put back
