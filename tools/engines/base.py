"""What most engines share: defaults for the Engine protocol's members, and an engine whose flags have a catalog.

    class MyEngine(BaseEngine):               # a plugin engine: name, validate and start are all it must write
        name = "mine"
        def validate(self, config): ...
        def start(self, config, log_path, *, ledger, issues): ...   # launch() audits first, then calls it

    class VLLMEngine(CatalogEngine):          # flags audited against a shipped catalog, parallelism read from it
        catalog_engine, version = "vllm", "0.33.0"
        parallel_dests = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size"}

The protocol itself (agent/contracts: Engine, Deployment) is the contract; these classes only fill it in.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import ValidationError

from agent import models as m
from agent.contracts import (
    Deployment,
    Diagnosis,
    Engine,
    EngineOptions,
    FlagAudit,
    LedgerLink,
    Parallelism,
    Predictor,
    options_error,
)
from agent.errors import PivotError
from tools.engines.catalog import ArgTypes, Catalog, CatalogError, FlagSpec, audit, load_catalog
from tools.engines.failures import COMMON_RULES, FailureRule, diagnose
from tools.engines.process import DEFAULT_READY_TIMEOUT_S, FlagsRefused

if TYPE_CHECKING:
    from tools.engines.http import HttpDeployment


def argv_option(value: str | Sequence[str] | None) -> list[str]:
    """An argv list from an option given as a list, or as a string split like a shell would (never run by one)."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


class BaseEngine:
    """Defaults for every member of the Engine protocol but `name`, `validate` and `start`; `launch` is the audit
    gate every engine shares (subclasses write `start`, never their own gate)."""

    name: str = "engine"
    version: str | None = None
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    ready_line: str | None = None  # a log line the server prints once it serves (None: /health alone says ready)
    gauges: Mapping[str, str] = {}
    failure_rules: Sequence[FailureRule] = COMMON_RULES
    # The engine's options as a model (an EngineOptions subclass): load_engine checks `-o key=value` against it and
    # `self.options` holds them once `setup(options)` ran. None: options are the engine's own business.
    Options: ClassVar[type[EngineOptions] | None] = None
    force: bool = False  # launch even when the audit finds flags the engine refuses (an engine option)

    def setup(self, options: Mapping[str, object]) -> EngineOptions:
        """Check `options` against `Options` (one clear line when they do not fit) and keep them as `self.options`."""
        if self.Options is None:
            raise TypeError(f"{type(self).__name__} declares no Options")
        try:
            self.options = self.Options.model_validate(dict(options))
        except ValidationError as e:
            raise options_error(self.name, e, self.Options) from None
        return self.options

    def validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        raise NotImplementedError

    def launch(
        self,
        config: m.ServerConfig,
        log_path: Path,
        *,
        ledger: LedgerLink | None = None,
        force: bool = False,
        issues: Sequence[m.FlagIssue] | None = None,
    ) -> Deployment:
        """The audit gate, then `start`: flags the engine would refuse (`issues`, else validate(config)) and a
        command line it would refuse as a whole (`refuse_command`) stop the launch unless `force` (or the engine's
        own `force`); the rows go with the deployment, so the launch is audited once."""
        rows = self.validate(config) if issues is None else list(issues)
        if not (force or self.force):
            blocking = [row for row in rows if row.blocking]
            if blocking:
                raise FlagsRefused(self.name, blocking)
            self.refuse_command(config)
        return self.start(config, log_path, ledger=ledger, issues=rows)

    def refuse_command(self, config: m.ServerConfig) -> None:
        """Raise PivotError when the engine would refuse `config` as a whole (every flag fine on its own, e.g. no
        model named); the default refuses nothing. Skipped with `force`."""

    def start(
        self, config: m.ServerConfig, log_path: Path, *, ledger: LedgerLink | None, issues: list[m.FlagIssue]
    ) -> Deployment:
        """Start the server for `config`, already audited into `issues`; returns before it is ready."""
        raise NotImplementedError

    def audit(self, config: m.ServerConfig, *, version: str | None = None, source: Path | None = None) -> FlagAudit:
        """validate()'s rows; an engine without a catalog judges no version and scans no source."""
        return FlagAudit(
            rows=self.validate(config),
            parser=f"the {self.name} engine's validate()",
            noops="none known",
            version=self.version or "unknown",
        )

    def parallelism(self, config: m.ServerConfig) -> Parallelism:
        """One GPU of each kind unless the engine knows how its flags split the model."""
        return Parallelism()

    def not_modelled(self, config: m.ServerConfig) -> list[str]:
        """A real engine runs every flag it accepts: nothing is left unmodelled."""
        return []

    def diagnose(self, lines: Sequence[str]) -> Diagnosis:
        return diagnose(lines, self.failure_rules)

    def with_seed(self, seed: int) -> Engine:
        """A real engine has no noise to seed: itself."""
        return self  # type: ignore[return-value]

    @property
    def model_flags(self) -> Sequence[str]:
        """The flags naming the served model (SGLang's spelling unless the engine says otherwise)."""
        return self.model_flag_names

    model_flag_names: Sequence[str] = ("--model-path", "--model")  # SGLang's spellings, the one pivot adds first

    def predictor(self, target: m.Target) -> Predictor | None:
        """No predictor: pivot has no calibrated model of this engine, so the search measures instead."""
        return None


