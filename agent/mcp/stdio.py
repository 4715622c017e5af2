"""`pivot mcp` over stdio answers every line it cannot take, as the HTTP transport does.

The MCP SDK's stdio transport hands a line that is not a JSON-RPC message (not JSON, JSON nested past the parser's
limit, a batch, `params` that is not an object, a message without `method`) to the server as an exception, and the
server drops it without a word: the client waits for an answer that never comes ([safety] G13). Here the read stream
is wrapped: such an item is answered on the write stream with JSON-RPC's error, -32700 (parse error) for a line that
is not JSON and -32600 (invalid request) for JSON that is not a message, with the request's id when the line carries
one the client can match, else null, as JSON-RPC 2.0 says. The answer names the fault in one bounded line and never
echoes the input.

FastMCP opens the SDK's `stdio_server()` inside its own stdio run (its banner, lifespan and transport context);
`answering_stdio()` swaps in a wrapper of it for the length of the run, so the rest of that run is FastMCP's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import mcp_types as types
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
MESSAGE_MAX = 200  # characters of a fault's words in the answer


def error_for(exc: Exception) -> types.JSONRPCError:
    """The JSON-RPC error that answers a line the SDK could not read as a message (`exc` is what it raised)."""
    request_id: str | int | None = None
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False)
        if any(e.get("type") == "json_invalid" for e in errors):
            why = next((e.get("msg", "") for e in errors if e.get("type") == "json_invalid"), "")
            return _error(None, PARSE_ERROR, f"Parse error: {why}")
        request_id = next((i for e in errors if (i := _id_of(e.get("input"))) is not None), None)
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "the message"
        why = f"{where}: {first.get('msg', 'not a JSON-RPC message')}"
        return _error(request_id, INVALID_REQUEST, f"Invalid Request: {why} (one JSON-RPC message per line)")
    return _error(None, INVALID_REQUEST, f"Invalid Request: {type(exc).__name__}")


def _id_of(value: Any) -> str | int | None:
    if not isinstance(value, dict):
        return None
    found = value.get("id")
    if isinstance(found, bool) or not isinstance(found, str | int):
        return None
    return found


def _error(request_id: str | int | None, code: int, message: str) -> types.JSONRPCError:
    text = " ".join(message.split())
    if len(text) > MESSAGE_MAX:
        text = text[: MESSAGE_MAX - 3] + "..."
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=text))


class AnsweringReadStream:
    """The SDK's read stream, less the exceptions: each is answered on `write` and skipped."""

    def __init__(self, inner: Any, write: Any) -> None:
        self._inner, self._write = inner, write

    @property
    def last_context(self) -> Any:  # the dispatcher reads the sender's context from the stream it iterates
        return getattr(self._inner, "last_context", None)

    async def __aenter__(self) -> AnsweringReadStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> Any:
        return await self._inner.__aexit__(*exc)

    def __aiter__(self) -> AnsweringReadStream:
        return self

    async def __anext__(self) -> SessionMessage:
        while True:
            item = await self._inner.__anext__()
            if not isinstance(item, Exception):
                return item
            await self._write.send(SessionMessage(error_for(item)))

    async def receive(self) -> SessionMessage:
        return await self.__anext__()

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()


@contextlib.contextmanager
def answering_stdio() -> Iterator[None]:
    """For the length of the block, FastMCP's stdio run reads through AnsweringReadStream."""
    from fastmcp.server.mixins import transport
    from mcp.server.stdio import stdio_server

    @contextlib.asynccontextmanager
    async def answering(*args: Any, **kwargs: Any) -> AsyncIterator[tuple[Any, Any]]:
        async with stdio_server(*args, **kwargs) as (read, write):
            yield AnsweringReadStream(read, write), write

    before = transport.stdio_server
    transport.stdio_server = answering
    try:
        yield
    finally:
        transport.stdio_server = before
