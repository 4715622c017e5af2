"""The `sglang` engine (SGLang as a real process) and `sim-http` (the same engine launching the twin's server).

    engine = SGLangEngine()                                   # python -m sglang.launch_server ... --host 127.0.0.1 --port P
    engine = SGLangEngine(launcher="serve")                   # sglang serve ...
    engine = SGLangEngine(prefix=["docker", "exec", "sgl"])   # docker exec sgl python3 -m sglang.launch_server ...

`sim-http` is tools/engines/sim/http_engine.py's SimHttpEngine: this engine, launching the twin's server.

Flags are audited against SGLang's catalog before launch: flags SGLang would refuse (unknown, ambiguous,
invalid) stop the launch with FlagsRefused unless `force`, and then it is SGLang's own refusal that is
classified from its log.
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from agent import models as m
from agent.contracts import EngineOptions, FlagAudit, Predictor
from tools.engines.base import ServerEngine, argv_option
from tools.engines.catalog import FlagSpec
from tools.engines.failures import ARGPARSE_RULES, PIVOT_RULE, PORT_RULE, RUNTIME_RULES, FailureRule, not_installed_rule
from tools.engines.process import DEFAULT_READY_TIMEOUT_S, DEFAULT_STOP_GRACE_S, free_port

VERSION = "0.5.23"
DEFAULT_HOST = "127.0.0.1"  # SGLang itself binds 127.0.0.1 by default; a wider bind is the user's choice
Launcher = Literal["launch_server", "serve"]
READY_LINE = "The server is fired up and ready to roll!"  # SGLang's http_server.py, logged once it serves

# SGLang's gauges (sglang/srt/observability/metrics_collector.py), under the names pivot reports them by.
GAUGES = {
    "num_running_reqs": "sglang:num_running_reqs",
    "num_queue_reqs": "sglang:num_queue_reqs",
    "token_usage": "sglang:token_usage",
    "gen_throughput": "sglang:gen_throughput",
}


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


# The shared rules in order, with SGLang's own: its launcher's module and command, and the checks of its arguments
# in ServerArgs (server_args.py) and its arg_groups hooks, in the launching process.
FAILURE_RULES: tuple[FailureRule, ...] = (
    PIVOT_RULE,  # the twin's own command line (pivot sim serve) refused a value: pivot's error, not SGLang's
    *ARGPARSE_RULES,
    PORT_RULE,
    not_installed_rule("sglang", "sglang"),
    *RUNTIME_RULES,
    # the twin behind SGLang's interface (`pivot sim serve`, the sim-http engine): a value SGLang's parser takes but
    # the twin cannot simulate
    FailureRule("not-simulable", _rx(r"pivot twin: cannot simulate")),
    FailureRule(
        "argument-validation",
        _rx(r"\b(ValueError|AssertionError|ArgumentTypeError|NotImplementedError)\b"),
        needs=_rx(r"server_args\.py|arg_groups|check_server_args|prepare_server_args|argparse\.py"),
    ),
    # a ValueError or AssertionError that ends the launcher itself (not one raised in a scheduler process)
    FailureRule(
        "argument-validation",
        _rx(r"^(\[[^\]]*\]\s*)?(ValueError|AssertionError)\b"),
        unless=_rx(r"Scheduler hit an exception|TpModelWorker|DetokenizerManager"),
    ),
)


ArgvOption = str | list[str] | None  # an argv given as a list, or as a string split like a shell would


class SGLangOptions(EngineOptions):
    """The sglang engine's options (`-o key=value`)."""

    name: str = Field("sglang", description="The engine's name in the ledger and in messages.")
    version: str = Field(VERSION, description="The SGLang version whose catalog audits the flags.")
    launcher: Launcher = Field("launch_server", description="python -m sglang.launch_server, or sglang serve.")
    python: str | None = Field(
        None, description="The interpreter that has SGLang (default this one, python3 behind a prefix)."
    )
    prefix: ArgvOption = Field(None, description="An argv put in front: docker exec NAME, ssh host, env -u X.")
    command: ArgvOption = Field(None, description="The whole launch command instead of launcher and python.")
    env: dict[str, str] = Field(default_factory=dict, description="Added to the server's environment.")
    host: str = Field(DEFAULT_HOST, description="Where it listens unless the flags say.")
    port: int | None = Field(None, ge=1, le=65535, description="Its port unless the flags say (default: a free one).")
    cwd: str | None = Field(None, description="The server's working directory.")
    force: bool = Field(False, description="Launch even when the audit finds flags SGLang refuses.")
    require_model: bool = Field(True, description="Refuse a command line that names no model.")
    ready_timeout_s: float = Field(DEFAULT_READY_TIMEOUT_S, gt=0, description="Seconds a launch may take to be ready.")
    stop_grace_s: float = Field(DEFAULT_STOP_GRACE_S, ge=0, description="SIGTERM to SIGKILL.")
    health_path: str = Field("/health", description="What answers 200 once it serves.")
    source: m.Source = Field("measured", description="What its numbers are: measured, or simulated (the twin).")
    time_scale: float | None = Field(None, gt=0, description="Simulated seconds per wall second (the twin).")
    warmup_pause_s: float = Field(1.0, ge=0, description="Pause after the warm-up requests before a level.")
    auth_env: str | None = Field(
        None, description="A variable whose value the benchmark sends as `Authorization: Bearer` (--api-key)."
    )
    twin: tuple[str, str, int] | None = Field(None, description="(model profile, hardware, GPUs) of the twin served.")


