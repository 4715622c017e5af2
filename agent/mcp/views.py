"""What `pivot mcp`'s read tools and resources return, as typed models: the same readings as `pivot plan list`,
`plan check`, `sessions`, `show`, `summary`, `sim predict` and `audit-flags`, without a terminal."""

from __future__ import annotations

import shlex
from typing import Any

from pydantic import BaseModel, Field

from agent import models as m
from agent.errors import PivotError
from agent.session import Paths
from agent.store import Store


def _split(flags: str) -> list[str]:
    try:
        return shlex.split(flags)
    except ValueError as e:
        raise PivotError(f"cannot read the flags {flags!r}: {e}", hint="quote values as a shell would") from e


class PlanRow(BaseModel):
    """A plan that ships with pivot."""

    name: str = Field(description="Its name: give it to check_plan or start_campaign.")
    title: str
    items: int
    path: str
    error: str | None = None


class PlanItemRow(BaseModel):
    id: str
    tier: int
    kind: str
    title: str
    change: str


class PlanCheck(BaseModel):
    """The whole pre-launch check of a plan (`pivot plan check`): profiles, the engine's audit of every flag, the
    plan checks. `ok` is false when there is an error: fix it before a launch spends GPU time on it."""

    plan: str
    title: str
    source: str | None
    ok: bool
    errors: int
    warnings: int
    target: str
    base_flags: str
    workload: str
    items: list[PlanItemRow]
    problems: list[dict[str, Any]] = Field(description="Each finding: severity, where, check, message, flag.")


def list_plans() -> list[PlanRow]:
    from agent.plans import bundled_plans, load_plan

    rows = []
    for name, path in bundled_plans().items():
        try:
            p = load_plan(path)
            rows.append(PlanRow(name=name, title=p.title, items=len(p.items), path=str(path)))
        except PivotError as e:
            rows.append(PlanRow(name=name, title="", items=0, path=str(path), error=e.message))
    return rows


def _change(item: m.PlanItem) -> str:
    if item.kind == "code":
        return "(code change)"
    if item.kind == "workload":
        return ", ".join(f"{k}={v}" for k, v in (item.workload or {}).items())
    if item.kind == "profile":
        return "(measurement)"
    return " ".join([str(item.flags or ""), *(f"(drop {f})" for f in item.remove_flags)]).strip()


def check_plan(plan_ref: str) -> PlanCheck:
    from agent.plans import load_plan
    from tools.preflight import preflight

    p = load_plan(plan_ref)
    problems = preflight(p)
    errors = sum(x.severity == "error" for x in problems)
    t, w = p.target, p.workload
    return PlanCheck(
        plan=p.name,
        title=p.title,
        source=p.source,
        ok=errors == 0,
        errors=errors,
        warnings=sum(x.severity == "warning" for x in problems),
        target=f"{t.model} on {t.gpus}x {t.hardware}, {t.engine} {t.engine_version or ''}".rstrip(),
        base_flags=str(t.flags or ""),
        workload=f"{w.dataset_name} in {w.random_input_len} / out {w.random_output_len} (range ratio "
        f"{w.random_range_ratio}), concurrency {', '.join(map(str, w.concurrency))}",
        items=[PlanItemRow(id=i.id, tier=i.tier, kind=i.kind, title=i.title, change=_change(i)) for i in p.items],
        problems=[x.model_dump() for x in problems],
    )


def list_sessions(store: Store) -> list[dict[str, Any]]:
    from agent.console import dump

    return [dump(r) for r in store.session_summaries()]


