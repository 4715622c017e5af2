"""The `llama-server` engine: llama.cpp's OpenAI-compatible server as a process pivot audits, launches and benchmarks.

    pivot audit-flags --engine llama-server -- -m model.gguf -c 8192 -ngl all
    pivot launch-bench --engine llama-server -o command=/opt/llama.cpp/build/bin/llama-server -- -m model.gguf

Everything pivot knows of llama-server lives in this package: its flag catalog (llama-server-b4000.json, shipped as
package data), the argument types that catalog names (`ARGTYPES`), its model flag (`-m`), its Prometheus gauges
(served with --metrics), its ready line and its failure messages. Nothing of pivot's own catalogs is touched.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field

from agent import models as m
from agent.contracts import EngineOptions
from tools.engines.base import ServerEngine, argv_option
from tools.engines.catalog import BASIC_ARGTYPES, ArgTypes, FlagSpec
from tools.engines.failures import ARGPARSE_RULES, PORT_RULE, RUNTIME_RULES, FailureRule, not_installed_rule
from tools.engines.process import free_port

VERSION = "b4000"  # the llama.cpp build whose options the catalog holds


def gpu_layers(value: str) -> int | str:
    """llama-server's -ngl: a number of layers, or `auto` / `all` (argparse names the function in its error)."""
    if value in ("auto", "all"):
        return value
    layers = int(value)  # a ValueError is argparse's "invalid gpu_layers value: 'x'"
    if layers < 0:
        raise ValueError(value)
    return layers


# The types and actions the catalog names: argparse's basics, and llama-server's own -ngl reader.
ARGTYPES = ArgTypes(types={**BASIC_ARGTYPES.types, "gpu_layers": gpu_layers}, actions=BASIC_ARGTYPES.actions)

# llama-server's gauges under pivot's names (llama.cpp's tools/server/server.cpp, with --metrics).
GAUGES = {
    "num_running_reqs": "llamacpp:requests_processing",
    "num_queue_reqs": "llamacpp:requests_deferred",
    "token_usage": "llamacpp:kv_cache_usage_ratio",
    "gen_throughput": "llamacpp:predicted_tokens_seconds",
}

# The shared rules in order, with llama.cpp's own words for a model that does not fit and one it cannot read.
FAILURE_RULES: tuple[FailureRule, ...] = (
    *ARGPARSE_RULES,
    FailureRule("unrecognized-argument", re.compile(r"error: invalid argument", re.IGNORECASE)),
    PORT_RULE,
    not_installed_rule("llama_cpp", "llama-server"),
    FailureRule("oom", re.compile(r"failed to allocate .* buffer|cudaMalloc failed: out of memory", re.IGNORECASE)),
    FailureRule("argument-validation", re.compile(r"failed to load model|error loading model", re.IGNORECASE)),
    *RUNTIME_RULES,
)


class LlamaServerOptions(EngineOptions):
    """The llama-server engine's options (`-o key=value`); pivot checks them before anything starts."""

    command: str | list[str] = Field("llama-server", description="The server's command (a path to llama-server).")
    prefix: str | list[str] | None = Field(None, description="An argv put in front: docker exec NAME, ssh host.")
    env: dict[str, str] = Field(default_factory=dict, description="Added to the server's environment.")
    host: str = Field("127.0.0.1", description="Where it listens unless the flags say.")
    port: int | None = Field(None, ge=1, le=65535, description="Its port unless the flags say (default: a free one).")
    cwd: str | None = Field(None, description="The server's working directory.")
    force: bool = Field(False, description="Launch even when the audit finds flags llama-server refuses.")
    ready_timeout_s: float = Field(600.0, gt=0, description="Seconds loading the model may take.")
    stop_grace_s: float = Field(10.0, ge=0, description="SIGTERM to SIGKILL.")


class LlamaServerEngine(ServerEngine):
    """llama.cpp's llama-server, launched as a process, audited against its catalog, benchmarked over OpenAI's API."""

    name = "llama-server"
    version = VERSION
    catalog_engine = "llama-server"  # the catalog file is llama-server-<version>.json ...
    catalog_package = "pivot_llamacpp"  # ... in this package's data
    argtypes = ARGTYPES
    model_flag_names = ("-m", "--model")  # the one pivot adds to a plan's base flags is the first
    ready_line = "server is listening on"
    gauges = GAUGES
    failure_rules = FAILURE_RULES
    health_path = "/health"
    Options: ClassVar[type[EngineOptions] | None] = LlamaServerOptions

    def __init__(self, **options: object) -> None:
        o = self.setup(options)  # checked against LlamaServerOptions: one clear line when they do not fit
        assert isinstance(o, LlamaServerOptions)
        self.command = argv_option(o.command)
        self.prefix = argv_option(o.prefix)
        self.env, self.host, self.port, self.cwd, self.force = dict(o.env), o.host, o.port, o.cwd, o.force
        self.ready_timeout_s, self.stop_grace_s = o.ready_timeout_s, o.stop_grace_s

    def argv(self, config: m.ServerConfig) -> tuple[list[str], str, int]:
        """The command line for `config`, with --host and --port added unless the flags set them."""
        values = self.values(config)
        given = {spec.dest for flag in config.flags if isinstance(spec := self.catalog.resolve(flag.name), FlagSpec)}
        extra: list[str] = []
        host = values.get("host") if "host" in given else None
        if not isinstance(host, str):
            host = self.host
            extra += ["--host", host]
        port = values.get("port") if "port" in given else None
        if not isinstance(port, int):
            port = self.port if self.port is not None else free_port(host)
            extra += ["--port", str(port)]
        return [*self.prefix, *self.command, *config.argv(), *extra], host, port

    def deployment_options(self) -> dict[str, object]:
        """Benchmarks speak OpenAI's /v1/completions (llama-server has no SGLang-native /generate)."""
        return {"backend": "openai", "endpoint": "completions"}