def _degree(value: object) -> int | None:
    try:
        return max(int(value), 1)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


class CatalogEngine(BaseEngine):
    """An engine whose command line is a shipped catalog (`<engine>-<version>.json` in `catalog_package`): the
    audit, the flags' meaning (dests), the model flag and the parallel degrees come from it.

    A plugin in its own package ships its catalog as package data of its own package and names it here, with the
    argparse types and actions its catalog uses (`argtypes`); pivot's catalogs and types are not touched."""

    catalog_engine: ClassVar[str] = "sglang"  # the catalog's engine name
    # The package whose data files hold the catalog (a plugin names its own); None: pivot's (tools.engines.catalog).
    catalog_package: ClassVar[str | None] = None
    # The types and actions the catalog names; None: pivot's own for its built-in catalogs (sglang, vllm), else
    # argparse's basics (str, int, float, store, store_true, ...).
    argtypes: ClassVar[ArgTypes | None] = None
    require_model: bool = True  # a launch's command line must name the model (the catalog's `model_dest`)
    # Parallelism field -> the dest of the flag that sets it in this engine's parser (a missing key: always 1).
    parallel_dests: ClassVar[Mapping[str, str]] = {}
    dp_within_tp_dest: ClassVar[str | None] = None  # the dest of a flag that puts the DP ranks inside the TP GPUs
    _catalog: Catalog | None = None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = self.load_catalog(self.version or "")
        return self._catalog

    def load_catalog(self, version: str) -> Catalog:
        """This engine's catalog of `version`, from its own package, parsed with its own types."""
        return load_catalog(self.catalog_engine, version, package=self.catalog_package, argtypes=self.argtypes)

    def validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        """One row per flag as typed, from the engine's own parser for this version (tools/engines/catalog)."""
        return audit(self.catalog, config)

    def audit(self, config: m.ServerConfig, *, version: str | None = None, source: Path | None = None) -> FlagAudit:
        """The rows of the shipped catalog of `version` (default the engine's), with its recorded no-ops."""
        catalog = self.load_catalog(version) if version else self.catalog
        notes = []
        if source is not None:
            notes.append(f"no source scan for {catalog.name}: the no-ops are the ones recorded in its catalog")
        return FlagAudit(
            rows=audit(catalog, config),
            parser=f"shipped catalog of {catalog.title}",
            noops=f"the catalog's recorded no-ops ({len(catalog.noop)})" if catalog.noop else "none recorded",
            version=catalog.version,
            notes=notes,
        )

    def refuse_command(self, config: m.ServerConfig) -> None:
        """The engine refuses a command line that names no model (the catalog's `model_dest`: SGLang's
        `--model-path`), unless `require_model` is off (the twin, which needs no model). Read from the flags' names,
        not a second parse: the audit has judged every flag already."""
        if not self.require_model:
            return
        model_dest = self.catalog.model_dest
        if not any(
            isinstance(spec, FlagSpec) and spec.required for spec in self.catalog.flags if spec.dest == model_dest
        ):
            return  # the engine's parser does not require one (vLLM: a positional model, optional)
        named = {spec.dest for flag in config.flags if isinstance(spec := self.catalog.resolve(flag.name), FlagSpec)}
        if model_dest not in named:
            flags = ", ".join(self.model_flags) or model_dest
            raise PivotError(
                f"{self.catalog.title} would refuse this command line: it names no model ({flags})",
                hint=f"give the model: {self.model_flags[0]} PATH" if self.model_flags else None,
            )

    def values(self, config: m.ServerConfig) -> dict[str, object]:
        """dest -> value as the engine parses `config` (defaults filled in); flags it refuses are left out."""
        tokens = [t for flag in config.flags if isinstance(self.catalog.resolve(flag.name), FlagSpec)
                  for t in flag.argv()]  # fmt: skip
        try:
            return self.catalog.parse(tokens, require_model=False)
        except CatalogError:
            values = self.catalog.defaults()
            for flag in config.flags:  # one at a time: keep what parses
                try:
                    parsed = self.catalog.parse(flag.argv(), require_model=False)
                except CatalogError:
                    continue
                spec = self.catalog.resolve(flag.name)
                if isinstance(spec, FlagSpec):
                    values[spec.dest] = parsed[spec.dest]
            return values

    def parallelism(self, config: m.ServerConfig) -> Parallelism:
        """The degrees the catalog's flags set (`parallel_dests`), 1 where unset or not a number."""
        values = self.values(config)
        found = {key: _degree(values.get(dest)) or 1 for key, dest in self.parallel_dests.items()}
        within = bool(self.dp_within_tp_dest and values.get(self.dp_within_tp_dest))
        return Parallelism(**found, dp_within_tp=within)


