"""Ledgers for report and analysis tests: a plan's campaign run on the digital twin (SimEngine), in seconds.

A fixed, minimal campaign, kept apart from the agent (agent/autopilot.py) on purpose so that the report and
analysis tests do not move when the method does: audit each item's flags, launch the twin, benchmark once per
experiment with telemetry per level, and judge each change against the best so far (+-2% at the top level).
Numbers are the twin's; nothing is written by hand. tests/test_agent.py covers the agent's own campaigns.
"""

from __future__ import annotations

from agent import models as m
from agent.errors import PivotError
from agent.plans import load_plan
from agent.session import Paths, Session
from agent.store import Store
from tools.engines.sim.engine import SimEngine, SimLaunchError

NOISE_PCT = 2.0


def run_experiment(
    session: Session,
    engine: SimEngine,
    config: m.ServerConfig,
    *,
    kind: m.ExperimentKind = "change",
    plan_item: str | None = None,
    title: str = "",
    hypothesis: str = "",
    base_id: int | None = None,
) -> m.Experiment:
    """Record one experiment: audit, launch, benchmark every level with its telemetry; failures are recorded."""
    store, spec = session.store, session.plan.workload
    e = store.add_experiment(
        session.id,
        m.Experiment(
            plan_item=plan_item,
            kind=kind,
            title=title,
            hypothesis=hypothesis,
            config=config,
            base_experiment_id=base_id,
            workload=spec,
            status="running",
            started_at=m.utcnow(),
        ),
    )
    audit = engine.validate(config)
    e = e.model_copy(update={"audit": audit})
    blocking = [i for i in audit if i.blocking]
    if blocking:
        e = e.model_copy(
            update={
                "status": "failed",
                "verdict": "ruled_out",
                "failure": "unrecognized-argument",
                "reason": "SGLang 0.5.23 refuses " + "; ".join(f"{i.flag}: {i.message}" for i in blocking),
                "finished_at": m.utcnow(),
            }
        )
        return store.update_experiment(e)
    log = session.paths.logs_dir(session.id) / f"{e.id}.log"
    try:
        dep = engine.launch(config, log)
    except SimLaunchError as err:
        e = e.model_copy(
            update={
                "status": "failed",
                "verdict": "crashed",
                "failure": err.failure,
                "reason": err.message,
                "log_path": str(log),
                "finished_at": m.utcnow(),
            }
        )
        return store.update_experiment(e)
    result = m.BenchResult(spec=spec, engine="sim", source="simulated")
    tels = []
    for c in spec.concurrency:
        one = dep.benchmark(spec.model_copy(update={"concurrency": [c]}))
        result.levels += one.levels
        tel = dep.telemetry()
        if tel.max_concurrency == c:
            tels.append(tel)
    result.finished_at = m.utcnow()
    dep.stop()
    run_id = store.add_bench_result(e.id, result)
    for tel in tels:
        store.add_telemetry(e.id, tel, run_id=run_id)
    failed = [lv for lv in result.levels if lv.failed]
    update = {"status": "finished", "log_path": str(log), "finished_at": m.utcnow()}
    if failed:
        lv = failed[0]
        update |= {
            "verdict": "crashed",
            "failure": "cuda-error",
            "reason": f"crashed under load at concurrency {lv.max_concurrency}: {sorted(lv.errors)[0]}",
        }
    return store.update_experiment(e.model_copy(update=update))


def _top(store: Store, e: m.Experiment) -> m.BenchLevel:
    levels = store.bench_results(e.id)[-1].levels
    return max(levels, key=lambda lv: lv.max_concurrency or 0)


def judge(store: Store, e: m.Experiment, base: m.Experiment) -> m.Experiment:
    """Adopted, no gain or regressed, by the change of output tok/s at the top level."""
    if e.verdict is not None:
        return e
    before, after = _top(store, base), _top(store, e)
    change = (after.output_throughput - before.output_throughput) / before.output_throughput * 100
    verdict = "adopted" if change >= NOISE_PCT else "regressed" if change <= -NOISE_PCT else "no_gain"
    reason = (
        f"{change:+.1f}% output tok/s at concurrency {after.max_concurrency} "
        f"({before.output_throughput:,.0f} -> {after.output_throughput:,.0f}, experiment {base.id} -> {e.id})"
    )
    if verdict == "no_gain":
        reason += f", inside the {NOISE_PCT:.0f}% noise band"
    return store.update_experiment(e.model_copy(update={"verdict": verdict, "reason": reason}))


def campaign(
    store: Store,
    paths: Paths,
    plan_name: str,
    *,
    model_profile: str,
    hardware: str,
    gpus: int,
    items: list[str] | None = None,
    name: str | None = None,
) -> str:
    """A session with the baseline and the plan's flag/config items (or `items`) run on the twin; its id."""
    plan = load_plan(plan_name)
    engine = SimEngine(model_profile=model_profile, hardware=hardware, gpus=gpus)
    with Session.create(store, paths, plan, name=name or plan.name, engine=engine) as session:
        base = run_experiment(session, engine, plan.target.base_config(), kind="baseline", title="baseline")
        base = store.update_experiment(
            base.model_copy(update={"verdict": "baseline", "reason": "the plan's base flags"})
        )
        best = base
        for item in plan.items:
            if item.kind not in ("flag", "config") or (items is not None and item.id not in items):
                continue
            e = run_experiment(
                session,
                engine,
                item.apply(best.config),
                plan_item=item.id,
                title=item.title,
                hypothesis=item.hypothesis,
                base_id=best.id,
            )
            e = judge(store, e, best)
            if e.verdict == "adopted":
                best = e
        return session.id


def glm5_campaign(store: Store, paths: Paths, items: list[str] | None = None) -> str:
    """The seeds' setting: GLM-5-NVFP4 on 8x RTX PRO 6000, TP8, levels 1-2048."""
    return campaign(
        store,
        paths,
        "glm5-nvfp4-rtxpro6000x8",
        model_profile="glm-5-nvfp4",
        hardware="rtx-pro-6000-blackwell",
        gpus=8,
        items=items,
    )


def llama_campaign(store: Store, paths: Paths, items: list[str] | None = None) -> str:
    """The dense model on one H200."""
    return campaign(
        store, paths, "llama70b-fp8-h200x1", model_profile="llama-3.3-70b-fp8", hardware="h200", gpus=1, items=items
    )


if __name__ == "__main__":  # build a ledger by hand: python -m tests.twin_ledger HOME glm5|llama
    import sys

    home = Paths.from_env(sys.argv[1])
    with Store(home.db_path) as s:
        which = sys.argv[2] if len(sys.argv) > 2 else "glm5"
        try:
            sid = (glm5_campaign if which == "glm5" else llama_campaign)(s, home)
        except PivotError as err:
            raise SystemExit(str(err)) from err
        print(sid)
