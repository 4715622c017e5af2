"""What the ledger records: todos, experiments, documents, pivots, servers, sessions, events."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from agent.models.audit import FlagIssue
from agent.models.base import _Model, utcnow
from agent.models.bench import BenchSpec, Placement
from agent.models.config import ServerConfig
from agent.models.plans import Plan, Target, Verdict

# --------------------------------------------------------------------------------------------------
# The ledger's records.

TodoStatus = Literal["pending", "in_progress", "completed", "cancelled"]
TodoPriority = Literal["high", "medium", "low"]


class Todo(_Model):
    """One line of the agent's todo list."""

    id: str = Field(default="", description="Stable id; the ledger assigns one when empty.")
    content: str = Field(min_length=1)
    status: TodoStatus = "pending"
    priority: TodoPriority = "medium"
    plan_item: str | None = Field(default=None, description="The plan item this todo works on, if any.")


ExperimentKind = Literal["baseline", "change", "rerun", "prior", "imported"]
ExperimentStatus = Literal["planned", "running", "finished", "failed", "interrupted"]


class Experiment(_Model):
    """One clean experiment: a config on a workload, why it was tried, and what it showed."""

    id: int | None = Field(default=None, description="The ledger's row id: internal, shared by every session.")
    number: int | None = Field(
        default=None,
        description="Its number in its session (1, 2, ... in the order they were recorded): what every report, the "
        "CLI, the TUI and the model call it. Not stored: the store counts it from the ledger's order.",
    )
    session_id: str | None = None
    plan_item: str | None = Field(default=None, description="The plan item tested; None for a baseline.")
    plan_items: list[str] = Field(
        default_factory=list,
        description="Every plan item this experiment combines, in order (a combined step names them all); "
        "`plan_item` is the first. Empty for a baseline of the plan's workload.",
    )
    kind: ExperimentKind = "change"
    title: str = ""
    hypothesis: str = ""
    config: ServerConfig
    base_experiment_id: int | None = Field(default=None, description="The experiment whose config this changes.")
    workload: BenchSpec
    status: ExperimentStatus = "planned"
    verdict: Verdict | None = None
    reason: str | None = Field(default=None, description="Why the verdict, with the measured numbers.")
    audit: list[FlagIssue] = Field(default_factory=list, description="The flag audit of `config` before launch.")
    not_modelled: list[str] = Field(
        default_factory=list,
        description="Flags of `config` the engine does not model (a simulated engine's), so their effect is not in "
        "its numbers; empty on a real engine.",
    )
    failure: str | None = Field(default=None, description="Classified failure, e.g. oom, unrecognized-argument.")
    failure_detail: str | None = Field(default=None, description="The log line or message that says why it failed.")
    log_path: str | None = None
    predicted_tok_s: float | None = Field(
        default=None,
        description="The twin's output tok/s for this config at the judged level, corrected to the campaign's own "
        "measurements, recorded before launch: a prediction, not a measurement.",
    )
    predicted_change_pct: float | None = Field(
        default=None, description="The predicted change against the base experiment's measured mean, in %."
    )
    prediction: str | None = Field(default=None, description="Where the prediction comes from, in words.")
    reverts: list[str] = Field(
        default_factory=list,
        description="Adopted plan items this experiment takes back: its config is the best configuration rebuilt "
        "from the chain of adopted changes without them (a revert; `plan_items` then names what it adds, if any).",
    )
    revert_why: str | None = Field(
        default=None, description="Why the items are taken back, in words (e.g. a later change made them a brake)."
    )
    placement: Placement | None = Field(
        default=None, description="Where its server last ran (an executor's task); None for a server of this process."
    )
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @model_validator(mode="after")
    def _items_agree(self) -> Experiment:
        if self.plan_item is not None and not self.plan_items:
            self.plan_items = [self.plan_item]
        elif self.plan_items and self.plan_item is None:
            self.plan_item = self.plan_items[0]
        return self

    @property
    def combined(self) -> bool:
        """True when the experiment tests several plan items together as one step."""
        return len(self.plan_items) > 1


