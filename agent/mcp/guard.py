"""What guards `pivot mcp`: the HTTP transport's Host, Origin and bearer token, and the files a client may name.

- Host and Origin: FastMCP's guard in its strict mode (every request: the Host must be a loopback name or the
  address bound, an Origin a loopback one or the server's own), so a web page cannot drive the server by DNS
  rebinding.
- A bearer token (`pivot mcp --http --token-file F`, or one generated and printed at start): every request must carry
  `Authorization: Bearer TOKEN` (compared in constant time). Binding beyond loopback requires one.
- Files: a plan or a profile a client names by path must lie under a root pivot knows (its shipped plans and
  profiles, the pivot home, and the folders given with `--root` or $PIVOT_MCP_ROOTS); anything else is refused without
  reading it, and a refusal never echoes a file's content or a position in it.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.errors import PivotError

ROOTS_VAR = "PIVOT_MCP_ROOTS"


class BearerToken:
    """ASGI middleware: 401 unless the request carries `Authorization: Bearer <token>`."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.token = app, token.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = b""
            for name, value in scope.get("headers") or []:
                if name.lower() == b"authorization" and value[:7].lower() == b"bearer ":
                    given = value[7:].strip()
            if not hmac.compare_digest(given, self.token):
                body = b'{"error": "unauthorized: send Authorization: Bearer <the token pivot mcp printed>"}'
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def read_token(path: Path) -> str:
    """The token in `path` (its first line), refused when empty or readable by others."""
    try:
        text = path.read_text(encoding="utf-8").strip().splitlines()
    except OSError as e:
        raise PivotError(f"cannot read the token file {path}: {e.strerror or e}") from e
    if not text or len(text[0]) < 16:
        raise PivotError(f"the token file {path} holds no token of 16 characters or more")
    if os.name == "posix" and path.stat().st_mode & 0o077:
        raise PivotError(f"the token file {path} can be read by other users", hint=f"chmod 600 {path}")
    return text[0]


class FileRoots:
    """The folders whose files a client may name (see the module docstring)."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = [r.expanduser().resolve() for r in roots]

    @classmethod
    def default(cls, home: Path, extra: Sequence[Path] = ()) -> FileRoots:
        from agent.plans import bundled_plans_dir
        from tools.profiles import HERE as PROFILES_DIR

        env = [Path(p) for p in os.environ.get(ROOTS_VAR, "").split(os.pathsep) if p.strip()]
        return cls([bundled_plans_dir(), PROFILES_DIR, home, *extra, *env])

    def check(self, ref: str | None, what: str) -> None:
        """Refuse `ref` when it names a file outside the roots (a shipped plan's or profile's name passes)."""
        if not ref or not _looks_like_path(ref):
            return
        try:
            path = Path(ref).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):
            path = None
        if path is not None and any(path == r or r in path.parents for r in self.roots):
            return
        shown = ref if len(ref) <= 120 else ref[:117] + "..."
        raise PivotError(
            f"{what} {shown!r} is outside the folders this MCP server reads files from",
            hint="name a shipped plan or profile, or a file under the pivot home; the user may add a folder with "
            f"`pivot mcp --root DIR` (or ${ROOTS_VAR})",
        )


def _looks_like_path(ref: str) -> bool:
    return "/" in ref or "\\" in ref or ref.startswith(("~", ".")) or ref.endswith((".toml", ".json"))
