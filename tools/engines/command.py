"""The `command` engine: any OpenAI-compatible server (vLLM, `transformers serve`, llama.cpp's llama-server) from an argv.

    CommandEngine(command="vllm serve Qwen/Qwen3-8B --port {port}")
    CommandEngine(command=["llama-server", "-m", "model.gguf", "--port", "{port}"], health_path="/health")
    CommandEngine(command="transformers serve", base_url="http://127.0.0.1:8000", health_path="/v1/models")

`{host}` and `{port}` in the command or the flags are replaced by the engine's host and a free port.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent import models as m
from agent.contracts import LedgerLink
from agent.errors import PivotError
from tools.engines.base import BaseEngine
from tools.engines.http import HttpDeployment, start_deployment
from tools.engines.process import (
    DEFAULT_STOP_GRACE_S,
    free_port,
    url_for,
)
from tools.engines.sglang import argv_option


class CommandEngine(BaseEngine):
    """Any OpenAI-compatible server launched from a command line, ready when its health URL answers 200.

    There is no flag catalog for an arbitrary command, so validate() checks nothing: it returns one `ok` row
    per flag whose message says it was not checked, and the server's own refusal is what gets classified.
    Benchmarks use the OpenAI /v1/completions endpoint (`endpoint`) where the workload asks for SGLang's
    native /generate, which these servers do not have.
    """

    name = "command"

    def __init__(
        self,
        command: str | Sequence[str] | None = None,
        *,
        name: str = "command",
        base_url: str | None = None,
        health_url: str | None = None,
        health_path: str = "/health",
        host: str = "127.0.0.1",
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        ready_line: str | None = None,
        ready_timeout_s: float = 600.0,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        endpoint: str = "completions",
        backend: str = "openai",
        model: str | None = None,
        owner_check: bool = True,
    ) -> None:
        """Options: `command` the server's argv (a list, or a string split like a shell would, never run by one);
        `base_url` where it answers (default http://host:port, with `{port}` in the command giving a free port);
        `health_url` or `health_path` what answers 200 once ready; `ready_line` a log line to wait for as well;
        `endpoint` completions or chat for SGLang-native workloads; `model` the name in OpenAI requests;
        `owner_check` false when the command starts the server elsewhere (docker run, ssh): without a ready line,
        /health then counts although this host cannot see that the socket on the port is the command's own."""
        self.owner_check = owner_check
        self.command = argv_option(command)
        if not self.command:
            raise PivotError(
                "the command engine needs the server's command line",
                hint='e.g. command="vllm serve MODEL --port {port}"',
            )
        if endpoint not in ("completions", "chat"):
            raise PivotError(f"endpoint must be completions or chat, not {endpoint!r}")
        self.name, self.base_url, self.health_url, self.health_path = name, base_url, health_url, health_path
        self.host, self.port, self.env, self.cwd = host, port, dict(env or {}), cwd
        self.ready_line, self.ready_timeout_s, self.stop_grace_s = ready_line, ready_timeout_s, stop_grace_s
        self.endpoint, self.backend, self.model = endpoint, backend, model

    def not_modelled(self, config: m.ServerConfig) -> list[str]:
        """A real server: every flag's effect is what it measures."""
        return []

    def validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        """Nothing is checked (no catalog for an arbitrary server): one ok row per flag saying so."""
        return [
            m.FlagIssue(flag=flag.name, status="ok", message="not checked: the command engine has no flag catalog")
            for flag in config.flags
        ]

    def argv(self, config: m.ServerConfig) -> tuple[list[str], str]:
        """The command line for `config` ({host} and {port} filled in) and the base URL it will answer at."""
        tokens = [*self.command, *config.argv()]
        port = self.port
        if port is None and any("{port}" in t for t in tokens):
            port = free_port(self.host)
        tokens = [t.replace("{host}", self.host).replace("{port}", str(port)) for t in tokens]
        if self.base_url is not None:
            return tokens, self.base_url.rstrip("/")
        if port is None:
            for flag, value in itertools.pairwise(tokens):
                if flag == "--port" and value.isdigit():
                    port = int(value)
        if port is None:
            raise PivotError(
                "the command engine cannot tell where the server will listen",
                hint="put {port} in the command (it becomes a free port), or give base_url",
            )
        return tokens, url_for(self.host, port)

    def launch(
        self, config: m.ServerConfig, log_path: Path, *, ledger: LedgerLink | None = None, force: bool = False
    ) -> HttpDeployment:
        """Start the command with `config`'s flags, logging to `log_path` (recorded in `ledger`); returns before ready.

        Nothing is audited (no catalog), so `force` changes nothing: the server's own refusal is classified."""
        argv, base_url = self.argv(config)
        return start_deployment(
            argv,
            log_path=log_path,
            base_url=base_url,
            engine=self.name,
            health_url=self.health_url or base_url + self.health_path,
            host=self.host,
            env={**self.env, **config.env},
            cwd=self.cwd,
            ready_line=self.ready_line,
            stop_grace_s=self.stop_grace_s,
            owner_check=self.owner_check,
            ledger=ledger,
            backend=self.backend,
            endpoint=self.endpoint,
            model=self.model,
            audit=self.validate(config),
            power_limit_w=config.gpu_power_limit_w,
            gpu_count=self.parallelism(config).gpus,
        )
