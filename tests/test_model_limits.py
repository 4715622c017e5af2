"""What a model can cost a session is bounded: an answer its provider's code cannot read is the model's failure (the
session left `waiting`), an answer that never ends meets a total deadline and a size cap, and a huge tool call is
refused, stored as a note of its size and never sent back whole."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart

from agent.context import MAX_PART_CHARS, cap_message, compact
from tests.test_method_guard import DOCS, _new
from tests.test_model_failures import check, run


class Answering:
    """A /v1/chat/completions that answers `body` (bytes, or a callable writing to the socket)."""

    def __init__(self, body) -> None:
        outer = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.requests += 1
                self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    if callable(body):
                        body(self)
                        return
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("body", [b'{"choices": "nope"}', b'{"choices": [5]}', b"[1, 2]"])
def test_an_answer_that_cannot_be_read_is_the_models_failure(tmp_path, body):
    fake = Answering(body)
    try:
        done = run(tmp_path, fake.url, PIVOT_MODEL_RETRIES="0")
    finally:
        fake.close()
    check(tmp_path, done, "the model at")  # one line, a hint, no traceback, the session waiting


def _trickle(handler: BaseHTTPRequestHandler) -> None:
    """A 200 whose body never ends: a byte a tenth of a second, for ever (the red team's 625 s at 961 MB)."""
    handler.send_response(200)
    handler.send_header("content-type", "application/json")
    handler.end_headers()
    handler.wfile.write(b'{"id": "x", "choices": [')
    for _ in range(600):
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(0.1)


def _flood(handler: BaseHTTPRequestHandler) -> None:
    """A 200 whose body is far larger than any answer, as fast as the socket takes it."""
    handler.send_response(200)
    handler.send_header("content-type", "application/json")
    handler.end_headers()
    handler.wfile.write(b'{"id": "x", "choices": [{"message": {"content": "')
    chunk = b"x" * 2**20
    for _ in range(200):
        handler.wfile.write(chunk)


@pytest.mark.parametrize("writer", [_trickle, _flood], ids=["trickle", "flood"])
def test_an_answer_that_never_ends_meets_a_deadline_and_a_size_cap(tmp_path, writer):
    fake = Answering(writer)
    start = time.monotonic()
    try:
        done = run(tmp_path, fake.url, PIVOT_MODEL_RETRIES="0", PIVOT_MODEL_TIMEOUT_S="3")
    finally:
        fake.close()
    took = time.monotonic() - start
    check(tmp_path, done, "the model at")
    print(f"ended {took:.1f} s after it started (before the fix: still reading after 625 s)")


def test_a_huge_tool_call_is_refused_kept_short_and_not_sent_back_whole(tmp_path):
    ledger = _new(tmp_path)
    huge = "x" * (10 * 2**20)
    ledger.run([*DOCS[:1], {"tool": "todo_write", "args": {"todos": [{"content": huge, "priority": "high"}]}}])
    stored = ledger.store.messages(ledger.sid)
    assert max(len(text) for text in stored) < 4 * MAX_PART_CHARS  # not 10 MB
    assert any("cut_by_pivot" in text for text in stored)
    assert any("at most 65,536" in text for text in stored)  # the call was refused, with the bound in words
    assert ledger.store.todos(ledger.sid) == []  # the tool never ran
    part = ToolCallPart("todo_write", {"todos": huge}, tool_call_id="c1")
    sent = compact([ModelResponse(parts=[part])])
    assert len(json.dumps(sent[0].parts[0].args)) < 200
    result = ToolReturnPart("plan_read", "y" * (2 * MAX_PART_CHARS), tool_call_id="c2")
    assert len(cap_message(ModelResponse(parts=[result])).parts[0].content) < MAX_PART_CHARS + 100


def test_plan_read_of_an_unknown_item_is_a_retry_and_the_run_goes_on(tmp_path):
    ledger = _new(tmp_path)
    outcome = ledger.run(
        [{"tool": "plan_read", "args": {"item_id": "99"}}, {"tool": "plan_read", "args": {"item_id": "01"}}]
    )
    assert outcome.status == "waiting", outcome.message  # before: the run ended on the PivotError
    texts = "\n".join(ledger.store.messages(ledger.sid))
    assert "has no item '99'" in texts and "Bigger prefill chunks" in texts