class Document(_Model):
    """A generated document: an improvement doc for a plan item or a numbered status summary."""

    id: int | None = None
    session_id: str
    kind: Literal["improvement", "status"]
    plan_item: str | None = None
    number: int | None = Field(default=None, description="The status summary's sequence number.")
    title: str
    path: str = Field(description="Where the file is, relative to PIVOT_HOME.")
    status: str = ""
    sha256: str = Field(description="Of the content pivot wrote, to notice edits made by hand.")
    experiment_ids: list[int] = Field(default_factory=list, description="Experiments its numbers come from.")
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class Pivot(_Model):
    """A pivot point: the agent stops, asks the user a question with options, and waits for the answer."""

    id: int | None = None
    session_id: str | None = None
    question: str = Field(min_length=1)
    options: list[str] = Field(default_factory=list)
    answer: str | None = None
    tool_call_id: str | None = Field(default=None, description="The deferred ask_user call the answer resumes.")
    summary_path: str | None = None
    closes_tiers: list[int] | None = Field(
        default=None,
        description="The tiers this pivot closed: their work was done when it was asked (written by ask_user from "
        "the method's moves at that moment, never recomputed). None on pivots recorded before tier ends were kept.",
    )
    asked_at: datetime = Field(default_factory=utcnow)
    answered_at: datetime | None = None

    @property
    def open(self) -> bool:
        return self.answer is None


ServerStatus = Literal["starting", "ready", "stopped", "crashed"]


class ServerProcess(_Model):
    """A server process pivot started, recorded so that no process outlives pivot unnoticed."""

    id: int | None = None
    session_id: str
    experiment_id: int | None = None
    engine: str
    pid: int
    pgid: int
    proc_start: str | None = Field(
        default=None, description="The kernel's start time of `pid`, so a reused pid is never taken for the server."
    )
    host: str
    base_url: str
    argv: list[str]
    log_path: str | None = None
    status: ServerStatus = "starting"
    failure: str | None = None
    started_at: datetime = Field(default_factory=utcnow)
    stopped_at: datetime | None = None


class PlanChange(_Model):
    """A session's plan replaced by an edited one (`pivot resume --plan`): what changed, from which file, when."""

    id: int | None = None
    session_id: str
    source: str | None = Field(default=None, description="The file the new plan was read from.")
    changes: list[str] = Field(description="What differs, one line each: base flags, items added, removed, changed.")
    at: datetime = Field(default_factory=utcnow)


SessionStatus = Literal["active", "waiting", "finished", "failed", "stopped"]


