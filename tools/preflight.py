"""Everything that can be known about a plan before any launch (`pivot plan check`): where its profiles come from
(named, shipped, or generated from the model's config.json and this host), its base flags and every item's flags
through the engine's audit (SGLang's parser or catalog; vLLM's installed parser, else its nearest shipped catalog),
and its claims through the plan checks.

Severity follows what a launch would do: a model pivot can find no profile or config.json for, a named profile that
does not exist, a flag the engine refuses (unknown, removed, ambiguous, invalid) and a physics or direction error of
a plan item are errors; a flag the engine accepts but reads nowhere (no-op), a deprecated one, and a plan check's
warning are warnings; where the profiles and the audit's verdicts came from, and what is not available for this
target (the twin's predictions without calibrated profiles), are info.

An error of the target or of the plan as a whole (a profile, the engine version, a base flag) stops every campaign
before its baseline, so `check_runnable` refuses such a plan before a session exists (`pivot run`, `pivot demo`,
the TUI's new session, a session a command creates from a plan). An item's error stops that item only: the
campaign rules out an item whose flags the engine refuses before any launch, and carries a plan check's error in
the item's document, so those are shown and the campaign goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from agent import models as m
from agent.errors import PivotError, PlanError
from tools.profiles.target import hardware_profile_for, model_profile_for

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


def _profiles(target: m.Target) -> tuple[list[PlanProblem], bool | None]:
    """The profile lines, and whether the twin could run for the target (None when a profile is missing)."""
    out: list[PlanProblem] = []
    model = hw = None
    model_generated = False
    try:
        model, model_note, model_generated = model_profile_for(target)
        out.append(PlanProblem(severity="info", where="target.model_profile", check="profile", message=model_note))
    except PivotError as e:
        msg = e.message if target.model_profile else e.message + (f" ({e.hint})" if e.hint else "")
        out.append(PlanProblem(severity="error", where="target.model_profile", check="profile", message=msg))
    try:
        hw, hw_note, _ = hardware_profile_for(target)
        out.append(PlanProblem(severity="info", where="target.hardware", check="profile", message=hw_note))
        if hw.unknown():
            out.append(PlanProblem(severity="info", where="target.hardware", check="profile",
                                   message=f"not known of {hw.title}: {', '.join(hw.unknown())}"))  # fmt: skip
        note = hw.calibration.provenance_note() if hw.calibration is not None else None
        if note:  # fitted on this GPU, or borrowed from another's fit: the twin's predictions lean on which
            borrowed = "borrowed from" in note
            out.append(PlanProblem(severity="warning" if borrowed else "info", where="target.hardware",
                                   check="profile", message=f"the twin's calibration of {hw.name}: {note}"))  # fmt: skip
    except PivotError as e:
        out.append(PlanProblem(severity="error", where="target.hardware", check="profile", message=e.message))
    if model is None or hw is None:
        return out, None
    return out, not model_generated and hw.calibrated


def _audit(plan: m.Plan, options: Mapping[str, Any]) -> list[PlanProblem]:
    """The base flags and every item's flags through the plan's engine's own audit (Engine.audit: SGLang's parser or
    shipped catalog, vLLM's installed parser else its nearest shipped catalog, a plugin's own catalog), built with
    `options`; which parser judged is an info line, a version other than the plan's a warning, and an engine that
    cannot be loaded here an error."""
    from agent.contracts import load_engine

    target = plan.target
    try:
        engine = load_engine(target.engine, **options)
    except PivotError as e:
        message = e.message + (f" ({e.hint})" if e.hint else "")
        return [PlanProblem(severity="error", where="target.engine", check="audit", message=message)]
    base = target.base_config(engine.model_flags)
    try:
        first = engine.audit(base)
    except PivotError as e:
        message = e.message + (f" ({e.hint})" if e.hint else "")
        return [PlanProblem(severity="error", where="target.engine_version", check="audit", message=message)]
    judged = f"{engine.name} {first.version}" if first.version != "unknown" else engine.name
    out = [
        PlanProblem(severity="info", where="target.flags", check="audit", message=f"flags audited by {first.parser}")
    ]
    if target.engine_version and first.version not in (target.engine_version, "unknown"):
        out.append(PlanProblem(severity="warning", where="target.engine_version", check="audit",
                               message=f"the plan says {target.engine} {target.engine_version}; the flags were "
                               f"judged as {first.version} ({first.parser})"))  # fmt: skip
    out += [PlanProblem(severity="info", where="target.flags", check="audit", message=note) for note in first.notes]

    def add(where: str, issues: list[m.FlagIssue], only: set[str] | None = None) -> None:
        for issue in issues:
            severity = AUDIT_SEVERITY.get(issue.status)
            if severity is None or (only is not None and issue.flag not in only):
                continue
            message = f"{issue.flag}: {issue.status} in {judged}" + (f": {issue.message}" if issue.message else "")
            out.append(PlanProblem(severity=severity, where=where, check="audit", message=message, flag=issue.flag))

    add("target.flags", first.rows)
    for item in plan.items:
        if item.flags is not None:
            add(f"item {item.id}", engine.audit(item.apply(base)).rows, only=set(item.flags.names()))
    return out


def _has_predictor(plan: m.Plan, options: Mapping[str, Any]) -> bool:
    """Whether the plan's engine offers a predictor for its target (Engine.predictor: the SGLang twin for SGLang and
    the simulated engines)."""
    from agent.contracts import load_engine

    try:
        return load_engine(plan.target.engine, **options).predictor(plan.target) is not None
    except PivotError:
        return False


def _base_values(plan: m.Plan) -> list[PlanProblem]:
    """Base flags whose values no server can start with (a memory fraction outside (0, 1]): errors of the target."""
    from tools.analysis.common import flag_value
    from tools.analysis.plan_checks import mem_fraction_problem

    fraction = flag_value(plan.target.base_config(), "--mem-fraction-static")
    if fraction is None or (why := mem_fraction_problem(fraction)) is None:
        return []
    return [PlanProblem(severity="error", where="target.flags", check="plan-check",
                        message=f"--mem-fraction-static {fraction}: {why}", flag="--mem-fraction-static")]  # fmt: skip


def preflight(plan: m.Plan, engine_options: Mapping[str, Any] | None = None) -> list[PlanProblem]:
    """The profiles, the audit of the base flags and of every item's flags (by the plan's engine built with
    `engine_options`), and the plan checks; errors first."""
    from tools.analysis import plan_claims

    problems, calibrated = _profiles(plan.target)
    problems += _audit(plan, engine_options or {})
    problems += _base_values(plan)
    if calibrated is not None:
        if not _has_predictor(plan, engine_options or {}):
            why = f"the {plan.target.engine} engine offers no predictor for it"
        elif not calibrated:
            why = "the twin needs shipped, calibrated profiles"
        else:
            why = ""
        if why:
            problems.append(PlanProblem(severity="info", where="target", check="profile",
                                        message=f"predictions are not available for this target ({why}): the "
                                        "search measures every item instead"))  # fmt: skip
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


SIMULATED_ENGINES = ("sim", "sim-http")  # their GPUs and model are the profiles': nothing to download later


def blocks_run(problem: PlanProblem, plan: m.Plan | None = None, engine: str | None = None) -> bool:
    """Whether a problem stops every campaign on the plan (run with `engine`, default the plan's): an error of the
    target or of the plan as a whole. A model no profile names and whose config.json is not here yet does not, on a
    real engine: the engine may download it, and its profile is generated once it is there."""
    if problem.severity != "error" or problem.where.startswith("item "):
        return False
    if problem.where == "target.model_profile" and plan is not None and not plan.target.model_profile:
        return (engine or plan.target.engine) in SIMULATED_ENGINES
    return True


def check_runnable(
    plan: m.Plan, engine_options: Mapping[str, Any] | None = None, engine: str | None = None
) -> list[PlanProblem]:
    """`preflight` (the plan's engine built with `engine_options`), refusing the plan (PlanError, before any session
    or server exists) when an error of its target or of the plan as a whole would stop a campaign run with `engine`
    (default the plan's); returns the item errors and warnings for the caller to show."""
    problems = preflight(plan, engine_options)
    blocking = [p for p in problems if blocks_run(p, plan, engine)]
    if blocking:
        where = _ref(plan)
        shown = "; ".join(f"{p.where}: {p.message.rstrip('.')}" for p in blocking[:3])
        more = f" (and {len(blocking) - 3} more)" if len(blocking) > 3 else ""
        raise PlanError(
            f"the plan {where} cannot run: {shown}{more}; no session was recorded",
            hint=f"`pivot plan check {where}` lists every problem; fix the target and run again",
        )
    return [p for p in problems if p.severity != "info"]


def item_errors_note(plan: m.Plan, problems: list[PlanProblem]) -> str | None:
    """One line on the item errors a campaign goes on with (what it does with each), or None when there are none."""
    refused = sorted({p.where.removeprefix("item ") for p in problems if p.severity == "error" and p.check == "audit"
                      and p.where.startswith("item ")})  # fmt: skip
    claims = sorted({p.where.removeprefix("item ") for p in problems if p.severity == "error"
                     and p.check == "plan-check" and p.where.startswith("item ")})  # fmt: skip
    if not refused and not claims:
        return None
    parts = []
    if refused:
        parts.append(f"{', '.join(refused)} (flags the engine refuses: ruled out before any launch)")
    if claims:
        parts.append(f"{', '.join(claims)} (a physics or direction error: its document says so)")
    return f"plan check: errors in items {'; '.join(parts)}; `pivot plan check {_ref(plan)}` shows them"


def _ref(plan: m.Plan) -> str:
    """How a user names the plan: a shipped plan by its name, another by its file."""
    from pathlib import Path

    from agent.plans import bundled_plans_dir

    if plan.source and Path(plan.source).resolve().parent != bundled_plans_dir().resolve():
        return plan.source
    return plan.name
