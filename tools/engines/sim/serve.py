"""The `pivot sim serve` process: SGLang's log format, its startup lines, and the server until it stops."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from agent import models as m
from tools.engines.sim.common import SGLANG_VERSION, ServeOptions, http_log, resolved_args, sched_log
from tools.engines.sim.twin import Twin, TwinStartupError
from tools.engines.sim.twin_server import TwinServer


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank"):
            record.rank = ""
        return True


def setup_logging(level: str = "info") -> None:
    """SGLang's log format on stderr: `[2026-01-01 12:00:00 TP0] message`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s%(rank)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(_RankFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # cut connections are the point, not news


def _startup_lines(twin: Twin) -> None:
    for warning in twin.warnings:
        http_log.warning(warning)
    r, hw = twin.resolved, twin.hw
    args = ", ".join(f"{k}={v!r}" for k, v in resolved_args(twin).items())
    http_log.info(f"server_args=ServerArgs({args})")
    used = r["weights_gib_per_gpu"]
    sched_log.info(
        f"Load weight end. type={twin.model.architecture}, avail mem={hw.memory_gib - used:.2f} GB, "
        f"mem usage={used:.2f} GB."
    )
    sched_log.info(
        f"KV Cache is allocated. #tokens: {r['max_total_num_tokens']}, KV size: {r['kv_pool_gib_per_gpu']:.2f} GB"
    )
    sched_log.info(twin.startup_line())
    if twin.no_effect:
        http_log.info(
            f"pivot twin: accepted flags with no effect in SGLang {SGLANG_VERSION}: {', '.join(twin.no_effect)}"
        )
    if twin.not_modelled:
        http_log.info(f"pivot twin: accepted flags the twin does not model: {', '.join(twin.not_modelled)}")


def serve(flags: Sequence[str], *, model_profile: str, hardware: str, gpus: int, options: ServeOptions) -> int:
    """Run `sglang serve FLAGS` as the twin until it stops; returns the process's exit code.

    Flags SGLang refuses print SGLang's own usage error and return its code (2); a startup fault logs
    SGLang's line and returns 1. Profiles that do not exist raise PivotError (pivot's error, not SGLang's).
    """
    from tools.engines.catalog import CatalogError

    try:
        twin = Twin.build(model_profile, hardware, gpus, m.ServerConfig.parse(list(flags)), SGLANG_VERSION)
    except CatalogError as e:
        sys.stdout.write(e.stdout)
        sys.stderr.write(e.stderr)
        return e.exit_code
    except TwinStartupError as e:
        setup_logging("info")
        if e.classify == "argument-validation":  # SGLang's arg hooks raise in the launching process itself
            http_log.error(f"Traceback (most recent call last):\n{e.log}")
        else:  # the scheduler process fails while loading, and the launcher notices
            sched_log.error(f"Scheduler hit an exception: Traceback (most recent call last):\n{e.log}")
            http_log.error("Received sigquit from a child process. It usually means the child failed.")
        return e.exit_code
    setup_logging(str(twin.args.get("log_level") or "info"))
    _startup_lines(twin)
    server = TwinServer(twin, options)
    host, port = str(twin.args.get("host") or "127.0.0.1"), int(twin.args.get("port") or 30000)
    return asyncio.run(server.run(host, port))
