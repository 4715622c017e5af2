"""The `command` engine: any OpenAI-compatible server (vLLM, `transformers serve`, llama.cpp's llama-server) from an argv.

    CommandEngine(command="vllm serve Qwen/Qwen3-8B --port {port}")
    CommandEngine(command=["llama-server", "-m", "model.gguf", "--port", "{port}"], health_path="/health")
    CommandEngine(command="transformers serve", base_url="http://127.0.0.1:8000", health_path="/v1/models")

`{host}` and `{port}` in the command or the flags are replaced by the engine's host and a free port.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from agent import models as m
from agent.contracts import EngineOptions, LedgerLink
from agent.errors import PivotError
from tools.engines.base import BaseEngine, argv_option
from tools.engines.http import HttpDeployment, start_deployment
from tools.engines.process import (
    DEFAULT_STOP_GRACE_S,
    free_port,
    url_for,
)


class CommandOptions(EngineOptions):
    """The command engine's options (`-o key=value`)."""

    command: str | list[str] | None = Field(None, description="The server's argv; {host} and {port} are filled in.")
    name: str = Field("command", description="The engine's name in the ledger and in messages.")
    base_url: str | None = Field(None, description="Where it answers (default http://host:port).")
    health_url: str | None = Field(None, description="What answers 200 once it is ready (default base_url + path).")
    health_path: str = Field("/health", description="The path of health_url under base_url.")
    host: str = Field("127.0.0.1", description="The host for {host} and the base URL.")
    port: int | None = Field(None, ge=1, le=65535, description="The port for {port} (default: a free one).")
    env: dict[str, str] = Field(default_factory=dict, description="Added to the server's environment.")
    cwd: str | None = Field(None, description="The server's working directory.")
    ready_line: str | None = Field(None, description="A log line to wait for besides the health URL.")
    ready_timeout_s: float = Field(600.0, gt=0, description="Seconds a launch may take to be ready.")
    stop_grace_s: float = Field(DEFAULT_STOP_GRACE_S, ge=0, description="SIGTERM to SIGKILL.")
    endpoint: Literal["completions", "chat"] = Field("completions", description="The OpenAI endpoint benchmarks use.")
    backend: str = Field("openai", description="The load generator's backend.")
    model: str | None = Field(None, description="The model name in OpenAI requests.")
    model_flag: str | None = Field(
        None,
        description="The flag that names the plan's model on the command line (e.g. --model-path); unset: the "
        "command names the model itself and pivot adds none.",
    )
    owner_check: bool = Field(True, description="False when the command starts the server elsewhere (docker, ssh).")


class CommandEngine(BaseEngine):
    """Any OpenAI-compatible server launched from a command line, ready when its health URL answers 200.

    There is no flag catalog for an arbitrary command, so validate() checks nothing: it returns one `ok` row
    per flag whose message says it was not checked, and the server's own refusal is what gets classified.
    Benchmarks use the OpenAI /v1/completions endpoint (`endpoint`) where the workload asks for SGLang's
    native /generate, which these servers do not have.
    """

    name = "command"
    Options: ClassVar[type[EngineOptions] | None] = CommandOptions

    def __init__(self, command: str | Sequence[str] | None = None, **options: object) -> None:
        """Options (CommandOptions): `command` the server's argv (a list, or a string split like a shell would,
        never run by one); `base_url` where it answers (default http://host:port, with `{port}` in the command giving
        a free port); `health_url` or `health_path` what answers 200 once ready; `ready_line` a log line to wait for
        as well; `endpoint` completions or chat for SGLang-native workloads; `model` the name in OpenAI requests;
        `owner_check` false when the command starts the server elsewhere (docker run, ssh): without a ready line,
        /health then counts although this host cannot see that the socket on the port is the command's own."""
        o = self.setup({**options, **({"command": command} if command is not None else {})})
        assert isinstance(o, CommandOptions)
        self.owner_check = o.owner_check
        self.command = argv_option(o.command)
        if not self.command:
            raise PivotError(
                "the command engine needs the server's command line",
                hint='e.g. -o command="vllm serve MODEL --port {port}"',
            )
        self.name, self.base_url, self.health_url, self.health_path = o.name, o.base_url, o.health_url, o.health_path
        self.host, self.port, self.env, self.cwd = o.host, o.port, dict(o.env), o.cwd
        self.ready_line, self.ready_timeout_s, self.stop_grace_s = o.ready_line, o.ready_timeout_s, o.stop_grace_s
        self.endpoint, self.backend, self.model = o.endpoint, o.backend, o.model
        self.model_flag = o.model_flag

    @property
    def model_flags(self) -> tuple[str, ...]:
        """The flag naming the model (`model_flag`), or none: an arbitrary server's command names its model itself
        (`vllm serve MODEL`, `transformers serve DIR`), and SGLang's --model-path would be an unknown option there."""
        return (self.model_flag,) if self.model_flag else ()

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

    def start(
        self, config: m.ServerConfig, log_path: Path, *, ledger: LedgerLink | None, issues: list[m.FlagIssue]
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
            audit=issues,
            power_limit_w=config.gpu_power_limit_w,
            gpu_count=self.parallelism(config).gpus,
        )