class ServerEngine(CatalogEngine):
    """A catalog engine that launches its server as a process on this host (or behind a launch prefix) and speaks to
    it over HTTP: SGLang and vLLM. `start` is their launch() once the flags are audited."""

    env: dict[str, str]
    cwd: Path | str | None
    prefix: list[str]
    stop_grace_s: float
    health_path: str

    def argv(self, config: m.ServerConfig) -> tuple[list[str], str, int]:
        """The command line for `config`, and the host and port the server will listen on."""
        raise NotImplementedError

    def launch_env(self, config: m.ServerConfig) -> dict[str, str]:
        """Environment the engine itself needs for `config` (below the engine's `env` option and the config's)."""
        return {}

    def served_model(self, config: m.ServerConfig) -> str | None:
        """The model `config` serves, as its flags name it (SGLang's --model-path, vLLM's --model or model tag)."""
        values = self.values(config)
        for dest in ("model_path", "model", "model_tag"):
            if isinstance(values.get(dest), str) and values[dest]:
                return str(values[dest])
        return None

    def vocab_size(self, config: m.ServerConfig) -> int | None:
        """The served model's vocabulary, from its files when they are on this host (None otherwise): what the
        benchmark's random token ids stay below unless the workload says."""
        from tools.profiles.generated import model_vocab_size

        model = self.served_model(config)
        return model_vocab_size(model) if model and not self.prefix else None

    def deployment_options(self) -> dict[str, object]:
        """The engine's own HttpDeployment options (backend, endpoint, model, source, ...); none by default."""
        return {}

    def start(
        self, config: m.ServerConfig, log_path: Path, *, ledger: LedgerLink | None, issues: list[m.FlagIssue]
    ) -> HttpDeployment:
        """Start the server for `config` (audited already into `issues`) as a ManagedServer and wrap it; behind a
        launch prefix this host cannot see the socket's owner."""
        from tools.engines.http import start_deployment
        from tools.engines.process import url_for

        argv, host, port = self.argv(config)
        base_url = url_for(host, port)
        return start_deployment(
            argv,
            log_path=log_path,
            base_url=base_url,
            engine=self.name,
            health_url=base_url + self.health_path,
            host=host,
            env={**self.launch_env(config), **self.env, **config.env},
            cwd=self.cwd,
            ready_line=self.ready_line,
            stop_grace_s=self.stop_grace_s,
            owner_check=not self.prefix,
            ledger=ledger,
            failure_rules=self.failure_rules,
            gauges=self.gauges,
            audit=issues,
            power_limit_w=config.gpu_power_limit_w,
            gpu_count=self.parallelism(config).gpus,
            vocab_size=self.vocab_size(config),
            **self.deployment_options(),
        )
