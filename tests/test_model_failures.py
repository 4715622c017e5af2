"""A model that fails (connection refused, 401, 429, 5xx, timeouts): retried with backoff where that helps, then one
line and a hint, exit 1, no traceback, no key in the output, and the session left `waiting` to resume."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.session import Paths
from agent.store import Store
from tests.procs import pivot_here

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-test-0123456789abcdefSECRET"
ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "done for now"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1234, "completion_tokens": 5, "total_tokens": 1239},
}


class FakeModel:
    """An OpenAI-compatible /v1/chat/completions that answers every request with `status` (or sleeps)."""

    def __init__(self, status: int, sleep_s: float = 0.0, fail_first: int | None = None) -> None:
        self.status, self.sleep_s, self.requests, self.fail_first = status, sleep_s, 0, fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.requests += 1
                self.rfile.read(int(self.headers.get("content-length") or 0))
                if outer.sleep_s:
                    time.sleep(outer.sleep_s)
                status = outer.status
                body = json.dumps({"error": {"message": f"Incorrect API key provided: {KEY}", "type": "x"}}).encode()
                if outer.fail_first is not None and outer.requests > outer.fail_first:
                    status, body = 200, json.dumps(ANSWER).encode()  # the failure passed
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("retry-after", "0")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run(home: Path, url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`pivot run` with a model at `url` (these tests' own fake: the one model requests may go to)."""
    import pydantic_ai.models

    full = {"PIVOT_HOME": str(home), "PIVOT_MODEL_API_KEY": KEY, **env}
    pydantic_ai.models.ALLOW_MODEL_REQUESTS = True
    try:
        return pivot_here("run", "glm5-nvfp4-rtxpro6000x8", "--model", "openai-chat:m", "--model-base-url", url,
                          env=full)  # fmt: skip
    finally:
        pydantic_ai.models.ALLOW_MODEL_REQUESTS = False


def check(home: Path, done: subprocess.CompletedProcess[str], words: str) -> None:
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    assert "Traceback" not in text and KEY not in text, text
    assert words in done.stderr and "hint:" in done.stderr, text
    with Store(Paths.from_env(home).db_path) as store:
        (session,) = store.list_sessions()
        assert session.status == "waiting"
        assert f"pivot resume {session.id}" in done.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_closed_port_is_one_line_and_a_hint(tmp_path):
    done = run(tmp_path, f"http://127.0.0.1:{closed_port()}/v1", PIVOT_MODEL_RETRIES="1")
    check(tmp_path, done, "did not answer")
    assert "refused" in done.stderr.lower()


@pytest.mark.parametrize(
    ("status", "words", "retried"),
    [(401, "refused the key (HTTP 401)", False), (429, "rate-limited", True), (503, "failed (HTTP 503)", True)],
)
def test_http_failures_are_retried_where_that_helps(tmp_path, status, words, retried):
    fake = FakeModel(status)
    try:
        done = run(tmp_path, fake.url, PIVOT_MODEL_RETRIES="2")
    finally:
        fake.close()
    check(tmp_path, done, words)
    assert fake.requests == (3 if retried else 1)


def test_a_model_that_does_not_answer_in_time(tmp_path):
    fake = FakeModel(200, sleep_s=3.0)
    try:
        done = run(tmp_path, fake.url, PIVOT_MODEL_RETRIES="0", PIVOT_MODEL_TIMEOUT_S="0.5")
    finally:
        fake.close()
    check(tmp_path, done, "timed out")


def test_a_server_error_that_passes_is_retried_and_the_run_goes_on(tmp_path):
    fake = FakeModel(503, fail_first=2)
    try:
        done = run(tmp_path, fake.url, PIVOT_MODEL_RETRIES="3")
    finally:
        fake.close()
    assert done.returncode == 0 and "waiting: done for now" in done.stdout, done.stdout + done.stderr
    assert fake.requests == 3
    with Store(Paths.from_env(tmp_path).db_path) as store:
        (session,) = store.list_sessions()
        (usage,) = store.usage(session.id)
    # the provider's own counts, kept per run; a self-hosted server has no price
    assert (usage.requests, usage.input_tokens, usage.output_tokens, usage.cost_usd) == (1, 1234, 5, None)
