"""A lean HTTP/1.1 client for streamed responses, on asyncio's Protocol API: the load generator's transport.

Why not aiohttp or httpx for the hot path (numbers in benchmarks/client_ceiling.py): on Python
3.11 aiohttp sends a request's body from a task of its own, so the request leaves a loop iteration
after the client stamped it as sent (an error inside TTFT that grows with load), and each socket
read wakes the reading task through a future; httpx's pool is quadratic in connections. Here a
request is written to the socket in the call that stamps it, and response bytes are handed to a
sink straight from `data_received`, with one clock reading per socket read: no task switch per
chunk, timestamps as early as asyncio can take them.

Scope, kept small on purpose: POST with a body, HTTP/1.1 keep-alive (HTTP/1.0 answers are read to
the close), chunked, Content-Length or close-delimited bodies, http and https, no proxies, no
redirects, no compression (none is asked for). Failures come back as an Outcome, never raised;
cancellation aborts the connection and propagates. A non-2xx answer with a short Content-Length body is read whole,
so its error says the server's words ("HTTP 400: Token id 11465 is out of vocabulary"); any other non-2xx answer
fails at once with its status.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from yarl import URL

_MAX_HEAD_BYTES = 65536
_MAX_ERROR_BODY = 8192  # an error answer up to this size is read for its message
_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILERS, _LENGTH, _TO_CLOSE, _DONE = range(8)


class StreamError(Exception):
    """Raised by a sink to fail its request (e.g. a malformed line); the message becomes the reason."""


class Sink(Protocol):
    """Where a response body goes, as it arrives."""

    def feed(self, data: bytes, now: float) -> None:
        """Body bytes (chunk framing removed) that arrived at `now` (time.perf_counter); may raise StreamError."""
        ...


class _ErrorBody:
    """The body of a non-2xx answer, kept for its message."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def feed(self, data: bytes, now: float) -> None:
        self.data += data


