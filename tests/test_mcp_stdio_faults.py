"""G13: `pivot mcp` over stdio answers every line it cannot take (not JSON, nested past the parser's limit, a batch,
`params` not an object, no `method`) with JSON-RPC's error and the request's id where it has one, and goes on
serving: the client never waits on a line that was dropped."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.mcp.stdio import INVALID_REQUEST, PARSE_ERROR, error_for

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 120  # the deadline of one answer; the answer is the event waited for
INITIALIZE = {"jsonrpc": "2.0", "id": 99, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
FAULTS = [
    ("not json", None, PARSE_ERROR),
    ("[" * 100_000 + "]" * 100_000, None, PARSE_ERROR),
    ('{"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": "x"}', 7, INVALID_REQUEST),
    ('[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', None, INVALID_REQUEST),
    ('{"jsonrpc": "2.0", "id": "abc"}', "abc", INVALID_REQUEST),
]


@pytest.mark.parametrize(("line", "request_id", "code"), FAULTS)
def test_each_fault_maps_to_its_error_without_echoing_the_input(line, request_id, code):
    import mcp_types as types

    with pytest.raises(Exception) as caught:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    error = error_for(caught.value)
    assert (error.id, error.error.code) == (request_id, code)
    assert len(error.error.message) <= 200 and "\n" not in error.error.message
    assert "[[[[" not in error.error.message and "tools/list" not in error.error.message


def test_malformed_lines_over_stdio_are_answered_and_the_server_goes_on(pivot_home):
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "--home", str(pivot_home), "mcp"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()

    def ask(text: str) -> dict:
        proc.stdin.write(text + "\n")
        proc.stdin.flush()
        return json.loads(lines.get(timeout=WAIT_S))

    try:
        for line, request_id, code in FAULTS:
            answer = ask(line)
            assert answer["jsonrpc"] == "2.0" and answer["id"] == request_id, answer
            assert answer["error"]["code"] == code, answer
        served = ask(json.dumps(INITIALIZE))  # still serving after every fault
        assert served["id"] == 99 and served["result"]["serverInfo"]["name"] == "pivot", served
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0
