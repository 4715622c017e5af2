"""The engine contract: the Engine and Deployment protocols, and what they speak in (where a server is recorded,
how a configuration splits the model, why a server failed, an audit's rows); loading an engine plugin by name.

Everything a caller (a tool, the CLI, the TUI, the analysis, the search) may use of an engine or a deployment is a
member of the two protocols, typed and documented; callers never probe attributes or inspect signatures. Engines
usually subclass tools/engines/base.py:BaseEngine, which gives every optional member a sound default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, get_args, get_origin, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from agent import models as m
from agent import plugins
from agent.contracts.predictor import Predictor
from agent.errors import PivotError

if TYPE_CHECKING:
    from agent.paths import Paths
    from agent.store import Store  # only a type here: a served twin (`sim serve`) never opens a ledger

ProgressCallback = Callable[[str], None]


@dataclass(frozen=True)
class LedgerLink:
    """Where a launched server is recorded: the ledger, the session, the experiment it serves, the home's paths."""

    store: Store
    session_id: str
    experiment_id: int | None = None
    paths: Paths | None = None

    def path(self, path: Path) -> str:
        return self.paths.relative(path) if self.paths is not None else str(path)


@dataclass(frozen=True)
class Parallelism:
    """How a configuration splits the model over GPUs, as the engine reads its own flags: tensor, pipeline, expert
    and data parallel degrees (1 where the configuration does not split that way)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    dp_within_tp: bool = False  # data-parallel ranks share the tensor-parallel GPUs (SGLang's DP attention)

    @property
    def gpus(self) -> int:
        """The GPUs the configuration occupies: TP x PP, times DP unless the DP ranks live inside the TP group."""
        return self.tp * self.pp * (1 if self.dp_within_tp else self.dp)


@dataclass(frozen=True)
class Diagnosis:
    """Why a server failed: the failure class (oom, cuda-error, unrecognized-argument, ..., unknown) and the log
    line that shows it (None when nothing matched)."""

    failure: str
    line: str | None = None

    def __str__(self) -> str:
        return self.failure if self.line is None else f"{self.failure}: {self.line}"


@dataclass
class FlagAudit:
    """An audit's rows and where its verdicts came from (what `pivot audit-flags` prints)."""

    rows: list[m.FlagIssue]
    parser: str  # which parser judged the flags, e.g. "shipped catalog of vLLM 0.33.0"
    noops: str  # where the no-op verdicts came from
    version: str  # the engine version the flags were judged as
    notes: list[str] = field(default_factory=list)  # fallbacks and mismatches worth a warning

    @property
    def blocking(self) -> bool:
        """True when some row would stop a launch (unknown, ambiguous or invalid)."""
        return any(r.blocking for r in self.rows)


class EngineOptions(BaseModel):
    """The options an engine takes (`-o key=value` on the command line, a session's engine options), as a typed
    model the engine declares (`Options` on its class, subclassing this one): load_engine checks them against it, so
    a misspelled option or a value of the wrong type is one line naming the option, never a traceback at launch.
    Unknown options are refused. `pivot tools` lists each engine's options (with `--json`, their types, defaults and
    descriptions)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


def options_error(engine: str, error: ValidationError, model: type[BaseModel] | None = None) -> PivotError:
    """One line for options an engine refused (the first problem, and how many more), with the options it takes."""
    problems = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "options"
        if item["type"] == "extra_forbidden":
            problems.append(f"no option {key!r}")
        else:
            problems.append(f"option {key}={item.get('input')!r}: {item['msg']}")
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    hint = None
    if model is not None:
        hint = f"{engine}'s options: " + ", ".join(
            f"{name} ({_type_name(f.annotation)})" for name, f in model.model_fields.items()
        )
    return PivotError(f"engine {engine!r}: {problems[0] if problems else error}{more}", hint=hint)


def _type_name(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return "|".join(str(a) for a in get_args(annotation))
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "").replace("collections.abc.", "")


LevelCallback = Callable[[Any], None]  # receives tools.loadgen.LevelProgress (the core cannot name tools' types)


@runtime_checkable
class Deployment(Protocol):
    """A running (or starting) server: something that can be waited for, benchmarked, read and stopped."""

    base_url: str  # http://host:port, or sim://... for a server that runs in this process
    argv: list[str] | None  # the command line it was launched with; None when nothing was launched
    log_path: Path | None  # where its log is written
    level_telemetry: list[m.Telemetry]  # per level of the last benchmark(), in order

    @property
    def failure(self) -> str | None:
        """The classified reason the server failed (oom, cuda-error, ...), once it has; None while it is healthy."""
        ...

    def wait_ready(self, timeout_s: float, on_progress: ProgressCallback | None = None) -> None:
        """Return once the server answers; raise PivotError with the classified reason if it dies or times out."""
        ...

    def alive(self) -> bool:
        """Whether the server process is still running."""
        ...

    def log_tail(self, n: int = 50) -> list[str]:
        """The last `n` lines of the server's log."""
        ...

    def benchmark(
        self,
        spec: m.BenchSpec,
        on_progress: ProgressCallback | None = None,
        *,
        on_level: LevelCallback | None = None,
        output_file: Path | None = None,
    ) -> m.BenchResult:
        """Run the sweep `spec` against this server; failed requests are counted, never raised.

        `on_progress` gets a line of text per event, `on_level` a tools.loadgen.LevelProgress (progress bars);
        `output_file` gets one JSON line per level with bench_serving's keys. Ctrl-C returns the finished levels
        with interrupted=True. Each level's telemetry is in `level_telemetry` afterwards.
        """
        ...

    def telemetry(self) -> m.Telemetry:
        """GPU and server readings now (source says measured, simulated or unavailable)."""
        ...

    def metrics(self) -> dict[str, Any]:
        """The server's own gauges now, by pivot's names (num_running_reqs, num_queue_reqs, token_usage, ...) under
        `metrics`, with `source`; raises PivotError when the server publishes none."""
        ...

    def profile(self, out_dir: Path, spec: m.BenchSpec | None = None) -> m.ProfileSummary:
        """GPU kernel time by category under a short load (`spec`, default a small one); traces go to `out_dir`."""
        ...

    def stop(self) -> None:
        """Stop the server and everything it started; safe to call twice."""
        ...