class SGLangEngine(ServerEngine):
    """SGLang, launched as a process (`python -m sglang.launch_server` or `sglang serve`), audited and benchmarked."""

    catalog_engine = "sglang"
    ready_line = READY_LINE
    gauges = GAUGES
    failure_rules = FAILURE_RULES
    parallel_dests: ClassVar[Mapping[str, str]] = {"tp": "tp_size", "pp": "pp_size", "ep": "ep_size", "dp": "dp_size"}
    dp_within_tp_dest: ClassVar[str | None] = "enable_dp_attention"  # DP attention: the DP ranks share the TP GPUs
    Options: ClassVar[type[EngineOptions] | None] = SGLangOptions

    def __init__(self, **options: object) -> None:
        """Options (SGLangOptions): `launcher` launch_server (default) or serve; `python` the interpreter that has
        SGLang; `prefix` an argv put in front (`docker exec NAME`, `ssh host`); `command` the whole launch command;
        `env` added to the server's environment (behind `docker exec`, pass variables with the prefix's own -e);
        `host`/`port` where it listens unless the flags say; `force` launch even when the audit finds flags SGLang
        refuses; `auth_env` the name of an environment variable whose value the benchmark sends as `Authorization:
        Bearer` (nothing is sent otherwise, and pivot's own model keys are never passed to the server)."""
        o = self.setup(options)
        assert isinstance(o, SGLangOptions)
        self._apply(o)

    def _apply(self, o: SGLangOptions) -> None:
        self.name, self.version, self.launcher = o.name, o.version, o.launcher
        self.prefix = argv_option(o.prefix)
        self.python = o.python or ("python3" if self.prefix else sys.executable)
        self.command = argv_option(o.command) or None
        self.env = dict(o.env)
        self.host, self.port, self.cwd = o.host, o.port, o.cwd
        self.force, self.require_model = o.force, o.require_model
        self.ready_timeout_s, self.stop_grace_s, self.health_path = o.ready_timeout_s, o.stop_grace_s, o.health_path
        self.source, self.time_scale, self.warmup_pause_s = o.source, o.time_scale, o.warmup_pause_s
        self.auth_env = o.auth_env
        self.twin = o.twin  # (model profile, hardware, GPUs) of the twin this engine serves (sim-http), else None

    def with_seed(self, seed: int) -> SGLangEngine:
        """A copy whose launch command draws its noise from `seed`, when the command takes one (the twin's
        `sim serve`: the agent seeds each experiment on its own); a real SGLang has nothing to seed."""
        if self.command is None or "--seed" not in self.command:
            return self
        out = copy.copy(self)
        command = list(self.command)
        command[command.index("--seed") + 1] = str(seed)
        out.command = command
        return out

    def launch_command(self) -> list[str]:
        """What runs before the flags: prefix, then the command (or the launcher)."""
        if self.command is not None:
            base = list(self.command)
        elif self.launcher == "serve":
            base = ["sglang", "serve"]
        else:
            base = [self.python, "-m", "sglang.launch_server"]
        return [*self.prefix, *base]

    def audit(self, config: m.ServerConfig, *, version: str | None = None, source: Path | None = None) -> FlagAudit:
        """SGLang's own parser when the installed SGLang is `version`, else the shipped catalog; no-ops from a scan
        of SGLang's source (`source`, else the installed package) or the catalog's (catalog/installed.py)."""
        from tools.engines.catalog.installed import audit_flags

        return audit_flags(config, version=version, sglang_source=source)

    def not_modelled(self, config: m.ServerConfig) -> list[str]:
        """Flags whose effect this engine does not reproduce: none for SGLang itself; for `sim-http` (the twin
        behind SGLang's interface) the flags the twin does not model."""
        if self.source != "simulated":
            return []
        from tools.engines.sim.twin import not_modelled_flags

        return not_modelled_flags(config, self.version)

    def predictor(self, target: m.Target) -> Predictor | None:
        """The SGLang twin: for `sim-http`, its own profiles; for SGLang itself, the target's model and hardware
        profiles when the plan names them (the twin is calibrated on SGLang); None without profiles."""
        from tools.engines.sim.predictor import twin_predictor

        if self.twin is not None:
            return twin_predictor(*self.twin)
        return twin_predictor(target.model_profile, target.hardware, target.gpus)

    def _address(self, config: m.ServerConfig) -> tuple[str, int, list[str]]:
        """Where the server will listen, and the flags to add so it does (only those the config does not set)."""
        host = port = None
        for flag in config.flags:
            spec = self.catalog.resolve(flag.name)
            dest = spec.dest if isinstance(spec, FlagSpec) else None
            if dest == "host" and isinstance(flag.value, str):
                host = flag.value
            elif dest == "port" and isinstance(flag.value, str):
                try:
                    port = int(flag.value)
                except ValueError:
                    port = None
        extra: list[str] = []
        if host is None:
            host = self.host
            extra += ["--host", host]
        if port is None:
            port = self.port if self.port is not None else free_port(host)
            extra += ["--port", str(port)]
        return host, port, extra

    def argv(self, config: m.ServerConfig) -> tuple[list[str], str, int]:
        """The full command line for `config` (with --host/--port added when missing), its host and its port."""
        host, port, extra = self._address(config)
        return [*self.launch_command(), *config.argv(), *extra], host, port

    def deployment_options(self) -> dict[str, object]:
        return {
            "source": self.source,
            "backend": "sglang",
            "warmup_pause_s": self.warmup_pause_s,
            "time_scale": self.time_scale,
            "auth_env": self.auth_env,
        }
