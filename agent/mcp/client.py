"""The MCP servers of a session's `--mcp FILE` as toolsets for pivot's agent.

Each server becomes one toolset: its tools prefixed with the server's name (`metrics_query` for the tool `query` of
the server `metrics`), behind the method's guard like every toolset of the agent. They cannot launch or judge
anything: pivot's experiments, servers and verdicts are made only by pivot's own tools, which read the ledger, and a
server's tool whose prefixed name is one of pivot's own tool names is left out (so no server can stand in for
`launch_server` or `record_verdict`). The servers' own instructions reach the model only when the user asks
(`--mcp-instructions`).

A server that fails to start (a missing command, a variable not set, no answer to the handshake) or dies during the
run is one warning line, and the run goes on without its tools; a call already sent to it returns that line as its
result. Stdio servers are started with `keep_alive` off (they stop when the run ends), get only the environment the
MCP SDK considers safe plus the entry's own `env` (pivot's model keys are not passed on) and write their stderr to
`state/<session>/logs/mcp-<name>.log`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from agent.errors import PivotError
from agent.mcp.config import ServerSpec, load_config
from agent.session import Session

INIT_TIMEOUT_S = 30.0  # the handshake of a server started now (a Python server on a loaded host takes seconds)
READ_TIMEOUT_S = 300.0  # one tool call
CONNECTION_CLOSED = -32000  # the MCP SDK's error code for a connection that closed
Warn = Callable[[str], None]


class _NotJsonRpc(logging.Filter):
    """The MCP SDK logs a whole traceback for every line a stdio server prints that is not JSON-RPC (a server that
    prints 11,000 such lines: 11,000 tracebacks). One line says so, once per process; the rest are dropped."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Failed to parse JSONRPC message"):
            return True
        if _NotJsonRpc.said:
            return False
        _NotJsonRpc.said = True
        record.msg, record.args, record.exc_info, record.exc_text = (
            "an MCP server printed lines that are not JSON-RPC on its stdout; they are ignored (this is said once)",
            (),
            None,
            None,
        )
        return True


_STDIO_LOG = logging.getLogger("mcp.client.stdio")
if not any(isinstance(f, _NotJsonRpc) for f in _STDIO_LOG.filters):
    _STDIO_LOG.addFilter(_NotJsonRpc())


def transport(spec: ServerSpec, log_file: Path | None = None) -> Any:
    """The fastmcp transport for a server: stdio for a command (stopped when the connection closes), streamable
    HTTP or SSE for a URL. Its `${VAR}`s are expanded now (a PivotError names one that is not set)."""
    from fastmcp.client.transports import SSETransport, StdioTransport, StreamableHttpTransport

    entry = spec.expanded()
    if entry.command:
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
        return StdioTransport(
            command=entry.command,
            args=list(entry.args),
            env=dict(entry.env) or None,
            cwd=entry.cwd,
            keep_alive=False,  # every process pivot starts, it stops
            log_file=log_file,
        )
    assert entry.url is not None
    kind = SSETransport if entry.url.rstrip("/").endswith("/sse") else StreamableHttpTransport
    return kind(entry.url, headers=dict(entry.headers) or None)


