"""Optimization plans: target, items, verdicts, prior results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agent.errors import PivotError
from agent.models.base import _Model
from agent.models.bench import BenchSpec
from agent.models.config import Flag, ServerConfig
from agent.models.objective import Objective

# --------------------------------------------------------------------------------------------------
# Plans.

VLLM_MODEL_FLAGS: tuple[str, ...] = ("--model",)  # vLLM's model flag (tools/engines/vllm.py says the same)
DEFAULT_MODEL_FLAGS = (
    "--model-path",
    "--model",
)  # SGLang's: the engine's own (Engine.model_flags) where one is at hand

# flag: a flag flip; config: a configuration change; workload: a different benchmark workload;
# profile: a measurement (a profile of the best config) rather than a change; code: a change for the user to make;
# power: a GPU power limit set through NVML for the experiment (restored after), on top of the best config.
ItemKind = Literal["flag", "config", "workload", "profile", "code", "power"]
# measured: a measurement that changes nothing (a profile of the best configuration), neither kept nor set aside.
# not_measured: the engine does not model the flags the change touches (a simulated engine), so nothing it
# reports says what the change does: it has to be measured on GPUs.
# predicted: not launched because the twin, corrected to the campaign's own measurements, predicts the change inside
# the noise band (or a loss): a prediction, not a measurement; the search may try the item later on a new best.
# superseded: the change gained beyond the noise band on its base, but another change of the same step (run beside it
# by an executor with --parallel) became the best; the search weighs it again on the new best.
Verdict = Literal[
    "baseline",
    "adopted",
    "no_gain",
    "regressed",
    "crashed",
    "ruled_out",
    "inconclusive",
    "measured",
    "not_measured",
    "predicted",
    "superseded",
]


class Target(_Model):
    """What is being optimized: a model on some GPUs under one serving engine, with its base flags."""

    model: str = Field(description="The model path or hub id the engine serves (its model flag, e.g. `--model-path`).")
    model_profile: str | None = Field(
        default=None,
        description="Name of a model profile, e.g. glm-5-nvfp4; unset: the shipped one that serves `model`, else one "
        "pivot generates from the model's config.json.",
    )
    hardware: str | None = Field(
        default=None,
        description="Name of a hardware profile, e.g. rtx-pro-6000-blackwell; unset: this host's (NVML's GPU, else "
        "its CPU), as pivot detects it.",
    )
    gpus: int = Field(ge=1)
    engine: str = "sglang"
    engine_version: str | None = None
    flags: ServerConfig = Field(default_factory=ServerConfig, description="Base flags every experiment starts from.")

    def base_config(self, model_flags: Sequence[str] | None = None) -> ServerConfig:
        """The base flags with the model first, as the engine's first model flag (`model_flags`, the engine's
        `Engine.model_flags`), unless the flags already name the model with one of them. Without `model_flags`
        (a caller that holds no engine), the built-in engines' spelling: vLLM's `--model`, else SGLang's."""
        if model_flags is None:
            model_flags = VLLM_MODEL_FLAGS if self.engine == "vllm" else DEFAULT_MODEL_FLAGS
        if not model_flags or any(n in self.flags for n in model_flags):
            return self.flags
        first = Flag(name=model_flags[0], value=self.model)
        return ServerConfig(flags=(first, *self.flags.flags), env=self.flags.env)


