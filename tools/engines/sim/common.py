"""What the twin's HTTP server modules share: SGLang's version, the constants, the loggers, the options,
one request in flight, and the small request/response helpers."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tools.engines.sim.options import check_twin_options
from tools.engines.sim.scheduler import Req

if TYPE_CHECKING:
    from tools.engines.sim.twin import Twin

SGLANG_VERSION = "0.5.23"
VERSION = f"{SGLANG_VERSION} (pivot twin)"
READY_LINE = "The server is fired up and ready to roll!"
TOKEN_TEXT = " tok"  # what every generated token decodes to
TOKEN_ID = 1000  # and its id
CHARS_PER_TOKEN = 4  # prompt text is "tokenized" as one token per 4 characters
DEFAULT_MAX_NEW_TOKENS = {"generate": 128, "completions": 16, "chat": 128}  # SGLang's, and 128 for chat (no EOS)
LOG_LINES_PER_S = 4.0  # per kind of step line, so a fast twin does not drown its log
WALL_LAG_TOLERANCE_S = 0.025  # behind the wall clock by more than this, the simulated clock waits
TELEMETRY_WINDOW_S = 1.0  # simulated seconds averaged by /sim/telemetry (NVML's power reading is a ~1 s average)
SHUTDOWN_TIMEOUT_S = 1.0

# SGLang's histogram buckets (seconds).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
               0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)  # fmt: skip
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800)

http_log = logging.getLogger("pivot.sim.http_server")
sched_log = logging.LoggerAdapter(logging.getLogger("pivot.sim.scheduler"), {"rank": " TP0"})


@dataclass(frozen=True)
class ServeOptions:
    """The twin's own knobs (SGLang's flags go to the catalog); out-of-range values raise PivotError."""

    time_scale: float = 1.0  # simulated seconds per wall-clock second
    startup_s: float = 2.0  # wall seconds of "loading" during which /health answers 503
    noise: float = 0.0  # run-to-run variation of step times (0.02 = about 2%)
    seed: int = 0

    def __post_init__(self) -> None:
        check_twin_options(time_scale=self.time_scale, startup_s=self.startup_s, noise=self.noise, seed=self.seed)


@dataclass(eq=False)
class Stream:
    """One request in flight: how many tokens the engine gave it, and the handler waiting for them."""

    rid: str
    req: Req
    endpoint: str  # generate | completions | chat
    max_new_tokens: int
    request: web.Request
    arrived_s: float  # simulated
    tokens: int = 0
    done: bool = False
    gone: bool = False  # the client left; the engine finishes it silently
    first_s: float | None = None
    last_s: float = 0.0
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def prompt_tokens(self) -> int:
        return self.req.input_len


class BadRequest(Exception):
    """A request SGLang would answer with 400."""


def _text_tokens(text: str) -> int:
    return max(len(text) // CHARS_PER_TOKEN, 1)


def _dumps(data: Any) -> str:
    return json.dumps(data, default=str)


def _error(endpoint: str, message: str, status: int = 400) -> web.Response:
    if endpoint == "generate":
        return web.json_response({"error": {"message": message}}, status=status)
    return web.json_response(
        {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status},
        status=status,
    )


async def _body(request: web.Request, endpoint: str) -> dict[str, Any] | web.Response:
    try:
        body = await request.json()
    except ValueError as e:
        return _error(endpoint, f"The request body is not valid JSON: {e}")
    if not isinstance(body, dict):
        return _error(endpoint, "The request body must be a JSON object.")
    return body


RESOLVED_ARGS = ("tp_size", "pp_size", "ep_size", "mem_fraction_static", "max_running_requests", "chunked_prefill_size",
                 "max_prefill_tokens", "cuda_graph_max_bs_decode", "kv_cache_dtype")  # fmt: skip


def resolved_args(twin: Twin) -> dict[str, Any]:
    """SGLang's server args after its startup hooks: what the user gave, with the automatic values resolved."""
    model_path = str(twin.args.get("model_path") or twin.model.model_path)
    served = twin.args.get("served_model_name") or model_path
    return {
        **twin.args,
        "model_path": model_path,
        "served_model_name": served,
        **{k: twin.resolved[k] for k in RESOLVED_ARGS},
    }
