"""The entry point: `analyze` one experiment's sweep and record its findings."""

from __future__ import annotations

from agent import models as m
from agent.errors import PivotError
from agent.store import Store
from tools.analysis.bottlenecks import _decide
from tools.analysis.common import (
    STOPPED_EXPONENT,
    SessionLike,
    _finding,
    _n,
    flag_value,
    layout,
    session_engine,
)
from tools.analysis.ledger import (
    _kv_usage,
    _levels,
    _recorded_profile,
    _server_info,
    _telemetry_by_level,
    best_experiment,
)
from tools.analysis.levels import _level_finding, _level_roofline, _notes, _profile_finding, _scaling_finding
from tools.analysis.physics import contradictions, measured_level, no_roofline_note, no_verdict
from tools.analysis.results import Analysis, LevelRoofline
from tools.analysis.roofline import Roofline
from tools.profiles.target import session_profiles


def analyze(
    session: SessionLike,
    experiment_id: int | None = None,
    *,
    profile: m.ProfileSummary | None = None,
) -> Analysis:
    """Analyse one experiment (default: the one with the best output tok/s) and record its findings.

    The experiment's previous findings are replaced. `profile` (from tools/profile.py) gives the measured
    split of GPU time; without it, a profile recorded by an earlier analysis of the same experiment is reused.
    The profiles are the session's (named in the plan, else generated and recorded with it). Without a roofline
    (a CPU, a GPU whose peaks are not known) the findings are the measurements alone; when a level contradicts the
    profiles (tools/analysis/physics.py), they say so and name no bottleneck.
    """
    store, session_id = session.store, session.id
    record = store.get_session(session_id)
    experiment_id, experiment = _experiment(store, session_id, experiment_id)
    target = record.plan.target
    levels, source = _levels(store, experiment_id)
    try:
        profiles = session_profiles(store, session_id)
    except PivotError as e:  # no profile and no config.json here: the measurements alone, saying why
        analysis = Analysis(session_id=session_id, experiment_id=experiment_id, model_profile="unknown",
                            hardware=target.hardware or "unknown", gpus=target.gpus, tp=1, pp=1, ep=1, dense=True,
                            source=source)  # fmt: skip
        note = _finding("note", f"No roofline: {e.message}; the levels are measurements only.", {}, severity="info")
        return _measured_only(session, analysis, levels, _telemetry_by_level(store, experiment_id), [note])
    model, hw = profiles.model, profiles.hardware
    lay = layout(experiment.config, _server_info(levels), engine=session_engine(record))
    kv_dtype = flag_value(experiment.config, "--kv-cache-dtype")
    bench = [r for r in store.microbench_results() if r.device in (hw.name, hw.title)]
    roof = Roofline(model, hw, lay["tp"], lay["pp"], lay["ep"], kv_dtype, bench)
    telemetry = _telemetry_by_level(store, experiment_id)
    if profile is None:
        profile, profiled_on = _recorded_profile(store, session_id, experiment_id)
    else:
        profiled_on = experiment_id
    analysis = Analysis(
        session_id=session_id,
        experiment_id=experiment_id,
        model_profile=model.name,
        hardware=hw.name,
        gpus=target.gpus,
        tp=lay["tp"],
        pp=lay["pp"],
        ep=lay["ep"],
        dense=not roof.moe,
        source=source,
    )
    if not hw.has_roofline:
        return _measured_only(session, analysis, levels, telemetry, [no_roofline_note(hw, model)])
    rows: list[LevelRoofline] = []
    for level in levels:
        if level.completed <= 0:
            continue
        rows.append(_level_roofline(level, telemetry.get(level.max_concurrency or 0), roof, hw, rows))
    analysis.levels = rows
    wrong = contradictions(rows, roof, model, hw, max(target.gpus, lay["tp"] * lay["pp"]))
    if wrong:
        analysis.levels = []
        return _measured_only(session, analysis, levels, telemetry, wrong)
    findings: list[m.Finding] = []
    findings += _notes(roof, model, lay)
    findings += [_level_finding(r, roof) for r in rows]
    failed_levels = [lv for lv in levels if lv.failed > 0]
    if not rows:
        text = "No level completed a request, so there is nothing to analyse."
        if failed_levels:
            errors = sorted({e for lv in failed_levels for e in lv.errors})
            text += " Errors: " + "; ".join(errors[:3]) + "."
        findings.append(_finding("note", text, {}, severity="warning"))
        analysis.findings = store.replace_findings(session_id, experiment_id, findings)
        analysis.summary = text
        return analysis

    ref = max(rows, key=lambda r: (r.output_throughput, -r.max_concurrency))
    analysis.reference_concurrency = ref.max_concurrency
    stops = next(
        (r for r in rows[1:] if (r.scaling_exponent is not None and r.scaling_exponent < STOPPED_EXPONENT)), None
    )
    analysis.stops_scaling_at = stops.max_concurrency if stops else None
    findings.append(_scaling_finding(rows, stops))
    if profile is not None:
        elsewhere = None if profiled_on == experiment_id else profiled_on
        shown = store.get_experiment(elsewhere).number if elsewhere is not None else None
        findings.append(_profile_finding(profile, ref, elsewhere, shown))
    category, evidence, secondary = _decide(roof, rows, ref, stops, failed_levels, profile, hw)
    analysis.bottleneck = category
    title = m.BOTTLENECK_TITLES[category]
    where = f"at concurrency {ref.max_concurrency}"
    analysis.summary = f"The dominant bottleneck {where} is {title}: " + evidence[0].text
    findings += [_verdict(ref, category), *evidence, *secondary]
    analysis.findings = store.replace_findings(session_id, experiment_id, findings)
    saved = {id(f): s for f, s in zip(findings, analysis.findings, strict=True)}
    analysis.evidence = [saved[id(f)] for f in evidence]
    analysis.secondary = [saved[id(f)] for f in secondary]
    return analysis


