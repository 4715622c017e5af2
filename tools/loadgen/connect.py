"""Reaching the server before a sweep: its URL, the open-files limit, the probe, auth headers, accept length."""

from __future__ import annotations

import contextlib
import json
import os
import resource

import aiohttp
from yarl import URL

from agent.errors import PivotError


def _normalize_base_url(base_url: str) -> str:
    url = base_url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    try:
        parsed = URL(url)
    except ValueError as e:
        raise PivotError(f"bad base URL {base_url!r}: {e}", hint="write it like http://127.0.0.1:30000") from e
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise PivotError(f"bad base URL {base_url!r}", hint="write it like http://127.0.0.1:30000")
    return url


def _raise_open_files(needed: int) -> None:
    """Raise the soft limit on open files (as bench_serving does); fail clearly when the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = hard if hard == resource.RLIM_INFINITY else min(hard, max(needed, 65535))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            raise PivotError(
                f"concurrency needs about {needed} open files but this process may open only {soft}",
                hint="raise the limit (ulimit -n) or lower the concurrency",
            )


def check_open_files(max_concurrency: int) -> None:
    """Before anything is launched: raise PivotError when this process cannot open the sockets a level of
    `max_concurrency` needs (the limit is raised as far as the hard limit allows, as bench_serving does)."""
    _raise_open_files(max_concurrency + 256)


MAX_MODELS_BYTES = 2**20


async def probe(base_url: str, *, connect_timeout_s: float = 5.0, headers: dict[str, str] | None = None) -> str | None:
    """Fail fast when nothing answers at base_url; the served model's name from `GET /v1/models`, if it has one."""
    timeout = aiohttp.ClientTimeout(total=max(10.0, connect_timeout_s * 2), sock_connect=connect_timeout_s)
    hint = "is the server running and listening there? check the scheme, host and port of --base-url"
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, headers=auth_headers() if headers is None else headers) as session,
            session.get(base_url + "/v1/models") as resp,
        ):
            if resp.status != 200:
                return None
            raw = await resp.content.read(MAX_MODELS_BYTES + 1)  # a list of models, not a stream without end
            if len(raw) > MAX_MODELS_BYTES:
                return None
            data = json.loads(raw)
            models = data.get("data") if isinstance(data, dict) else None
            if isinstance(models, list) and models and isinstance(models[0], dict) and models[0].get("id"):
                return str(models[0]["id"])[:512]
            return None
    except aiohttp.ClientConnectorError as e:
        reason = e.os_error.strerror if e.os_error and e.os_error.strerror else str(e)
        raise PivotError(f"cannot reach {base_url}: {reason}", hint=hint) from e
    except aiohttp.ConnectionTimeoutError as e:
        raise PivotError(f"cannot reach {base_url}: no answer within {connect_timeout_s:g} s", hint=hint) from e
    except aiohttp.InvalidURL as e:
        raise PivotError(f"bad base URL {base_url!r}", hint="write it like http://127.0.0.1:30000") from e
    except (TimeoutError, aiohttp.ClientError, ValueError, RecursionError):
        return None  # it answered the connection; /v1/models is optional (and may say anything)


def auth_headers() -> dict[str, str]:
    """bench_serving's authentication: `Bearer $OPENAI_API_KEY`, else `$API_KEY` as it is, read from the environment."""
    if key := os.environ.get("OPENAI_API_KEY"):
        return {"Authorization": f"Bearer {key}"}
    if key := os.environ.get("API_KEY"):
        return {"Authorization": key}
    return {}


async def _accept_length(base_url: str, headers: dict[str, str]) -> float | None:
    """bench_serving's accept_length (speculative decoding) from SGLang's /server_info, when the server has it."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5), headers=headers) as session,
            session.get(base_url + "/server_info") as resp,
        ):
            if resp.status != 200:
                return None
            info = await resp.json(content_type=None)
        if isinstance(info, dict) and "decode" in info:
            info = info["decode"][0]
        states = info.get("internal_states") if isinstance(info, dict) else None
        value = states[0].get("avg_spec_accept_length") if states else None
        return float(value) if value is not None else None
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