def error_message(body: bytes) -> str:
    """What an error body says: an OpenAI error's message, FastAPI's detail, else its text (one line, cut)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict | list):  # JSON: its message, or nothing when it has none
        err = obj.get("error") if isinstance(obj, dict) else None
        found = err.get("message") if isinstance(err, dict) else err
        if isinstance(obj, dict):
            found = found or obj.get("message") or obj.get("detail")
        text = str(found) if found else ""
    return " ".join(text.split())[:300]


@dataclass(slots=True)
class Outcome:
    """How one request ended. `error` is None on a complete 2xx answer; `cut` marks a body that stopped mid-way."""

    status: int = 0
    error: str | None = None
    cut: bool = False
    content_type: str = ""
    sent_s: float = 0.0  # when the request was written to the socket
    end_s: float = 0.0  # when the answer finished or failed


class _Exchange:
    """One request and its answer in progress on a connection."""

    __slots__ = ("future", "outcome", "sink")

    def __init__(self, sink: Sink, future: asyncio.Future[Outcome]) -> None:
        self.sink = sink
        self.future = future
        self.outcome = Outcome()


class _Connection(asyncio.Protocol):
    """One keep-alive connection: writes a request, parses the answer's framing, feeds the body to the sink."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False
        self.reusable = True
        self.buf = b""
        self.state = _DONE
        self.left = 0  # bytes left in the current chunk or Content-Length body

    # ------------------------------------------------------------------------------------ asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        ex = self.exchange
        if ex is None:
            return
        if isinstance(ex.sink, _ErrorBody):  # an error answer cut short: its status is all there is
            self._fail(f"HTTP {ex.outcome.status}")
        elif self.state in (_TO_CLOSE, _TRAILERS):  # the whole body is here (a close-delimited one ends this way)
            self._finish()
        elif self.state == _HEAD and ex.outcome.status == 0:
            self._fail("connection reset" if exc else "server closed the connection without answering")
        else:
            self._fail("connection reset" if exc else "connection closed mid-answer", cut=True)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        ex = self.exchange
        if ex is None:  # bytes nobody asked for: the connection is not in a state we can trust
            self.reusable = False
            self.abort()
            return
        buf = self.buf + data if self.buf else data
        self.buf = b""
        try:
            if self.state == _HEAD:
                buf = self._parse_head(buf)
                if buf is None or self.exchange is None:
                    return
            body = self._unframe(buf)
            if body:
                ex.sink.feed(body, now)
        except StreamError as e:
            self.reusable = False
            self._fail(str(e) or "bad stream", end_s=now)
            self.abort()
            return
        if self.state == _DONE and self.exchange is not None:
            self._finish(now)

    # ------------------------------------------------------------------------------------ framing

    def _parse_head(self, buf: bytes) -> bytes | None:
        """Parse the status line and headers; returns the bytes after them, or None to wait for more."""
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD_BYTES:
                    raise StreamError("response headers too large")
                self.buf = buf
                return None
            lines = buf[:end].split(b"\r\n")
            buf = buf[end + 4 :]
            parts = lines[0].split(b" ", 2)
            try:
                status = int(parts[1])
            except (IndexError, ValueError):
                raise StreamError("not an HTTP response") from None
            if 100 <= status < 200:  # 100 Continue and friends: the real answer follows
                continue
            headers: dict[bytes, bytes] = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            ex = self.exchange
            assert ex is not None
            ex.outcome.status = status
            ex.outcome.content_type = headers.get(b"content-type", b"").decode("latin-1")
            connection = headers.get(b"connection", b"").lower()
            http10 = parts[0] == b"HTTP/1.0"
            self.reusable = (b"keep-alive" in connection) if http10 else (b"close" not in connection)
            if not 200 <= status < 300:
                self.reusable = False
                length = headers.get(b"content-length", b"")
                if length.isdigit() and 0 < int(length) <= _MAX_ERROR_BODY:  # read what the server says
                    ex.sink = _ErrorBody()
                    self.left, self.state = int(length), _LENGTH
                    return buf
                self._fail(f"HTTP {status}")
                self.abort()
                return None
            if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
                self.state = _CHUNK_SIZE
            elif b"content-length" in headers:
                try:
                    self.left = int(headers[b"content-length"])
                except ValueError:
                    raise StreamError("bad Content-Length") from None
                self.state = _LENGTH if self.left else _DONE
            else:
                self.state = _TO_CLOSE
                self.reusable = False
            return buf

    def _unframe(self, buf: bytes) -> bytes:
        """Remove the body's framing from buf; keeps an incomplete tail for the next read."""
        state = self.state
        if state == _TO_CLOSE:
            return buf
        if state == _LENGTH:
            take = buf[: self.left]
            self.left -= len(take)
            if self.left == 0:
                self.state = _DONE
                if len(buf) > len(take):
                    self.reusable = False  # more bytes than the answer had
            return take
        out = []
        pos, n = 0, len(buf)
        if state == _CHUNK_SIZE:  # the common case first: whole chunks, one after another
            find = buf.find
            while True:
                j = find(b"\r\n", pos)
                if j < 0:
                    break
                try:
                    size = int(buf[pos:j], 16)
                except ValueError:
                    break  # a chunk extension, or garbage: the general path below decides
                stop = j + 2 + size
                if not size or stop + 2 > n or buf[stop : stop + 2] != b"\r\n":
                    break
                out.append(buf[j + 2 : stop])
                pos = stop + 2
        while pos < n or state == _DONE:
            if state == _CHUNK_DATA:
                take = min(self.left, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self.left -= take
                if self.left:
                    break
                state = _CHUNK_CRLF
            elif state == _CHUNK_CRLF:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise StreamError("bad chunked encoding")
                pos += 2
                state = _CHUNK_SIZE
            elif state == _CHUNK_SIZE:
                j = buf.find(b"\r\n", pos)
                if j < 0:
                    if n - pos > 1024:
                        raise StreamError("bad chunked encoding")
                    break
                try:
                    size = int(buf[pos:j].split(b";", 1)[0], 16)
                except ValueError:
                    raise StreamError("bad chunked encoding") from None
                pos = j + 2
                if size:
                    self.left = size
                    state = _CHUNK_DATA
                else:
                    state = _TRAILERS
            elif state == _TRAILERS:
                if buf.startswith(b"\r\n", pos):
                    pos += 2
                    state = _DONE
                else:
                    j = buf.find(b"\r\n\r\n", pos)
                    if j < 0:
                        break
                    pos = j + 4
                    state = _DONE
            else:  # _DONE
                if pos < n:
                    self.reusable = False
                break
        self.state = state
        if pos < n and state != _DONE:
            self.buf = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)

    # ------------------------------------------------------------------------------------ exchange

    def start(self, exchange: _Exchange, request: bytes) -> None:
        assert self.transport is not None
        self.exchange = exchange
        self.state = _HEAD
        self.buf = b""
        exchange.outcome.sent_s = time.perf_counter()
        self.transport.write(request)

    def _finish(self, now: float | None = None) -> None:
        if self.exchange is not None and isinstance(self.exchange.sink, _ErrorBody):
            said = error_message(self.exchange.sink.data)
            status = self.exchange.outcome.status
            self._fail(f"HTTP {status}: {said}" if said else f"HTTP {status}", end_s=now)
            self.abort()
            return
        ex, self.exchange = self.exchange, None
        if ex is not None and not ex.future.done():
            ex.outcome.end_s = now if now is not None else time.perf_counter()
            ex.future.set_result(ex.outcome)

    def _fail(self, reason: str, *, cut: bool = False, end_s: float | None = None) -> None:
        ex, self.exchange = self.exchange, None
        self.reusable = False
        if ex is not None and not ex.future.done():
            ex.outcome.error = reason
            ex.outcome.cut = cut
            ex.outcome.end_s = end_s if end_s is not None else time.perf_counter()
            ex.future.set_result(ex.outcome)

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True


