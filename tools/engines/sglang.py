"""The `sglang` engine (SGLang as a real process) and `sim-http` (the same engine launching the twin's server).

    engine = SGLangEngine()                                   # python -m sglang.launch_server ... --host 127.0.0.1 --port P
    engine = SGLangEngine(launcher="serve")                   # sglang serve ...
    engine = SGLangEngine(prefix=["docker", "exec", "sgl"])   # docker exec sgl python3 -m sglang.launch_server ...
    engine = sim_http_engine(time_scale=50)                   # python -m agent.cli sim serve --time-scale 50 -- ...

Flags are audited against SGLang's catalog before launch: flags SGLang would refuse (unknown, ambiguous,
invalid) stop the launch with FlagsRefused unless `force`, and then it is SGLang's own refusal that is
classified from its log.
"""

from __future__ import annotations

import copy
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Literal

from agent import models as m
from agent.contracts import FlagAudit, LedgerLink, Predictor
from agent.errors import PivotError
from tools.engines.base import ServerEngine
from tools.engines.catalog import CatalogError, FlagSpec
from tools.engines.failures import ARGPARSE_RULES, PORT_RULE, RUNTIME_RULES, FailureRule, not_installed_rule
from tools.engines.http import HttpDeployment
from tools.engines.process import (
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_STOP_GRACE_S,
    FlagsRefused,
    free_port,
)

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


def argv_option(value: str | Sequence[str] | None) -> list[str]:
    """An argv list from an option given as a list, or as a string split like a shell would (never run by one)."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


class SGLangEngine(ServerEngine):
    """SGLang, launched as a process (`python -m sglang.launch_server` or `sglang serve`), audited and benchmarked."""

    catalog_engine = "sglang"
    ready_line = READY_LINE
    gauges = GAUGES
    failure_rules = FAILURE_RULES
    parallel_dests: ClassVar[Mapping[str, str]] = {"tp": "tp_size", "pp": "pp_size", "ep": "ep_size", "dp": "dp_size"}
    dp_within_tp_dest: ClassVar[str | None] = "enable_dp_attention"  # DP attention: the DP ranks share the TP GPUs

    def __init__(
        self,
        *,
        name: str = "sglang",
        version: str = VERSION,
        launcher: Launcher = "launch_server",
        python: str | None = None,
        prefix: str | Sequence[str] | None = None,
        command: str | Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        host: str = DEFAULT_HOST,
        port: int | None = None,
        cwd: str | None = None,
        force: bool = False,
        require_model: bool = True,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        health_path: str = "/health",
        source: m.Source = "measured",
        time_scale: float | None = None,
        warmup_pause_s: float = 1.0,
        auth_env: str | None = None,
        twin: tuple[str, str, int] | None = None,
    ) -> None:
        """Options: `launcher` launch_server (default) or serve; `python` the interpreter that has SGLang (default
        this one, or python3 behind a prefix); `prefix` an argv put in front (`docker exec NAME`, `ssh host`,
        `env -u X`); `command` the whole launch command instead of launcher and python; `env` added to the
        server's environment (behind `docker exec`, pass variables with the prefix's own -e); `host`/`port`
        where it listens unless the flags say (default 127.0.0.1 and a free port); `force` launch even when the
        audit finds flags SGLang refuses; `stop_grace_s` SIGTERM to SIGKILL; `auth_env` the name of an environment
        variable whose value the benchmark sends as `Authorization: Bearer` (a server started with --api-key;
        nothing is sent otherwise, and pivot's own model keys are never passed to the server)."""
        if launcher not in ("launch_server", "serve"):
            raise PivotError(f"unknown SGLang launcher {launcher!r}", hint="use launch_server or serve")
        self.name, self.version, self.launcher = name, version, launcher
        self.prefix = argv_option(prefix)
        self.python = python or ("python3" if self.prefix else sys.executable)
        self.command = argv_option(command) or None
        self.env = dict(env or {})
        self.host, self.port, self.cwd = host, port, cwd
        self.force, self.require_model = force, require_model
        self.ready_timeout_s, self.stop_grace_s, self.health_path = ready_timeout_s, stop_grace_s, health_path
        self.source, self.time_scale, self.warmup_pause_s = source, time_scale, warmup_pause_s
        self.auth_env = auth_env
        self.twin = twin  # (model profile, hardware, GPUs) of the twin this engine serves (sim-http), else None

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

    def launch(
        self,
        config: m.ServerConfig,
        log_path: Path,
        *,
        ledger: LedgerLink | None = None,
        force: bool = False,
    ) -> HttpDeployment:
        """Audit `config`, then start the server logging to `log_path` (recorded in `ledger`); returns before ready.

        Raises FlagsRefused when the audit finds flags SGLang would refuse, unless `force` (or the engine's own).
        """
        force = force or self.force
        issues = self.validate(config)
        blocking = [issue for issue in issues if issue.blocking]
        if blocking and not force:
            raise FlagsRefused(self.name, blocking)
        if self.require_model and not force:
            try:
                self.catalog.parse(config.argv(), require_model=True)
            except CatalogError as e:
                raise PivotError(
                    f"SGLang would refuse this command line: {e.message}", hint="give the model: --model-path PATH"
                ) from e
        return self.start(
            config,
            log_path,
            ledger,
            issues,
            source=self.source,
            backend="sglang",
            warmup_pause_s=self.warmup_pause_s,
            time_scale=self.time_scale,
            auth_env=self.auth_env,
        )


def sim_http_engine(
    *,
    model_profile: str = "glm-5-nvfp4",
    hardware: str = "rtx-pro-6000-blackwell",
    gpus: int = 8,
    time_scale: float = 1.0,
    startup_s: float = 2.0,
    noise: float = 0.0,
    seed: int = 0,
    python: str | None = None,
    **options: object,
) -> SGLangEngine:
    """The digital twin served over HTTP as a real process (`pivot sim serve`), driven exactly as SGLang is.

    It is the sglang engine with its launch command set to `python -m agent.cli sim serve` and the twin's
    options (profiles, GPUs, `time_scale` simulated seconds per wall second, `startup_s` of 503s before ready).
    Every number it gives is simulated; latencies and throughputs are on the wall clock, `time_scale` times faster.
    """
    if time_scale <= 0:
        raise PivotError("time_scale must be > 0")
    command = [
        python or sys.executable, "-m", "agent.cli", "sim", "serve",
        "--model-profile", model_profile, "--hardware", hardware, "--gpus", str(gpus),
        "--time-scale", repr(float(time_scale)), "--startup-s", repr(float(startup_s)),
        "--noise", repr(float(noise)), "--seed", str(seed), "--",
    ]  # fmt: skip
    settings: dict[str, object] = {
        "name": "sim-http",
        "command": command,
        "require_model": False,
        "twin": (model_profile, hardware, int(gpus)),
        "source": "simulated",
        "time_scale": float(time_scale),
        "warmup_pause_s": 1.0 / float(time_scale),
        "stop_grace_s": 10.0,
        "ready_timeout_s": float(startup_s) + 120.0,
        **options,
    }
    return SGLangEngine(**settings)  # type: ignore[arg-type]
