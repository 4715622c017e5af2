"""Every extension point of pivot in one place: what a plugin implements and what callers may use of it.

- **Engine** and **Deployment** (`engine.py`): a serving stack pivot audits, launches, benchmarks, reads and stops;
  subclass `tools.engines.base.BaseEngine` (or `CatalogEngine`, `ServerEngine`) for the defaults and the audit gate.
  Registered under the `pivot.engines` entry points; `load_engine(name, **options)` checks the options against the
  engine's declared `Options` (an `EngineOptions` model), builds it and checks it against the protocol.
- **Predictor** (`predictor.py`): an engine's capability to foresee a configuration's numbers without a launch
  (`Engine.predictor`); None where the engine has none, and the search measures instead.
- **Executor** (`executor.py`): where an experiment's runs happen (this process, a Ray cluster): it takes
  `ExperimentTask`s and yields `TaskOutcome`s; the driver alone writes the ledger.
- **Tool plugin**: a pydantic-ai toolset of typed functions `(ctx: RunContext[Session], ...) -> Model` registered
  under the `pivot.tools` entry points (`agent.session.Session` is what every tool receives).

This package is part of the core: it imports only the models, the ledger, the plugin registry and the errors.
"""

from agent.contracts.engine import (
    Deployment,
    Diagnosis,
    Engine,
    EngineOptions,
    FlagAudit,
    LedgerLink,
    LevelCallback,
    Parallelism,
    ProgressCallback,
    declared_options,
    engine_names,
    load_engine,
    options_error,
)
from agent.contracts.executor import (
    EventCallback,
    Executor,
    ExperimentTask,
    OutcomeStatus,
    TaskEvent,
    TaskOutcome,
)
from agent.contracts.predictor import Prediction, Predictor
from agent.plugins import ENGINES_GROUP, TOOLS_GROUP

__all__ = [
    "ENGINES_GROUP",
    "TOOLS_GROUP",
    "Deployment",
    "Diagnosis",
    "Engine",
    "EngineOptions",
    "EventCallback",
    "Executor",
    "ExperimentTask",
    "FlagAudit",
    "LedgerLink",
    "LevelCallback",
    "OutcomeStatus",
    "Parallelism",
    "Prediction",
    "Predictor",
    "ProgressCallback",
    "TaskEvent",
    "TaskOutcome",
    "declared_options",
    "engine_names",
    "load_engine",
    "options_error",
]