class HttpStreamClient:
    """A pool of keep-alive connections to one server, for POST requests whose answers are streamed to a sink."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None) -> None:
        url = URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if url.scheme == "https" else None
        self.prefix = url.path.rstrip("/")
        host = f"[{url.host}]" if ":" in url.host else url.host  # an IPv6 literal
        host_header = host if url.is_default_port() else f"{host}:{url.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head_tail = (
            f"Host: {host_header}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n{extra}"
        ).encode("latin-1")
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()

    async def _connect(self, timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(_Connection, self.host, self.port, ssl=self.ssl), timeout=timeout_s
        )
        self._all.add(conn)
        return conn

    async def open(self, connections: int, timeout_s: float = 30.0) -> int:
        """Open idle connections up to `connections` before they are needed; returns how many could be opened."""
        missing = connections - len([c for c in self._idle if not c.closed])
        if missing <= 0:
            return connections
        results = await asyncio.gather(*(self._connect(timeout_s) for _ in range(missing)), return_exceptions=True)
        opened = [c for c in results if isinstance(c, _Connection)]
        self._idle.extend(opened)
        return connections - missing + len(opened)

    async def post(self, path: str, body: bytes, sink: Sink, *, timeout_s: float) -> Outcome:
        """Send one POST and stream its answer into `sink`; returns when the answer is complete or has failed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        request = b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
            (self.prefix + path).encode(),
            self._head_tail,
            len(body),
            body,
        )
        conn = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed and candidate.reusable:
                conn = candidate
                break
        if conn is None:
            try:
                conn = await self._connect(timeout_s)
            except TimeoutError:
                return Outcome(error=f"timeout after {timeout_s:g} s", end_s=time.perf_counter())
            except OSError as e:
                return Outcome(error=f"cannot connect: {e.strerror or e}", end_s=time.perf_counter())
        future: asyncio.Future[Outcome] = loop.create_future()
        exchange = _Exchange(sink, future)
        timer = loop.call_at(deadline, self._expire, conn, exchange, timeout_s)
        try:
            conn.start(exchange, request)
            outcome = await future
        except BaseException:  # cancelled: the answer will never be read, so the connection is dropped
            conn.abort()
            self._all.discard(conn)
            raise
        finally:
            timer.cancel()
        if conn.reusable and not conn.closed and conn.exchange is None:
            self._idle.append(conn)
        else:
            conn.abort()
            self._all.discard(conn)
        return outcome

    @staticmethod
    def _expire(conn: _Connection, exchange: _Exchange, timeout_s: float) -> None:
        if conn.exchange is exchange:
            conn._fail(f"timeout after {timeout_s:g} s")
            conn.abort()

    def close(self) -> None:
        """Close every connection (idle or busy)."""
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