def show_session(store: Store, session_ref: str) -> dict[str, Any]:
    """A session in a form an agent can read at once: its record, todos, experiments (change, figure, verdict and
    reason), pivots, documents, investigations and model use. Per-level numbers: `pivot show --json`."""
    from agent.console import dump
    from tools.reports import Ledger

    session = store.get_session(session_ref)
    ledger = Ledger.read(store, session.id)
    by_id = {e.id: e for e in ledger.experiments}
    base_config = session.target.base_config()

    def experiment(e: m.Experiment) -> dict[str, Any]:
        base = by_id[e.base_experiment_id].config if e.base_experiment_id in by_id else base_config
        found = ledger.figure(e)
        return {
            "number": e.number,  # the session's experiment number, as the summaries and investigate read it
            "id": e.id,  # the ledger's row id (shared by every session of the home)
            "plan_items": e.plan_items,
            "kind": e.kind,
            "change": str(e.config.diff(base)),
            "config": str(e.config),
            "status": e.status,
            "verdict": e.verdict,
            "reason": e.reason,
            "failure": e.failure,
            "predicted_change_pct": e.predicted_change_pct,
            "output_tok_s": found[0] if found else None,
            "at_concurrency": found[1] if found else None,
            "runs": found[2] if found else ledger.runs.get(e.id or 0, 0),
            "source": ledger.sources.get(e.id or 0),
        }

    t = session.target
    return {
        "id": session.id,
        "name": session.name,
        "status": session.status,
        "plan": session.plan.name,
        "title": session.plan.title,
        "target": f"{t.model} on {t.gpus}x {t.hardware}",
        "engine": session.engine,
        "model": session.model,
        "locked_by_pid": store.session_lock(session.id),
        "todos": [
            {"content": x.content, "status": x.status, "plan_item": x.plan_item} for x in store.todos(session.id)
        ],
        "experiments": [experiment(e) for e in ledger.experiments],
        "pivots": [
            {"id": p.id, "question": p.question, "options": p.options, "answer": p.answer} for p in ledger.pivots
        ],
        "documents": [{"path": d.path, "kind": d.kind, "status": d.status} for d in ledger.documents],
        "investigations": [
            {**dump(i), "experiment_number": ledger.number(i.experiment_id)} for i in ledger.investigations
        ],
        "usage": [dump(u) for u in ledger.usage],
    }


class SummaryWritten(BaseModel):
    """A status summary rebuilt from the ledger (`pivot summary`)."""

    session: str
    path: str
    resource: str
    html: str | None = None
    notices: list[str] = Field(default_factory=list)
    text: str


def write_summary(
    store: Store,
    paths: Paths,
    session_ref: str,
    *,
    question: str | None,
    options: list[str] | None,
    new: bool,
    html: bool,
) -> SummaryWritten:
    from tools import analysis
    from tools.lessons import learnt_lines
    from tools.reports import SessionRef, write_improvement_docs, write_status_summary

    record = store.get_session(session_ref)
    ref = SessionRef(store, paths, record.id)
    try:
        analysis.analyze(ref)
        analysis.check_plan(ref)
    except PivotError as e:
        ref.notices.append(f"analysis skipped: {e.message}")
    write_improvement_docs(ref)
    doc = write_status_summary(ref, question, options or None, new=new, html=html, learnt=learnt_lines(ref))
    path = paths.home / doc.path
    html_path = path.with_suffix(".html") if html and path.with_suffix(".html").exists() else None
    return SummaryWritten(
        session=record.id,
        path=str(path),
        resource=f"pivot://sessions/{record.id}/status",
        html=str(html_path) if html_path else None,
        notices=list(ref.notices),
        text=path.read_text(encoding="utf-8"),
    )


class Prediction(BaseModel):
    """The digital twin's prediction of a benchmark sweep: every number is simulated, not measured."""

    source: str = "simulated"
    target: str
    flags: str
    resolved: dict[str, Any] = Field(description="What SGLang would resolve: tp, pp, ep, KV pool, caps.")
    no_effect: list[str] = Field(description="Flags SGLang 0.5.23 accepts and reads nowhere.")
    not_modelled: list[str] = Field(description="Flags the twin accepts but does not model.")
    levels: list[dict[str, Any]] = Field(description="One per concurrency, with bench_serving's keys.")
    crash: str | None = Field(default=None, description="A crash under load the twin predicts, with its log line.")