def reason_of(e: BaseException) -> str:
    """An exception in one line: the innermost of a group, its type where the message says nothing."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = " ".join(str(e).split())
    if isinstance(e, TimeoutError | asyncio.TimeoutError) and not text:
        text = "no answer in time"
    return f"{type(e).__name__}: {text}"[:240] if not text or len(text) < 12 else text[:240]


@dataclass
class _State:
    failed: str | None = None
    entered: bool = False
    left_out: set[str] = field(default_factory=set)


def _tool_refused(e: BaseException) -> bool:
    """Whether the server itself answered with an error (a tool error, bad arguments), as opposed to a connection
    that is gone (MCP's CONNECTION_CLOSED, -32000, and anything that is not an MCP error)."""
    from fastmcp.exceptions import McpError, ToolError

    if isinstance(e, ToolError):
        return True
    if isinstance(e, McpError):
        code = getattr(getattr(e, "error", None), "code", getattr(e, "code", None))
        return code != CONNECTION_CLOSED and "connection closed" not in str(e).lower()
    return False


def _is_control_flow(e: BaseException) -> bool:
    """pydantic-ai's own exceptions (ModelRetry, CallDeferred, ...): they are how a tool talks to the run."""
    return type(e).__module__.startswith("pydantic_ai")


@dataclass
class ServerTools(WrapperToolset[Session]):
    """One MCP server's tools (already prefixed), tolerant of a server that does not start or dies, without any tool
    named like one of pivot's own."""

    spec: ServerSpec | None = None
    reserved: frozenset[str] = frozenset()
    warn: Warn = field(default=lambda _text: None)
    log_file: Path | None = None
    state: _State = field(default_factory=_State)
    claimed: dict[str, str] = field(default_factory=dict)  # tool name -> the server that has it (shared in a run)

    def _fail(self, what: str) -> None:
        if self.state.failed is None:
            self.state.failed = what
            assert self.spec is not None
            log = f" (its log: {self.log_file})" if self.log_file is not None and self.spec.entry.command else ""
            self.warn(f"MCP server {self.spec.name!r} {what}{log}; the run goes on without its tools")

    async def __aenter__(self) -> ServerTools:
        if self.state.failed is not None:
            return self
        try:
            await self.wrapped.__aenter__()
            self.state.entered = True
        except Exception as e:  # a command that is missing, a server that exits, a handshake that never comes
            said = log_tail(self.log_file)
            where = self.spec.where if self.spec else ""
            self._fail(f"did not start ({where}): {reason_of(e)}" + (f"; it said: {said}" if said else ""))
        return self

    async def __aexit__(self, *args: Any) -> bool | None:
        if not self.state.entered:
            return None
        self.state.entered = False
        try:
            await self.wrapped.__aexit__(*args)
        except Exception as e:  # a server that died: nothing left to close
            if self.state.failed is None:
                self.warn(f"MCP server {self.spec.name if self.spec else ''!r} did not close cleanly: {reason_of(e)}")
        return None

    async def get_tools(self, ctx: RunContext[Session]) -> dict[str, ToolsetTool[Session]]:
        if self.state.failed is not None or not self.state.entered:
            return {}
        try:
            tools = await self.wrapped.get_tools(ctx)
        except Exception as e:
            if _is_control_flow(e):
                raise
            self._fail(f"stopped answering: {reason_of(e)}")
            return {}
        kept = {}
        server = self.spec.name if self.spec else ""
        for name, tool in tools.items():
            owner = self.claimed.setdefault(name, server)
            if owner != server:
                if name not in self.state.left_out:
                    self.state.left_out.add(name)
                    self.warn(f"MCP server {server!r}: its tool {name!r} is named like one of {owner!r}'s: left out")
                continue
            if name in self.reserved:
                if name not in self.state.left_out:
                    self.state.left_out.add(name)
                    self.warn(
                        f"MCP server {self.spec.name if self.spec else ''!r}: its tool {name!r} is named like one of "
                        "pivot's own tools and is left out (only pivot's tools launch, measure or judge)"
                    )
                continue
            kept[name] = tool
        return kept

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Session], tool: ToolsetTool[Session]
    ) -> Any:
        if name in self.reserved:  # never listed; refused all the same
            raise PivotError(f"{name} is one of pivot's own tools, not an MCP server's")
        if self.state.failed is not None:
            return f"unavailable: the MCP server {self.spec.name if self.spec else ''!r} {self.state.failed}"
        try:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        except Exception as e:
            if _is_control_flow(e):
                raise
            if _tool_refused(e):  # the server answered: the call was wrong, the model can correct it
                raise ModelRetry(f"{name}: {reason_of(e)}") from e
            self._fail(f"failed during {name}: {reason_of(e)}")
            return f"unavailable: the MCP server {self.spec.name if self.spec else ''!r} {self.state.failed}"


