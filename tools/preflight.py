"""Everything that can be known about a plan before any launch (`pivot plan check`): the profiles it names exist,
its base flags and every item's flags pass its engine's audit (Engine.audit: SGLang's, vLLM's or a plugin's own
catalog or parser), and its claims pass the plan checks.

Severity follows what a launch would do: a missing model or hardware profile (the twin and the analysis need
them), a flag the engine refuses (unknown, removed, ambiguous, invalid) and a physics or direction error of a plan
item are errors; a flag the engine accepts but reads nowhere (no-op), a deprecated one, and a plan check's warning
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
    """The base flags and every item's flags through the plan's engine's own audit (Engine.audit: its catalog, its
    parser), judged as the plan's engine version; an engine that cannot be loaded here is an error."""
    from agent.contracts import load_engine

    target = plan.target
    try:
        engine = load_engine(target.engine)
    except PivotError as e:
        message = e.message + (f" ({e.hint})" if e.hint else "")
        return [PlanProblem(severity="error", where="target.engine", check="audit", message=message)]
    base = target.base_config(engine.model_flags)
    try:
        report = engine.audit(base, version=target.engine_version)
    except PivotError as e:
        message = e.message + (f" ({e.hint})" if e.hint else "")
        return [PlanProblem(severity="error", where="target.engine_version", check="audit", message=message)]
    judged = f"{engine.name} {report.version}" if report.version != "unknown" else engine.name
    out = [
        PlanProblem(severity="info", where="target.engine", check="audit", message=f"flags audited by {report.parser}")
    ]

    def add(where: str, issues: list[m.FlagIssue], only: set[str] | None = None) -> None:
        for issue in issues:
            severity = AUDIT_SEVERITY.get(issue.status)
            if severity is None or (only is not None and issue.flag not in only):
                continue
            message = f"{issue.flag}: {issue.status} in {judged}" + (f": {issue.message}" if issue.message else "")
            out.append(PlanProblem(severity=severity, where=where, check="audit", message=message, flag=issue.flag))

    add("target.flags", report.rows)
    for item in plan.items:
        if item.flags is None:
            continue
        rows = engine.audit(item.apply(base), version=target.engine_version).rows
        add(f"item {item.id}", rows, only=set(item.flags.names()))
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
