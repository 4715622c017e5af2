"""The shared vocabulary of pivot: every module, engine, tool and report speaks these models.

Names follow the field: SGLang's flags keep SGLang's spelling, benchmark results keep
`sglang.bench_serving`'s JSON keys, and numbers of our own carry their unit in their name.

The models live in modules by concern: base (the base model, utcnow), config (flags, ServerConfig), bench
(BenchSpec, results, telemetry, profiles), audit (FlagIssue), plans (Target, PlanItem, Plan), ledger (Todo,
Experiment, Document, Pivot, ServerProcess, Session, Event) and findings (Finding, MicrobenchResult, ModelUsage);
every name is importable from here (`from agent import models as m; m.ServerConfig`).
"""

from agent.models.audit import BLOCKING_FLAG_STATUSES, FlagIssue, FlagStatus
from agent.models.base import _Model, utcnow
from agent.models.bench import (
    BenchLevel,
    BenchResult,
    BenchSpec,
    Endpoint,
    GpuTelemetry,
    Placement,
    ProfileCategory,
    ProfileKernel,
    ProfileSummary,
    Source,
    Telemetry,
)
from agent.models.config import (
    _FLAG_NAME,
    SWITCH_ON,
    ConfigDiff,
    Flag,
    FlagChange,
    ServerConfig,
    _is_flag_token,
    _render_value,
)
from agent.models.findings import (
    BOTTLENECK_TITLES,
    BottleneckCategory,
    Finding,
    FindingKind,
    MicrobenchResult,
    ModelUsage,
    parse_levels,
)
from agent.models.investigations import Investigation, InvestigationKind, InvestigationStatus
from agent.models.ledger import (
    Document,
    Event,
    Experiment,
    ExperimentKind,
    ExperimentStatus,
    Pivot,
    PlanChange,
    ServerProcess,
    ServerStatus,
    Session,
    SessionSettings,
    SessionStatus,
    SessionSummary,
    Todo,
    TodoPriority,
    TodoStatus,
)
from agent.models.plans import ItemKind, Plan, PlanItem, PriorResult, Target, Verdict

__all__ = [
    "BLOCKING_FLAG_STATUSES",
    "BOTTLENECK_TITLES",
    "SWITCH_ON",
    "_FLAG_NAME",
    "BenchLevel",
    "BenchResult",
    "BenchSpec",
    "BottleneckCategory",
    "ConfigDiff",
    "Document",
    "Endpoint",
    "Event",
    "Experiment",
    "ExperimentKind",
    "ExperimentStatus",
    "Finding",
    "FindingKind",
    "Flag",
    "FlagChange",
    "FlagIssue",
    "FlagStatus",
    "GpuTelemetry",
    "Investigation",
    "InvestigationKind",
    "InvestigationStatus",
    "ItemKind",
    "MicrobenchResult",
    "ModelUsage",
    "Pivot",
    "Placement",
    "Plan",
    "PlanChange",
    "PlanItem",
    "PriorResult",
    "ProfileCategory",
    "ProfileKernel",
    "ProfileSummary",
    "ServerConfig",
    "ServerProcess",
    "ServerStatus",
    "Session",
    "SessionSettings",
    "SessionStatus",
    "SessionSummary",
    "Source",
    "Target",
    "Telemetry",
    "Todo",
    "TodoPriority",
    "TodoStatus",
    "Verdict",
    "_Model",
    "_is_flag_token",
    "_render_value",
    "parse_levels",
    "utcnow",
]