class SessionSettings(_Model):
    """How the agent works in one session: the method's thresholds and the engine's options, kept with the
    session so that a resume judges and launches exactly as the run before it did."""

    min_gain_pct: float = Field(
        default=3.0,
        ge=0,
        description="A change is adopted only when its gain at the judged level beats this and the measured noise.",
    )
    reruns: int = Field(default=1, ge=0, description="Reruns of a change whose gain is inside the noise band.")
    stall_after: int = Field(
        default=3, ge=1, description="Stop at a pivot after this many measured changes in a row without gain."
    )
    seed: int = Field(default=0, description="Seeds the simulated engines' noise: experiment N draws seed + N.")
    engine_options: dict[str, Any] = Field(
        default_factory=dict, description="Options the engine is built with (no secrets: they are stored)."
    )
    request_limit: int = Field(default=400, ge=1, description="Model requests per run before pivot stops it.")
    parallel: int = Field(
        default=1,
        ge=1,
        description="Experiments of one search step run at once (an executor: --ray); 1 is one after another.",
    )
    executor: str | None = Field(
        default=None,
        description="Where experiments run: None in this process, else a Ray address (local starts one here).",
    )
    ray_gpus: int | None = Field(
        default=None, ge=0, description="With executor local: the GPUs the local Ray instance offers (None: detected)."
    )
    mcp_config: str | None = Field(
        default=None,
        description="An `mcpServers` JSON file whose servers' tools the agent's model gets (--mcp): its absolute path "
        "only, never its contents (the env values in it may hold keys).",
    )
    mcp_instructions: bool = Field(
        default=False, description="Whether the MCP servers' own instructions go to the model (--mcp-instructions)."
    )
    investigator_model: str | None = Field(
        default=None, description="The model of sub-agent investigations (--investigator-model); None: the session's."
    )
    profiles: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Profiles pivot generated for a target whose plan names none (`model`: from its config.json, "
        "`hardware`: this host's GPU or CPU), kept so that a resume and every report read the same figures.",
    )
    paired: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="A decisive change judged in pairs with its base measured again after it (A/B/A; "
        "tools/method/paired.py): auto pairs an engine that measures (not a simulated one), on always, off never.",
    )
    proposer: Literal["twin", "optuna-tpe", "optuna-gp", "random", "plan-order"] = Field(
        default="twin",
        description="What proposes the launches (`--search`): the twin-guided search, a peer (Optuna's TPE or GP "
        "sampler, random configurations: tools/peers.py) under the same method, or the plan's order (`search` off).",
    )
    fit_twin: bool = Field(
        default=False,
        description="The search ranks by the twin fitted to this target (`--fit-twin`, tools/fit.py: host overhead, "
        "GEMM efficiency, bandwidth and power scaled to what the campaign measured), made again after each measurement.",
    )
    max_launches: int | None = Field(
        default=None,
        ge=1,
        description="The launch budget (`--max-launches`): no new launch once this many servers were started.",
    )
    search: bool = Field(
        default=True,
        description="The twin-guided search (tools/search.py: predicted candidates, combined steps, retests, no "
        "launch for no-op flags) and adoptions confirmed by a second run. False: the plain greedy path (plan order, "
        "one item at a time, an adoption on one run), kept to compare against.",
    )


class Session(_Model):
    """A session as the ledger keeps it: one plan worked on by one agent, resumable at any time.

    (The live object handed to tools is `agent.session.Session`, which holds one of these.)
    """

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    name: str
    plan: Plan
    engine: str
    model: str = Field(default="autopilot", description="The model string driving the agent; never a key.")
    model_base_url: str | None = Field(default=None, description="An OpenAI-compatible server for the model.")
    settings: SessionSettings = Field(default_factory=SessionSettings)
    status: SessionStatus = "active"
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)

    @property
    def target(self) -> Target:
        return self.plan.target

    @property
    def hardware_text(self) -> str:
        """Where the target runs, in words: the named profile's GPUs, else the hardware pivot detected and recorded."""
        t = self.plan.target
        if t.hardware:
            return f"{t.gpus}x {t.hardware}"
        found = self.settings.profiles.get("hardware") or {}
        if found.get("kind") == "cpu":
            return f"this host's CPU ({found.get('title', 'cpu')})"
        if found:
            return f"{t.gpus}x {found.get('title', 'GPU')} (detected)"
        return "this host's hardware"


class SessionSummary(_Model):
    """One line of `pivot sessions`: a session and how far it got."""

    id: str
    name: str
    plan: str
    target: str
    engine: str
    status: SessionStatus
    experiments: int
    open_pivot: str | None = Field(default=None, description="The question waiting for an answer, if any.")
    locked_by_pid: int | None = None
    updated_at: datetime


class Event(_Model):
    """Something that happened, for a progress display: a tool call, a level finished, a warning."""

    kind: Literal["info", "progress", "warning", "tool_call", "tool_result", "message", "error"]
    message: str
    data: dict[str, Any] = Field(default_factory=dict)
    at: datetime = Field(default_factory=utcnow)