LEVEL_KEYS = ("max_concurrency", "completed", "failed", "output_throughput", "total_throughput",
              "max_output_tokens_per_s", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms")  # fmt: skip


def predict(
    flags: str,
    *,
    plan_ref: str | None,
    model_profile: str | None,
    hardware: str | None,
    gpus: int | None,
    concurrency: list[int] | None,
    num_prompts: int | None,
    noise: float,
) -> Prediction:
    from agent.cli.sim import build_twin
    from agent.plans import load_plan
    from agent.settings import settings
    from tools.engines.sim.options import DEFAULT_MODEL_PROFILE

    plan = load_plan(plan_ref or settings().demo_plan)
    t = plan.target
    if noise < 0:
        raise PivotError("noise must be >= 0")
    line = flags.strip() or (str(t.flags or "") if plan_ref else "")
    twin = build_twin(
        model_profile or t.model_profile or DEFAULT_MODEL_PROFILE,
        hardware or t.hardware,
        gpus or t.gpus,
        tuple(_split(line)),
    )
    update: dict[str, Any] = {}
    if concurrency:
        update["concurrency"] = m.parse_levels(concurrency)
    if num_prompts:
        update["num_prompts"] = num_prompts
    spec = m.BenchSpec.model_validate({**plan.workload.model_dump(), **update})
    results = twin.predict(spec, noise=noise)
    crash = next((f"{s.fault.name} at concurrency {lv.max_concurrency}: {s.fault.log}" for lv, s in results
                  if s.fault is not None), None)  # fmt: skip
    levels = []
    for level, _ in results:
        row = {k: getattr(level, k, None) for k in LEVEL_KEYS}
        extra = level.model_extra or {}
        row["mean_gpu_power_w"] = extra.get("mean_gpu_power_w")
        levels.append(row)
    return Prediction(
        target=f"{twin.model.title} on {gpus or t.gpus}x {twin.hw.title}, SGLang 0.5.23 twin",
        flags=line,
        resolved=dict(twin.resolved),
        no_effect=list(twin.no_effect),
        not_modelled=list(twin.not_modelled),
        levels=levels,
        crash=crash,
    )


class AuditResult(BaseModel):
    """The engine's verdict on each flag before any GPU time is spent."""

    would_start: bool = Field(description="False when a flag would stop the server from starting.")
    rows: list[dict[str, Any]] = Field(
        description="flag, status (ok|unknown|ambiguous|deprecated|invalid|noop), message"
    )
    parser: str
    noops: str
    version: str
    notes: list[str]


def audit_flags(flags: str, engine: str, engine_version: str | None) -> AuditResult:
    from agent.contracts import load_engine

    if not flags.strip():
        raise PivotError("no flags to audit", hint="e.g. flags='--tp-size 8 --enable-mscclpp'")
    report = load_engine(engine).audit(m.ServerConfig.parse(_split(flags)), version=engine_version)
    return AuditResult(
        would_start=not report.blocking,
        rows=[r.model_dump(include={"flag", "status", "message"}) for r in report.rows],
        parser=report.parser,
        noops=report.noops,
        version=report.version,
        notes=list(report.notes),
    )


def status_text(store: Store, paths: Paths, session_id: str) -> str:
    """The latest status summary's markdown."""
    from tools.reports import latest_status_doc

    record = store.get_session(session_id)
    latest = latest_status_doc(store.documents(record.id))
    if latest is None:
        raise PivotError(f"session {record.id} has no status summary yet", hint="write_summary writes one")
    return (paths.home / latest.path).read_text(encoding="utf-8")


def document_text(store: Store, paths: Paths, session_id: str, name: str) -> str:
    """A document of the session by its file name (one the ledger records: nothing else is read)."""
    record = store.get_session(session_id)
    for d in store.documents(record.id):
        if d.path.rsplit("/", 1)[-1] == name:
            return (paths.home / d.path).read_text(encoding="utf-8")
    raise PivotError(f"session {record.id} has no document {name!r}")
