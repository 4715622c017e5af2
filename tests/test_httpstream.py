"""The streaming HTTP/1.1 transport: framing however the bytes are split, failures as outcomes, connections reused."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.models import BenchSpec
from tests.timed_server import TimedServer
from tools.httpstream import HttpStreamClient, Outcome, StreamError, _Connection, _Exchange
from tools.loadgen import run_sweep


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data) -> None:
        self.written.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


class Collect:
    def __init__(self, fail_on: bytes | None = None) -> None:
        self.data = b""
        self.fail_on = fail_on

    def feed(self, data: bytes, now: float) -> None:
        self.data += data
        if self.fail_on and self.fail_on in self.data:
            raise StreamError("sink says no")


def _run(pieces: list[bytes], *, lost: bool | None = None, sink: Collect | None = None):
    """Feed response bytes to a connection; returns (outcome or None if still open, body, connection)."""
    loop = asyncio.new_event_loop()
    try:
        conn = _Connection()
        transport = FakeTransport()
        conn.connection_made(transport)
        sink = sink or Collect()
        future = loop.create_future()
        conn.start(_Exchange(sink, future), b"POST / HTTP/1.1\r\n\r\n")
        assert transport.written == [b"POST / HTTP/1.1\r\n\r\n"]
        for piece in pieces:
            conn.data_received(piece)
        if lost is not None:
            conn.connection_lost(ConnectionResetError() if lost else None)
        outcome: Outcome | None = future.result() if future.done() else None
        return outcome, sink.data, conn
    finally:
        loop.close()


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@settings(max_examples=150, deadline=None)
@given(
    pieces=st.lists(st.binary(min_size=1, max_size=40), min_size=0, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=800), max_size=30),
    extension=st.booleans(),
)
def test_chunked_bodies_come_out_whole_however_the_bytes_are_split(pieces, cuts, extension):
    ext = b";x=1" if extension else b""
    wire = HEAD + b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in pieces) + b"0\r\n\r\n"
    outcome, body, conn = _run(_split(wire, cuts))
    assert outcome is not None and outcome.error is None and outcome.status == 200
    assert body == b"".join(pieces)
    assert conn.reusable and conn.exchange is None and outcome.content_type == "text/event-stream"


def test_content_length_close_delimited_trailers_and_interim_answers():
    outcome, body, conn = _run([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel", b"lo"])
    assert outcome and outcome.error is None and body == b"hello" and conn.reusable
    outcome, body, conn = _run([b"HTTP/1.0 200 OK\r\n\r\ndata: 1\n\n", b"data: 2\n\n"])
    assert outcome is None  # an HTTP/1.0 body ends when the connection does
    outcome, body, conn = _run([b"HTTP/1.0 200 OK\r\n\r\ndata: 1\n\n"], lost=False)
    assert outcome and outcome.error is None and body == b"data: 1\n\n" and not conn.reusable
    outcome, body, conn = _run([HEAD + b"3\r\nabc\r\n0\r\nX-Checksum: 1\r\n\r\n"])
    assert outcome and outcome.error is None and body == b"abc"
    outcome, body, conn = _run([b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD + b"2\r\nok\r\n0\r\n\r\n"])
    assert outcome and outcome.status == 200 and body == b"ok"
    outcome, body, conn = _run([b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"])
    assert outcome and outcome.error is None and not conn.reusable


@pytest.mark.parametrize(
    ("pieces", "lost", "error", "cut"),
    [
        ([b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\n{}"], None, "HTTP 500", False),
        ([HEAD + b"zz\r\n"], None, "bad chunked encoding", False),
        ([HEAD + b"5\r\nab"], True, "connection reset", True),
        ([HEAD + b"5\r\nab"], False, "connection closed mid-answer", True),
        ([], False, "server closed the connection without answering", False),
        ([b"garbage\r\n\r\n"], None, "not an HTTP response", False),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab"], False, "connection closed mid-answer", True),
    ],
)
def test_failures_are_outcomes_with_a_reason(pieces, lost, error, cut):
    outcome, _, conn = _run(pieces, lost=lost)
    assert outcome is not None and outcome.error == error and outcome.cut is cut
    assert not conn.reusable


def test_a_sink_can_fail_its_request():
    outcome, _, conn = _run([HEAD + b"4\r\nbad!\r\n"], sink=Collect(fail_on=b"bad"))
    assert outcome and outcome.error == "sink says no" and conn.closed and not conn.reusable


async def test_connections_are_opened_ahead_and_reused():
    async with TimedServer(ttft_ms=1, itl_ms=1) as server:
        spec = BenchSpec(random_input_len=4, random_output_len=3, concurrency=[1, 4], num_prompts=12)
        result = await run_sweep(server.base_url, spec, warmup_pause_s=0)
        assert [lv.completed for lv in result.levels] == [12, 12]
        # one connection for the first level (warmup included), four for the second
        assert server.stats.generation_connections == 1 + 4


async def test_a_stalled_answer_times_out_and_its_connection_is_dropped():
    async with TimedServer(ttft_ms=1, itl_ms=1, faults={1: "stall"}) as server:
        client = HttpStreamClient(server.base_url)
        try:
            sink = Collect()
            first = await client.post("/generate", b'{"stream": true}', sink, timeout_s=0.2)
            second = await client.post("/generate", b'{"stream": true}', sink, timeout_s=5)
        finally:
            client.close()
    assert first.error == "timeout after 0.2 s" and second.error is None
    assert 0.19 < first.end_s - first.sent_s < 1.0
    assert server.stats.generation_connections == 2


async def test_cannot_connect_is_an_outcome():
    client = HttpStreamClient("http://127.0.0.1:9")  # the discard port: nothing listens here
    outcome = await client.post("/generate", b"{}", Collect(), timeout_s=2)
    assert outcome.error is not None and outcome.error.startswith("cannot connect")


def test_only_http_urls_are_accepted():
    with pytest.raises(ValueError):
        HttpStreamClient("ftp://example.com")
    client = HttpStreamClient("https://example.com/prefix/")
    assert client.port == 443 and client.ssl is not None and client.prefix == "/prefix"
    assert b"Host: example.com\r\n" in client._head_tail
    assert b"Host: [::1]:8080\r\n" in HttpStreamClient("http://[::1]:8080")._head_tail
