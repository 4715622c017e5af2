"""A local streaming server with exactly known timing, for the load generator's tests and benchmarks.

Every generation request gets its first token `ttft_ms` (plus `ttft_per_prompt_token_ms` per prompt token,
0 by default: the stats count from the end of that delay) after its body arrived, then one token every
`itl_ms`, on absolute deadlines (a late tick never shifts the ones after it), over SGLang's
native `/generate` (SSE with cumulative `text` and `meta_info.completion_tokens`) and the
OpenAI-compatible `/v1/completions` and `/v1/chat/completions` (one token per chunk, usage in a
final chunk when `stream_options.include_usage` is set), each ending with `data: [DONE]`. Under
more load than it can serve it streams as fast as it can, and `GET /stats` says how late it was.

Faults on demand, by the arrival number of generation requests (1-based, warmup included):
`500` (an HTTP 500), `stall` (headers, then silence), `cut` (the connection closes mid-stream),
`nodone` (the stream ends cleanly without `[DONE]`, as transformers serve ends its streams), `nofinish` (the
same, and no chunk carries a finish_reason), `malformed` (a `data:` line that is not JSON),
`drop` (the connection closes before any answer).

It is one asyncio protocol with a hand-written HTTP/1.1 parser, so that it spends as little CPU
per token as Python allows: the client ceiling benchmark shares two cores with it.

    python -m tests.timed_server [--port 0] [--ttft-ms 20] [--itl-ms 2] [--fault 3=500 ...]

prints `port N` on stdout once it listens, and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS = ("500", "stall", "cut", "nodone", "nofinish", "malformed", "drop")
TOKEN_TEXT = " tok"  # what each generated token decodes to
_TOKEN_BYTES = TOKEN_TEXT.encode()
_MAX_HEADER_BYTES = 65536


@dataclass
class ServerStats:
    """What the server did, from its own clock: requests, tokens, and how late it was against its schedule."""

    requests: int = 0
    generation_connections: int = 0  # connections that carried at least one generation request
    completed: int = 0
    tokens: int = 0
    disconnects: int = 0
    late_first_s: float = 0.0  # summed over requests: when the first token went out minus when it was due
    late_last_s: float = 0.0  # the same for the last token
    measured_first: int = 0
    ttft_sum_s: float = 0.0  # summed actual time from arrival to the first token's write
    tpot_sum_s: float = 0.0  # summed actual (last - first) / (n - 1)
    measured_tpot: int = 0
    cpu_s_at_start: float = field(default_factory=time.process_time)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "generation_connections": self.generation_connections,
            "completed": self.completed,
            "tokens": self.tokens,
            "disconnects": self.disconnects,
            "mean_ttft_ms": 1000 * self.ttft_sum_s / self.measured_first if self.measured_first else None,
            "mean_tpot_ms": 1000 * self.tpot_sum_s / self.measured_tpot if self.measured_tpot else None,
            "mean_first_token_late_ms": 1000 * self.late_first_s / self.measured_first if self.measured_first else None,
            "mean_last_token_late_ms": 1000 * self.late_last_s / self.measured_tpot if self.measured_tpot else None,
            "cpu_s": time.process_time() - self.cpu_s_at_start,
        }


class _Stream:
    """One streaming answer in progress."""

    __slots__ = (
        "arrived",
        "chat",
        "conn",
        "cumulative",
        "endpoint",
        "fault",
        "first_sent",
        "k",
        "n",
        "prompt_tokens",
        "rid",
        "usage",
    )

    def __init__(self, conn: _Conn, endpoint: str, n: int, prompt_tokens: int, usage: bool, fault: str | None):
        self.conn = conn
        self.endpoint = endpoint
        self.n = n
        self.prompt_tokens = prompt_tokens
        self.usage = usage
        self.fault = fault
        self.k = 0  # tokens sent so far
        self.arrived = 0.0
        self.first_sent = 0.0
        self.cumulative = b""
        self.chat = endpoint == "chat"
        self.rid = b"%d" % id(self)


def _chunk(data: bytes) -> bytes:
    """One piece of an HTTP/1.1 chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class TimedServer:
    """Streams tokens on a fixed schedule; start() it on a running loop, close() it when done."""

    def __init__(
        self,
        *,
        ttft_ms: float = 20.0,
        itl_ms: float = 2.0,
        ttft_per_prompt_token_ms: float = 0.0,
        faults: dict[int, str] | None = None,
        model: str = "timed-model",
        models_endpoint: bool = True,
        send_usage: bool = True,
        fail_from: int | None = None,
        error_message: str = "injected failure",
    ) -> None:
        for fault in (faults or {}).values():
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        self.ttft_s = ttft_ms / 1000
        self.itl_s = itl_ms / 1000
        self.ttft_per_token_s = ttft_per_prompt_token_ms / 1000  # a known TTFT per request, for SLO tests
        self.faults = dict(faults or {})
        self.model = model
        self.models_endpoint = models_endpoint
        self.send_usage = send_usage  # False: ignore stream_options.include_usage, as some servers do
        self.fail_from = fail_from  # every generation request from this arrival number on gets a 500
        self.error_body = json.dumps({"error": {"message": error_message}}).encode()
        self.stats = ServerStats()
        self.requests: list[dict[str, Any]] = []  # the bodies of generation requests, in arrival order
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(lambda: _Conn(self), host, port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self._conns):
                conn.abort()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> TimedServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------------------------ requests

    def handle(self, conn: _Conn, method: str, path: str, body: bytes) -> None:
        path, _, query = path.partition("?")
        if method == "GET":
            if path == "/v1/models" and self.models_endpoint:
                data = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "sglang"}]}
                conn.respond(200, json.dumps(data).encode())
            elif path in ("/health", "/health_generate"):
                conn.respond(200, b"")
            elif path == "/stats":
                conn.respond(200, json.dumps(self.stats.as_dict()).encode())
                if "reset=1" in query:
                    self.stats = ServerStats()
            else:
                conn.respond(404, b'{"detail":"Not Found"}')
            return
        endpoint = {"/generate": "generate", "/v1/completions": "completions", "/v1/chat/completions": "chat"}.get(path)
        if method != "POST" or endpoint is None:
            conn.respond(404, b'{"detail":"Not Found"}')
            return
        try:
            req = json.loads(body)
        except ValueError:
            conn.respond(400, b'{"error":"body is not JSON"}')
            return
        self.stats.requests += 1
        self.requests.append(req)
        if not conn.generated:
            conn.generated = True
            self.stats.generation_connections += 1
        fault = self.faults.get(self.stats.requests)
        if self.fail_from is not None and self.stats.requests >= self.fail_from:
            fault = "500"
        if fault == "500":
            conn.respond(500, self.error_body)
            return
        if fault == "drop":
            conn.abort()
            return
        if not req.get("stream"):
            conn.respond(400, b'{"error":"this test server only streams"}')
            return
        if endpoint == "generate":
            n = int((req.get("sampling_params") or {}).get("max_new_tokens", 16))
            prompt = req.get("input_ids") if req.get("input_ids") is not None else req.get("text", "")
        else:
            n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
            prompt = req.get("prompt") if endpoint == "completions" else req.get("messages", [])
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        usage = self.send_usage and bool((req.get("stream_options") or {}).get("include_usage"))
        stream = _Stream(conn, endpoint, max(n, 1), prompt_tokens, usage, fault)
        conn.start_stream()
        if fault == "stall":
            return
        loop = self._loop
        assert loop is not None
        stream.arrived = loop.time() + self.ttft_per_token_s * prompt_tokens  # the schedule starts after the prompt
        loop.call_at(stream.arrived + self.ttft_s, self._tick, stream)

    def _tick(self, s: _Stream) -> None:
        conn = s.conn
        if conn.closed:
            return
        loop = self._loop
        assert loop is not None
        now = loop.time()
        stats = self.stats
        out = []
        if s.k == 0:
            s.first_sent = now
            stats.measured_first += 1
            stats.ttft_sum_s += now - s.arrived
            stats.late_first_s += now - (s.arrived + self.ttft_s)
            if s.chat:
                out.append(self._chat_role(s))
        s.k += 1
        stats.tokens += 1
        last = s.k >= s.n
        if s.fault == "malformed" and s.k == max(1, s.n // 2):
            out.append(b'data: {"text": "broken\n\n')
        else:
            out.append(self._event(s, last))
        if s.fault == "cut" and s.k >= max(1, s.n // 2):
            conn.write(b"".join(_chunk(piece) for piece in out))
            conn.close()
            return
        if last:
            if s.n > 1:
                stats.measured_tpot += 1
                stats.tpot_sum_s += (now - s.first_sent) / (s.n - 1)
                stats.late_last_s += now - (s.arrived + self.ttft_s + (s.n - 1) * self.itl_s)
            if s.usage and s.endpoint != "generate":
                out.append(self._usage(s))
            if s.fault not in ("nodone", "nofinish"):
                out.append(b"data: [DONE]\n\n")
            conn.write(b"".join(_chunk(piece) for piece in out) + b"0\r\n\r\n")
            stats.completed += 1
            conn.finish_stream()
            return
        conn.write(b"".join(_chunk(piece) for piece in out))
        loop.call_at(s.arrived + self.ttft_s + s.k * self.itl_s, self._tick, s)

    # ------------------------------------------------------------------------------------ payloads

    def _event(self, s: _Stream, last: bool) -> bytes:
        last = last and s.fault != "nofinish"
        if s.endpoint == "generate":
            s.cumulative += _TOKEN_BYTES
            finish = b'{"type":"length","length":%d}' % s.n if last else b"null"
            return (
                b'data: {"text":"%s","output_ids":[%d],"meta_info":{"id":"%s","finish_reason":%s,'
                b'"prompt_tokens":%d,"completion_tokens":%d,"cached_tokens":0}}\n\n'
                % (s.cumulative, s.k, s.rid, finish, s.prompt_tokens, s.k)
            )
        finish = b'"length"' if last else b"null"
        model = self.model.encode()
        if s.endpoint == "completions":
            return (
                b'data: {"id":"%s","object":"text_completion","created":0,"model":"%s","choices":[{"index":0,'
                b'"text":"%s","logprobs":null,"finish_reason":%s}],"usage":null}\n\n'
                % (s.rid, model, _TOKEN_BYTES, finish)
            )
        return (
            b'data: {"id":"%s","object":"chat.completion.chunk","created":0,"model":"%s","choices":[{"index":0,'
            b'"delta":{"content":"%s"},"logprobs":null,"finish_reason":%s}],"usage":null}\n\n'
            % (s.rid, model, _TOKEN_BYTES, finish)
        )

    def _chat_role(self, s: _Stream) -> bytes:
        return (
            b'data: {"id":"%s","object":"chat.completion.chunk","created":0,"model":"%s","choices":[{"index":0,'
            b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
            % (s.rid, self.model.encode())
        )

    def _usage(self, s: _Stream) -> bytes:
        kind = b"chat.completion.chunk" if s.chat else b"text_completion"
        return (
            b'data: {"id":"%s","object":"%s","created":0,"model":"%s","choices":[],"usage":{"prompt_tokens":%d,'
            b'"completion_tokens":%d,"total_tokens":%d}}\n\n'
            % (s.rid, kind, self.model.encode(), s.prompt_tokens, s.n, s.prompt_tokens + s.n)
        )


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection: parses requests, one at a time, and writes answers."""

    def __init__(self, server: TimedServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.streaming = False
        self.closed = False
        self.generated = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server._conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server._conns.discard(self)
        if self.streaming:
            self.server.stats.disconnects += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.streaming and not self.closed:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > _MAX_HEADER_BYTES:
                    self.respond(431, b"")
                    self.close()
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            try:
                method, path, _ = head[0].split(" ", 2)
            except ValueError:
                self.respond(400, b"")
                self.close()
                return
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.server.handle(self, method, path, body)

    # ------------------------------------------------------------------------------------ answers

    def respond(self, status: int, body: bytes) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 431: "Too Large", 500: "Internal Server Error"}
        head = (
            f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.write(head.encode() + body)

    def start_stream(self) -> None:
        self.streaming = True
        self.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )

    def finish_stream(self) -> None:
        self.streaming = False
        if self.buf:  # a request that arrived while this one streamed
            self.data_received(b"")

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True


# ---------------------------------------------------------------------------------------- as a process

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def spawn(*args: str) -> Iterator[str]:
    """Run the server in a process of its own (its own CPU, as a real server has); yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.timed_server", *args], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"timed server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stats(base_url: str, *, reset: bool = False) -> dict[str, Any]:
    """The server's stats (and, with reset, start counting afresh)."""
    with urllib.request.urlopen(base_url + "/stats" + ("?reset=1" if reset else ""), timeout=10) as resp:
        return json.loads(resp.read())


def _parse_fault(text: str) -> tuple[int, str]:
    number, _, kind = text.partition("=")
    if kind not in FAULTS:
        raise argparse.ArgumentTypeError(f"fault must be N=KIND with KIND one of {', '.join(FAULTS)}")
    return int(number), kind


async def _serve(args: argparse.Namespace) -> None:
    server = TimedServer(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, faults=dict(args.fault), model=args.model,
                         ttft_per_prompt_token_ms=args.ttft_per_prompt_token_ms, fail_from=args.fail_from,
                         error_message=args.error_message)  # fmt: skip
    port = await server.start(args.host, args.port)
    print(f"port {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close()
    if args.stats:
        print(json.dumps(server.stats.as_dict()), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--ttft-per-prompt-token-ms", type=float, default=0.0)
    parser.add_argument("--model", default="timed-model")
    parser.add_argument("--fault", type=_parse_fault, action="append", default=[], metavar="N=KIND")
    parser.add_argument("--fail-from", type=int, metavar="N", help="answer every request from arrival N on with a 500")
    parser.add_argument("--error-message", default="injected failure", help="the 500 answers' error message")
    parser.add_argument("--stats", action="store_true", help="print the server's stats as JSON on stderr at exit")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