@runtime_checkable
class Engine(Protocol):
    """A serving engine: it owns what pivot knows of it (flag catalog and audit, metric names, failure rules,
    parallelism) and launches deployments."""

    name: str
    ready_timeout_s: float  # how long a launch may take to become ready before it counts as failed
    gauges: Mapping[str, str]  # pivot's gauge name -> this engine's Prometheus metric name
    # The options the engine's factory takes, as a model load_engine checks them against (None: not declared, the
    # options are passed as given and the factory checks them itself).
    Options: ClassVar[type[EngineOptions] | None]

    def validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        """One row per flag as typed: ok, unknown, ambiguous, deprecated, invalid or noop, with a message."""
        ...

    def audit(self, config: m.ServerConfig, *, version: str | None = None, source: Path | None = None) -> FlagAudit:
        """The full audit for `pivot audit-flags`: rows as validate() gives them, judged as `version` (default: the
        engine's), no-ops from a scan of the engine's source at `source` where the engine can scan one, and where
        each verdict came from."""
        ...

    def parallelism(self, config: m.ServerConfig) -> Parallelism:
        """The TP, PP, EP and DP degrees `config` asks for, as this engine reads its flags (defaults resolved)."""
        ...

    def not_modelled(self, config: m.ServerConfig) -> list[str]:
        """The flags of `config` this engine accepts but does not model (a simulation that would not show their
        effect); empty for a real engine, which runs them all."""
        ...

    def diagnose(self, lines: Sequence[str]) -> Diagnosis:
        """Why a server of this engine failed, from its log's tail (this engine's failure rules)."""
        ...

    def with_seed(self, seed: int) -> Engine:
        """The engine drawing its noise from `seed` (simulated engines); a real engine returns itself."""
        ...

    @property
    def model_flags(self) -> Sequence[str]:
        """The flags that name the served model in this engine's spelling, the one pivot adds first (SGLang:
        `--model-path`; vLLM: `--model`); a configuration that sets any of them names its own model."""
        ...

    def predictor(self, target: m.Target) -> Predictor | None:
        """What predicts this engine's numbers for `target` without a launch (the SGLang twin for SGLang and the
        simulated engines), or None: the search then measures instead of predicting."""
        ...

    def launch(
        self,
        config: m.ServerConfig,
        log_path: Path,
        *,
        ledger: LedgerLink | None = None,
        force: bool = False,
        issues: Sequence[m.FlagIssue] | None = None,
    ) -> Deployment:
        """Start a server with `config`, logging to `log_path` and recorded in `ledger`; returns before it is ready.

        The audit gate: flags the engine would refuse stop the launch (FlagsRefused) unless `force`. `issues` are
        the rows of validate(config) when the caller has them already (it audited to record them), so a launch is
        audited once; None: the launch audits. BaseEngine.launch is the gate every engine inherits.
        """
        ...


_ENGINE_MEMBERS = ("name", "ready_timeout_s", "gauges", "Options", "validate", "audit", "parallelism",
                   "not_modelled", "diagnose", "with_seed", "model_flags", "predictor", "launch")  # fmt: skip


def engine_names() -> list[str]:
    """The engines installed as `pivot.engines` plugins, by name (nothing is imported)."""
    return sorted({p.name for p in plugins.available(plugins.ENGINES_GROUP)})


def declared_options(factory: Any) -> type[EngineOptions] | None:
    """The options model an engine factory declares (`Options`, an EngineOptions subclass), or None."""
    model = getattr(factory, "Options", None)  # contract: a factory's declared options
    return model if isinstance(model, type) and issubclass(model, EngineOptions) else None


def load_engine(name: str, **options: Any) -> Engine:
    """Build the engine registered under `name` in the `pivot.engines` entry points, its options checked against
    the model it declares (one line per refusal: the option, the value, what it should be; the options it takes)."""
    factory = plugins.load(plugins.ENGINES_GROUP, name)
    model = declared_options(factory)
    if model is not None:
        try:
            checked = model.model_validate(options)
        except ValidationError as e:
            raise options_error(name, e, model) from None
        options = {key: getattr(checked, key) for key in checked.model_fields_set}
    try:
        engine = factory(**options)
    except PivotError:
        raise
    except ValidationError as e:
        raise options_error(name, e, model) from None
    except Exception as e:
        raise PivotError(f"engine {name!r} could not be set up: {type(e).__name__}: {e}") from e
    if not isinstance(engine, Engine):
        missing = sorted(n for n in _ENGINE_MEMBERS if not hasattr(engine, n))  # contract: what a plugin lacks
        raise PivotError(
            f"engine plugin {name!r} did not return an Engine (got {type(engine).__name__}"
            + (f", which lacks {', '.join(missing)})" if missing else ")"),
            hint="subclass tools.engines.base.BaseEngine, which gives every optional member a default",
        )
    return engine