class PlanItem(_Model):
    """One optimization idea: what to change, why, what it should do, and what could go wrong."""

    id: str = Field(pattern=r"^\d{2,3}$", description='"01".."NN": also the number of its improvement document.')
    tier: int = Field(ge=1)
    title: str = Field(min_length=1)
    kind: ItemKind
    flags: ServerConfig | None = Field(default=None, description="Flags set on top of the best config so far.")
    remove_flags: list[str] = Field(default_factory=list, description="Flags removed from the best config.")
    workload: dict[str, Any] | None = Field(default=None, description="Overrides of the plan's workload.")
    change: str | None = Field(default=None, description="For code items: the change for the user to make.")
    power_limit_w: float | None = Field(
        default=None, gt=0, description="For power items: the power limit per GPU, in W (NVML's, restored after)."
    )
    hypothesis: str = Field(min_length=1)
    expected_impact: str = Field(min_length=1)
    risks: str = ""

    @model_validator(mode="after")
    def _check_kind(self) -> PlanItem:
        if self.kind in ("flag", "config") and self.flags is None and not self.remove_flags:
            raise ValueError(f"a {self.kind} item needs `flags` or `remove_flags`")
        if self.kind == "workload" and not self.workload:
            raise ValueError("a workload item needs a `workload` table of overrides")
        if self.kind == "code" and not self.change:
            raise ValueError("a code item needs `change`: what the user should change")
        if self.kind == "power" and self.power_limit_w is None:
            raise ValueError("a power item needs `power_limit_w`: the power limit per GPU, in W")
        if self.kind != "power" and self.power_limit_w is not None:
            raise ValueError('`power_limit_w` belongs to a power item (kind = "power")')
        if self.workload:
            BenchSpec.model_validate({**BenchSpec().model_dump(), **self.workload})
        return self

    def apply(self, config: ServerConfig) -> ServerConfig:
        """The config this item proposes, on top of `config`."""
        out = config.without(*self.remove_flags)
        out = out.with_flags(self.flags) if self.flags is not None else out
        return out.with_power_limit(self.power_limit_w) if self.power_limit_w is not None else out

    def workload_for(self, spec: BenchSpec) -> BenchSpec:
        """The workload this item is measured on: the plan's, with this item's overrides."""
        if not self.workload:
            return spec
        return BenchSpec.model_validate({**spec.model_dump(), **self.workload})


class PriorResult(_Model):
    """A finding from before the plan (for example the seeds' TP4+PP2 run), kept so it is not tried again."""

    title: str
    change: str = ""
    flags: ServerConfig | None = None
    finding: str
    verdict: Verdict


class Plan(_Model):
    """A tiered optimization plan: the target, the workload every comparison uses, and the ideas to try."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    title: str
    description: str = ""
    target: Target
    workload: BenchSpec = Field(default_factory=BenchSpec)
    objective: Objective = Field(
        default_factory=Objective, description="What the campaign optimizes (default: output tok/s) and its SLOs."
    )
    tiers: dict[int, str] = Field(default_factory=dict, description="Tier number -> what kind of changes it holds.")
    items: list[PlanItem] = Field(min_length=1)
    prior: list[PriorResult] = []
    source: str | None = Field(default=None, description="The file the plan was read from.")

    @field_validator("items")
    @classmethod
    def _unique_ids(cls, items: list[PlanItem]) -> list[PlanItem]:
        seen: set[str] = set()
        for item in items:
            if item.id in seen:
                raise ValueError(f"item id {item.id!r} is used twice")
            seen.add(item.id)
        return items

    @model_validator(mode="after")
    def _slos_in_workload(self) -> Plan:
        """The objective's SLOs go into the workload, so every level of every experiment reports its goodput and
        attainment (the SLOs judge the requests; they change none of them, nor the workload's key)."""
        slos = self.objective.slos_ms
        given = self.workload.goodput_slos_ms
        if slos and given is not None and dict(given) != slos:
            raise ValueError(
                "workload.goodput_slos_ms and the [objective]'s SLOs differ: give the SLOs once, in [objective]"
            )
        if slos and given is None:
            self.workload = self.workload.model_copy(update={"goodput_slos_ms": dict(slos)})
        return self

    def with_objective(self, objective: Objective) -> Plan:
        """This plan judged by `objective` (the command line's --objective and --slo): its SLOs replace the
        workload's; without SLOs the workload keeps the ones it reports."""
        slos = objective.slos_ms or self.workload.goodput_slos_ms
        workload = self.workload.model_copy(update={"goodput_slos_ms": dict(slos) if slos else None})
        return self.model_copy(update={"objective": objective, "workload": workload})

    def item(self, item_id: str) -> PlanItem:
        """The item with this id; a PivotError naming the known ids if there is none."""
        for it in self.items:
            if it.id == item_id:
                return it
        raise PivotError(f"plan {self.name!r} has no item {item_id!r}", hint=f"items: {', '.join(self.item_ids())}")

    def item_ids(self) -> list[str]:
        return [it.id for it in self.items]

    def tier_items(self, tier: int) -> list[PlanItem]:
        return [it for it in self.items if it.tier == tier]