def _measured_only(
    session: SessionLike,
    analysis: Analysis,
    levels: list[m.BenchLevel],
    telemetry: dict[int, m.Telemetry],
    notes: list[m.Finding],
) -> Analysis:
    """The analysis when the profiles cannot be read against the measurements (no roofline, or contradicted): the
    notes that say why, each level as measured, the scaling, and a verdict line that names no bottleneck."""
    store = session.store
    shown = store.get_experiment(analysis.experiment_id).number  # what the reports call it
    done = [lv for lv in levels if lv.completed > 0]
    findings = list(notes)
    findings += [measured_level(lv, telemetry.get(lv.max_concurrency or 0), _kv_usage(lv, telemetry.get(
        lv.max_concurrency or 0))) for lv in done]  # fmt: skip
    if done:
        ref = max(done, key=lambda lv: (lv.output_throughput, -(lv.max_concurrency or 0)))
        analysis.reference_concurrency = ref.max_concurrency
        why = (
            "the profiles do not describe what was served"
            if notes[0].severity == "warning"
            else "there is no roofline for this hardware (what is not known is listed below)"
        )
        text = (
            f"No bottleneck is named for experiment {shown}: {why}. Best measured: "
            f"{_n(ref.output_throughput)} output tok/s at concurrency {ref.max_concurrency}."
        )
    else:
        text = f"No bottleneck is named for experiment {shown}: no level completed a request."
    findings.append(no_verdict(text))
    analysis.summary = text
    analysis.findings = store.replace_findings(session.id, analysis.experiment_id, findings)
    return analysis


def _experiment(store: Store, session_id: str, experiment_id: int | None) -> tuple[int, m.Experiment]:
    """The experiment to analyse: `experiment_id` when it belongs to the session, else the best one."""
    if experiment_id is None:
        experiment_id = best_experiment(store, session_id)
        if experiment_id is None:
            raise PivotError(f"session {session_id} has no benchmark results to analyse")
    experiment = store.get_experiment(experiment_id)
    if experiment.session_id != session_id:
        raise PivotError(f"experiment {experiment_id} belongs to session {experiment.session_id}, not {session_id}")
    return experiment_id, experiment


def _verdict(ref: LevelRoofline, category: m.BottleneckCategory) -> m.Finding:
    """The verdict's line: the dominant bottleneck at the level with the best output tok/s."""
    title = m.BOTTLENECK_TITLES[category]
    where = f"at concurrency {ref.max_concurrency}"
    return _finding(
        "bottleneck",
        f"Dominant bottleneck: {title} ({where}, the level with the best output tok/s, "
        f"{_n(ref.output_throughput)} tok/s).",
        {"max_concurrency": ref.max_concurrency, "output_throughput": ref.output_throughput},
        category=category,
        max_concurrency=ref.max_concurrency,
        formula="decided in order: KV capacity, host overhead, prefill interference, then the largest part of "
        "the decode step (tools/analysis/bottlenecks.py)",
    )
