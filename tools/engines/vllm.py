"""The `vllm` engine: vLLM 0.33.0's OpenAI-compatible server as a real process, through the Engine contract only.

    engine = VLLMEngine()                                      # vllm serve --host 127.0.0.1 --port P FLAGS
    engine = VLLMEngine(launcher="api_server")                 # python -m vllm.entrypoints.openai.api_server ...
    engine = VLLMEngine(python="/opt/vllm/bin/python", launcher="api_server")
    engine = VLLMEngine(prefix=["docker", "exec", "vllm"])     # docker exec vllm vllm serve ...

What pivot knows of vLLM lives here: its flag catalog (tools/engines/catalog/vllm-0.33.0.json, generated from
vLLM's own parser by scripts/gen_vllm_catalog.py), its Prometheus gauges, its ready line, its failure messages
and how its flags split the model (TP, PP, DP, and EP = TP x DP when expert parallelism is on). The model is a
flag like any other (`--model NAME`, which both launchers accept). Benchmarks use the OpenAI /v1/completions
endpoint (vLLM has no SGLang-native /generate).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field

from agent import models as m
from agent.contracts import EngineOptions, Parallelism
from tools.engines.base import ServerEngine, argv_option
from tools.engines.catalog import FlagSpec
from tools.engines.failures import ARGPARSE_RULES, PORT_RULE, RUNTIME_RULES, FailureRule, not_installed_rule
from tools.engines.process import DEFAULT_READY_TIMEOUT_S, DEFAULT_STOP_GRACE_S, free_port

VERSION = "0.33.0"
DEFAULT_HOST = "127.0.0.1"  # vLLM binds every interface when --host is not given; pivot binds loopback unless told
Launcher = Literal["serve", "api_server"]
# uvicorn's line once the API server accepts connections (vLLM logs "Starting vLLM server on ..." just before)
READY_LINE = "Application startup complete."

# vLLM's gauges (vllm/v1/metrics/loggers.py, labels model_name and engine), under pivot's names. vLLM has no
# generation-throughput gauge (vllm:generation_tokens is a counter), so gen_throughput is not read.
GAUGES = {
    "num_running_reqs": "vllm:num_requests_running",
    "num_queue_reqs": "vllm:num_requests_waiting",
    "token_usage": "vllm:kv_cache_usage_perc",  # a fraction despite its name: "1 means 100 percent usage"
}


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


# The shared rules in order, with vLLM's own words (vllm 0.33.0 wheel): the KV cache that does not fit after the
# weights (vllm/v1/core/kv_cache_planning.py) is an out-of-memory at startup; a config that vLLM's pydantic
# dataclasses or EngineArgs refuse (vllm/config/*.py, vllm/engine/arg_utils.py) is an argument-validation.
FAILURE_RULES: tuple[FailureRule, ...] = (
    *ARGPARSE_RULES,
    PORT_RULE,
    not_installed_rule("vllm", "vllm"),
    FailureRule(
        "oom",
        _rx(
            r"No available memory for the cache blocks|"
            r"KV cache is needed, which is larger than the available KV cache memory"
        ),
    ),
    *RUNTIME_RULES,
    FailureRule("argument-validation", _rx(r"\d+ validation errors? for \w*Config\b|pydantic.*ValidationError")),
    FailureRule(
        "argument-validation",
        _rx(r"\b(ValueError|AssertionError|NotImplementedError|TypeError)\b"),
        needs=_rx(r"vllm/config/|arg_utils\.py|create_engine_config|cli_args\.py|validate_api_server_args"),
    ),
)


class VLLMOptions(EngineOptions):
    """The vllm engine's options (`-o key=value`)."""

    name: str = Field("vllm", description="The engine's name in the ledger and in messages.")
    version: str = Field(VERSION, description="The vLLM version whose catalog audits the flags.")
    launcher: Launcher = Field("serve", description="vllm serve, or python -m vllm.entrypoints.openai.api_server.")
    python: str | None = Field(None, description="The interpreter that has vLLM (api_server).")
    prefix: str | list[str] | None = Field(None, description="An argv put in front: docker exec NAME, ssh host.")
    command: str | list[str] | None = Field(None, description="The whole launch command instead of the launcher.")
    env: dict[str, str] = Field(default_factory=dict, description="Added to the server's environment.")
    host: str = Field(DEFAULT_HOST, description="Where it listens unless the flags say.")
    port: int | None = Field(None, ge=1, le=65535, description="Its port unless the flags say (default: a free one).")
    cwd: str | None = Field(None, description="The server's working directory.")
    force: bool = Field(False, description="Launch even when the audit finds flags vLLM refuses.")
    ready_timeout_s: float = Field(DEFAULT_READY_TIMEOUT_S, gt=0, description="Seconds a launch may take to be ready.")
    stop_grace_s: float = Field(DEFAULT_STOP_GRACE_S, ge=0, description="SIGTERM to SIGKILL.")
    health_path: str = Field("/health", description="What answers 200 once it serves.")
    endpoint: Literal["completions", "chat"] = Field("completions", description="The OpenAI endpoint benchmarks use.")
    model: str | None = Field(None, description="The model name in requests (default: the server's /v1/models).")


