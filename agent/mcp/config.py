"""The common `mcpServers` JSON (Claude Code, Claude Desktop, Cursor): read, checked, one entry per server.

The file is checked when it is named (`--mcp FILE`), before a session is recorded: not JSON, not an object with
`mcpServers`, or an entry with neither `command` nor `url` is one clear error naming the file and the server.
`${VAR}` and `${VAR:-default}` in an entry are expanded only when that server is started, so a variable missing
for one server leaves the others running. Only the file's path is ever kept with a session, never its contents:
the env values in it may hold keys.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.errors import PivotError

EXAMPLE = '{"mcpServers": {"metrics": {"command": "python", "args": ["metrics_server.py"]}}}'
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NAME = re.compile(r"[^A-Za-z0-9_-]")


class ServerEntry(BaseModel):
    """One server of `mcpServers`: a command started over stdio, or an HTTP URL. Other clients' keys are ignored;
    `disabled: true` leaves the server out."""

    model_config = ConfigDict(extra="ignore")

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    disabled: bool = False


@dataclass(frozen=True)
class ServerSpec:
    """A server to connect: its name in the file, the prefix of its tools (the name, made a valid tool name) and
    its entry as written (variables not yet expanded)."""

    name: str
    prefix: str
    entry: ServerEntry

    def expanded(self) -> ServerEntry:
        """The entry with its `${VAR}` references expanded; a variable that is not set (and has no default) is a
        PivotError naming it."""
        return ServerEntry.model_validate(_expand(self.entry.model_dump(), self.name))

    @property
    def where(self) -> str:
        """The server in a few words: its command or URL (no env, no headers: they may hold keys)."""
        if self.entry.url:
            return self.entry.url
        return " ".join([self.entry.command or "", *self.entry.args]).strip()


def _expand(value: Any, server: str) -> Any:
    if isinstance(value, str):

        def one(found: re.Match[str]) -> str:
            name, default = found.group(1), found.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise PivotError(f"MCP server {server!r}: the environment variable {name} is not set")

        return _VAR.sub(one, value)
    if isinstance(value, dict):
        return {k: _expand(v, server) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, server) for v in value]
    return value


def resolve_path(path: str | Path) -> Path:
    """The file's absolute path, checked to be readable (what a session keeps)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise PivotError(f"no MCP configuration file {p}", hint=f"--mcp FILE: a JSON file such as {EXAMPLE}")
    return p.resolve()


def load_config(path: str | Path) -> list[ServerSpec]:
    """The servers of an `mcpServers` file, in its order (disabled ones left out); a malformed file is a PivotError
    that names the file and what is wrong."""
    p = resolve_path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise PivotError(f"cannot read the MCP configuration {p}: {e.strerror or e}") from e
    except ValueError as e:
        raise PivotError(f"{p} is not JSON: {e}", hint=f"an MCP configuration looks like {EXAMPLE}") from e
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise PivotError(f"{p} has no `mcpServers` object", hint=f"an MCP configuration looks like {EXAMPLE}")
    out: list[ServerSpec] = []
    prefixes: dict[str, str] = {}
    for name, raw in servers.items():
        try:
            entry = ServerEntry.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "entry"
            raise PivotError(f"{p}: server {name!r}: {where}: {first['msg']}", hint=EXAMPLE) from e
        if bool(entry.command) == bool(entry.url):
            raise PivotError(f"{p}: server {name!r} needs either `command` (stdio) or `url` (HTTP), not both or none")
        if entry.url and not entry.url.startswith(("http://", "https://")):
            raise PivotError(f"{p}: server {name!r}: `url` must be http:// or https:// (got {entry.url!r})")
        prefix = _NAME.sub("_", name.strip()).strip("_")
        if not prefix:
            raise PivotError(f"{p}: a server's name must have a letter or digit (got {name!r})")
        if prefix in prefixes:
            raise PivotError(f"{p}: servers {prefixes[prefix]!r} and {name!r} would prefix their tools the same way")
        prefixes[prefix] = name
        if not entry.disabled:
            out.append(ServerSpec(name=name, prefix=prefix, entry=entry))
    return out