def server_toolset(
    spec: ServerSpec,
    *,
    reserved: Iterable[str],
    warn: Warn,
    log_dir: Path | None,
    instructions: bool,
    claimed: dict[str, str] | None = None,
) -> ServerTools:
    """The toolset of one server for the agent (connected when the run enters it); a PivotError when its entry
    cannot be used (a variable not set)."""
    from pydantic_ai.mcp import MCPToolset

    log_file = log_dir / f"mcp-{spec.prefix}.log" if log_dir is not None else None
    inner = MCPToolset(
        transport(spec, log_file),
        id=f"mcp-{spec.prefix}",
        include_instructions=instructions,
        init_timeout=INIT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        max_retries=3,
        tool_error_behavior="error",  # ServerTools tells a refused call (a retry) from a server that is gone
    )
    prefixed = inner.prefixed(spec.prefix)
    return ServerTools(prefixed, spec=spec, reserved=frozenset(reserved), warn=warn, log_file=log_file,
                       claimed=claimed if claimed is not None else {})  # fmt: skip


def mcp_toolsets(session: Session, reserved: Iterable[str]) -> list[AbstractToolset[Session]]:
    """The toolsets of the session's MCP servers (none without `--mcp`); a file or a server that cannot be used is
    one warning line and is left out."""
    path = session.settings.mcp_config
    if not path:
        return []

    def warn(text: str) -> None:
        session.emit("warning", text)

    try:
        specs = load_config(path)
    except PivotError as e:
        warn(f"--mcp {path}: {e.message}; the run goes on without MCP servers")
        return []
    names = frozenset(reserved)
    claimed: dict[str, str] = {}  # two servers whose prefixed names meet: the first keeps the name
    out: list[AbstractToolset[Session]] = []
    for spec in specs:
        try:
            log_dir = session.paths.logs_dir(session.id)
            instructions = session.settings.mcp_instructions
            out.append(server_toolset(spec, reserved=names, warn=warn, log_dir=log_dir, instructions=instructions,
                                      claimed=claimed))  # fmt: skip
        except PivotError as e:
            warn(f"MCP server {spec.name!r} left out: {e.message}")
    return out


class ListedTool(BaseModel):
    name: str = Field(description="The name pivot's model sees: the server's prefix, '_', the tool's own name.")
    description: str


class ListedServer(BaseModel):
    """What `pivot tools --mcp FILE` shows of one server: its tools as the agent would see them, or why none."""

    server: str
    where: str = Field(description="Its command or URL (no env, no headers).")
    tools: list[ListedTool] = Field(default_factory=list)
    left_out: list[str] = Field(default_factory=list, description="Tools named like pivot's own: not given.")
    error: str | None = None


def log_tail(path: Path | None, n: int = 3) -> str:
    """The last lines a server wrote on stderr, on one line (empty when there are none)."""
    if path is None:
        return ""
    try:
        lines = [x.strip() for x in path.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-400:]


async def _list_one(spec: ServerSpec, reserved: frozenset[str], log_dir: Path) -> ListedServer:
    from fastmcp import Client

    row = ListedServer(server=spec.name, where=spec.where)
    log_file = log_dir / f"mcp-{spec.prefix}.log"
    try:
        client = Client(transport(spec, log_file), init_timeout=INIT_TIMEOUT_S, timeout=60)
        async with client:
            tools = await client.list_tools()
    except PivotError as e:
        row.error = e.message
        return row
    except Exception as e:
        said = log_tail(log_file)
        row.error = f"did not start: {reason_of(e)}" + (f"; it said: {said}" if said else "")
        return row
    for t in tools:
        name = f"{spec.prefix}_{t.name}"
        if name in reserved:
            row.left_out.append(name)
            continue
        row.tools.append(ListedTool(name=name, description=(t.description or "").strip().split("\n", 1)[0]))
    return row


def list_servers(path: str | Path, reserved: Iterable[str]) -> list[ListedServer]:
    """Connect to each server of the file in turn and list its tools; a server that does not start is a row with
    its error."""
    import tempfile

    specs = load_config(path)
    names = frozenset(reserved)

    async def main(log_dir: Path) -> list[ListedServer]:
        return [await _list_one(spec, names, log_dir) for spec in specs]

    with tempfile.TemporaryDirectory(prefix="pivot-mcp-") as folder:  # the servers' stderr, read on a failure
        return asyncio.run(main(Path(folder)))