class VLLMEngine(ServerEngine):
    """vLLM, launched as a process (`vllm serve` or its api_server module), audited and benchmarked over OpenAI's API.

    The audit is against the catalog of vLLM's own parser; benchmarks use /v1/completions (or chat)."""

    catalog_engine = "vllm"
    model_flag_names = ("--model",)
    ready_line = READY_LINE
    gauges = GAUGES
    failure_rules = FAILURE_RULES
    parallel_dests: ClassVar[Mapping[str, str]] = {
        "tp": "tensor_parallel_size",
        "pp": "pipeline_parallel_size",
        "dp": "data_parallel_size",
    }

    Options: ClassVar[type[EngineOptions] | None] = VLLMOptions

    def __init__(self, **options: object) -> None:
        """Options (VLLMOptions): `launcher` serve (default: the `vllm` command) or api_server (`python -m
        vllm.entrypoints.openai.api_server`, with `python` the interpreter that has vLLM); `prefix` an argv put in
        front (`docker exec NAME`, `ssh host`); `command` the whole launch command instead; `env` added to the
        server's environment; `host`/`port` where it listens unless the flags say (default 127.0.0.1 and a free
        port); `force` launch even when the audit finds flags vLLM refuses; `endpoint` the OpenAI endpoint benchmarks
        use; `model` the name in requests (default: the server's /v1/models)."""
        o = self.setup(options)
        assert isinstance(o, VLLMOptions)
        self.name, self.version, self.launcher = o.name, o.version, o.launcher
        self.prefix = argv_option(o.prefix)
        self.python = o.python or ("python3" if self.prefix else sys.executable)
        self.command = argv_option(o.command) or None
        self.env = dict(o.env)
        self.host, self.port, self.cwd, self.force = o.host, o.port, o.cwd, o.force
        self.ready_timeout_s, self.stop_grace_s, self.health_path = o.ready_timeout_s, o.stop_grace_s, o.health_path
        self.endpoint, self.model = o.endpoint, o.model

    def launch_command(self) -> list[str]:
        """What runs before the flags: prefix, then the command (or the launcher)."""
        if self.command is not None:
            base = list(self.command)
        elif self.launcher == "api_server":
            base = [self.python, "-m", "vllm.entrypoints.openai.api_server"]
        else:
            base = ["vllm", "serve"]
        return [*self.prefix, *base]

    def parallelism(self, config: m.ServerConfig) -> Parallelism:
        """TP, PP and DP from their flags; with --enable-expert-parallel the MoE layers are split over TP x DP
        GPUs (vLLM's expert-parallel size is the product), else EP is 1."""
        values = self.values(config)
        base = super().parallelism(config)
        ep = base.tp * base.dp if values.get("enable_expert_parallel") else 1
        return Parallelism(tp=base.tp, pp=base.pp, ep=ep, dp=base.dp)

    def _address(self, config: m.ServerConfig) -> tuple[str, int, list[str]]:
        """Where the server will listen, and the flags to add so it does (only those the config does not set)."""
        values = self.values(config)
        given = {spec.dest for flag in config.flags if isinstance(spec := self.catalog.resolve(flag.name), FlagSpec)}
        extra: list[str] = []
        host = values.get("host") if "host" in given else None
        if not isinstance(host, str) or not host:
            host = self.host
            extra += ["--host", host]
        port = values.get("port") if "port" in given else None
        if not isinstance(port, int):
            port = self.port if self.port is not None else free_port(host)
            extra += ["--port", str(port)]
        return host, port, extra

    def argv(self, config: m.ServerConfig) -> tuple[list[str], str, int]:
        """The full command line for `config` (with --host/--port added when missing), its host and its port."""
        host, port, extra = self._address(config)
        return [*self.launch_command(), *config.argv(), *extra], host, port

    def deployment_options(self) -> dict[str, object]:
        return {"backend": "vllm", "endpoint": self.endpoint, "model": self.model}
