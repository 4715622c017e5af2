"""Everything that can be known about a plan before any launch (`pivot plan check`): the profiles it names exist,
its base flags and every item's flags pass SGLang's audit, and its claims pass the plan checks.

Severity follows what a launch would do: a missing model or hardware profile (the twin and the analysis need
them), a flag SGLang refuses (unknown, removed, ambiguous, invalid) and a physics or direction error of a plan
item are errors; a flag SGLang accepts but reads nowhere (no-op), a deprecated one, and a plan check's warning
are warnings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from agent import models as m
from agent.errors import PivotError
from tools.profiles import load_hardware, model_for, names

Severity = Literal["error", "warning", "info"]
AUDIT_SEVERITY: dict[str, Severity] = {
    "unknown": "error",
    "ambiguous": "error",
    "invalid": "error",
    "deprecated": "warning",
    "noop": "warning",
}
DEFAULT_VERSION = "0.5.23"


class PlanProblem(BaseModel):
    """One finding of the pre-launch check: where in the plan, how bad, and what it means."""

    severity: Severity
    where: str = Field(description="The plan's field: target.model_profile, target.flags, item 05, ...")
    check: Literal["profile", "audit", "plan-check"]
    message: str
    flag: str | None = None


def _profiles(target: m.Target) -> tuple[list[PlanProblem], bool]:
    out: list[PlanProblem] = []
    try:
        model_for(target.model_profile, target.model)
    except PivotError as e:
        msg = e.message
        if not target.model_profile:
            known = ", ".join(names("models")) or "none"
            msg = f"no model profile serves {target.model!r}: set target.model_profile to one that exists ({known})"
        out.append(PlanProblem(severity="error", where="target.model_profile", check="profile", message=msg))
    try:
        load_hardware(target.hardware)
    except PivotError as e:
        out.append(PlanProblem(severity="error", where="target.hardware", check="profile", message=e.message))
    return out, not out


def _audit(plan: m.Plan) -> list[PlanProblem]:
    from tools.engines.catalog import audit, load_catalog

    target = plan.target
    if target.engine not in ("sglang", "sim", "sim-http"):
        return [
            PlanProblem(
                severity="info",
                where="target.engine",
                check="audit",
                message=f"flags not audited: pivot has no flag catalog for {target.engine}",
            )
        ]
    version = target.engine_version or DEFAULT_VERSION
    try:
        catalog = load_catalog("sglang", version)
    except PivotError as e:
        return [
            PlanProblem(
                severity="error",
                where="target.engine_version",
                check="audit",
                message=f"{e.message}" + (f" ({e.hint})" if e.hint else ""),
            )
        ]
    out: list[PlanProblem] = []
    base = target.base_config()

    def add(where: str, issues: list[m.FlagIssue], only: set[str] | None = None) -> None:
        for issue in issues:
            severity = AUDIT_SEVERITY.get(issue.status)
            if severity is None or (only is not None and issue.flag not in only):
                continue
            message = f"{issue.flag}: {issue.status} in SGLang {version}" + (
                f": {issue.message}" if issue.message else ""
            )
            out.append(PlanProblem(severity=severity, where=where, check="audit", message=message, flag=issue.flag))

    add("target.flags", audit(catalog, base))
    for item in plan.items:
        if item.flags is None:
            continue
        add(f"item {item.id}", audit(catalog, item.apply(base)), only=set(item.flags.names()))
    return out


def preflight(plan: m.Plan) -> list[PlanProblem]:
    """The profiles, the audit of the base flags and of every item's flags, and the plan checks; errors first."""
    from tools.analysis import plan_claims

    problems, profiles_ok = _profiles(plan.target)
    problems += _audit(plan)
    if profiles_ok:
        try:
            claims = plan_claims(plan)
        except PivotError as e:
            problems.append(PlanProblem(severity="error", where="plan", check="plan-check", message=e.message))
        else:
            for f in claims:
                problems.append(
                    PlanProblem(severity=f.severity, where=f"item {f.plan_item}", check="plan-check", message=f.text)
                )
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(problems, key=lambda p: order[p.severity])  # stable: plan order within a severity
