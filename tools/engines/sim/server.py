"""`pivot sim serve`: the twin behind SGLang's HTTP endpoints, token timing on the wall clock sped up by --time-scale.

One process, one asyncio loop: an aiohttp app takes requests and an engine task runs the twin's
continuous-batching scheduler (`EngineCore`) step by step, sleeping each step's simulated duration
divided by the time scale, then handing the step's tokens to the open streams. What the server
reports about itself (log lines, /metrics, /server_info, /stop_profile, /sim/telemetry) is in
simulated seconds, as SGLang on those GPUs would report it; what a client measures on the wall
clock is faster by `time_scale` (server_info says how much). When the host cannot keep up with the
scale, the simulated clock waits for it (`internal_states[0].wall_lag_s` says how much it lost).

Endpoints (SGLang 0.5.23's, see the facts): /health and /health_generate (503 while starting),
/server_info, /model_info, /v1/models, /metrics (with --enable-metrics), /start_profile and
/stop_profile (the step-time breakdown by component), /generate, /v1/completions and
/v1/chat/completions (streaming and not), /flush_cache, and /sim/telemetry (simulated GPU telemetry,
pivot's Telemetry model, since NVML does not exist here). Generated text is " tok" per token; the
twin does not model EOS, so every request generates its max_new_tokens.

Failures as SGLang shows them: refused flags print argparse's message and exit 2; a startup fault
(out of memory, an invalid combination) logs SGLang's line and exits 1; a fault under load logs the
crash, cuts every open stream and exits 1. SIGTERM and SIGINT stop the server and exit 0.

The code lives in modules beside this one: common.py (constants, options, helpers), http_app.py (routes and
request parsing), streaming.py (admission and streamed answers), metrics_endpoint.py (/metrics, profile,
telemetry), twin_server.py (the engine loop) and serve.py (the process entry). Their public names are
importable from here.
"""

from tools.engines.sim.common import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_NEW_TOKENS,
    E2E_BUCKETS,
    ITL_BUCKETS,
    LOG_LINES_PER_S,
    READY_LINE,
    RESOLVED_ARGS,
    SGLANG_VERSION,
    SHUTDOWN_TIMEOUT_S,
    TELEMETRY_WINDOW_S,
    TOKEN_ID,
    TOKEN_TEXT,
    TTFT_BUCKETS,
    VERSION,
    WALL_LAG_TOLERANCE_S,
    BadRequest,
    ServeOptions,
    Stream,
    http_log,
    resolved_args,
    sched_log,
)
from tools.engines.sim.metrics_endpoint import Histogram, ProfileWindow, TwinCollector
from tools.engines.sim.serve import serve, setup_logging
from tools.engines.sim.twin_server import TwinServer

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_MAX_NEW_TOKENS",
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "LOG_LINES_PER_S",
    "READY_LINE",
    "RESOLVED_ARGS",
    "SGLANG_VERSION",
    "SHUTDOWN_TIMEOUT_S",
    "TELEMETRY_WINDOW_S",
    "TOKEN_ID",
    "TOKEN_TEXT",
    "TTFT_BUCKETS",
    "VERSION",
    "WALL_LAG_TOLERANCE_S",
    "BadRequest",
    "Histogram",
    "ProfileWindow",
    "ServeOptions",
    "Stream",
    "TwinCollector",
    "TwinServer",
    "http_log",
    "resolved_args",
    "sched_log",
    "serve",
    "setup_logging",
]
