"""A change the engine does not model is not measured: no launch under the twin, no "+0.0%" anywhere, and the
verdict says what would measure it."""

from __future__ import annotations

import pytest
from pydantic_ai import ModelRetry

from agent import loop
from agent import models as m
from agent.plans import parse_plan
from agent.session import Session
from tools import reports
from tools.engines.base import BaseEngine
from tools.engines.command import CommandEngine
from tools.engines.sglang import SGLangEngine
from tools.engines.sim.engine import SimEngine
from tools.engines.sim.http_engine import sim_http_engine
from tools.method import Method

PLAN = """
name = "unmodelled"
title = "Flags the twin does not model"

[target]
model = "org/dense-70b"
model_profile = "llama-3.3-70b-fp8"
hardware = "h200"
gpus = 1
flags = "--tp-size 1"

[workload]
random_input_len = 256
random_output_len = 128
concurrency = [1, 32]

[[items]]
id = "01"
tier = 1
kind = "flag"
title = "Torch compile"
flags = "--enable-torch-compile --torch-compile-max-bs 32"
hypothesis = "Fused kernels."
expected_impact = "+5-10% output tok/s"

[[items]]
id = "02"
tier = 1
kind = "flag"
title = "FP8 KV cache and torch compile"
flags = "--kv-cache-dtype fp8_e4m3 --enable-torch-compile"
hypothesis = "Half the KV bytes."
expected_impact = "+10-20% output tok/s"
"""


def _session(store, paths) -> Session:
    plan = parse_plan(PLAN, source="unmodelled.toml")
    t = plan.target
    options = {"model_profile": t.model_profile, "hardware": t.hardware, "gpus": t.gpus, "noise": 0.01}
    return Session.create(store, paths, plan, engine_name="sim", settings=m.SessionSettings(engine_options=options))


def test_each_engine_says_what_it_does_not_model():
    config = m.ServerConfig.parse("--tp-size 1 --enable-torch-compile --attention-backend flashinfer")
    assert SimEngine().not_modelled(config) == ["--enable-torch-compile", "--attention-backend"]
    assert sim_http_engine().not_modelled(config) == ["--enable-torch-compile", "--attention-backend"]
    assert SGLangEngine().not_modelled(config) == []
    assert CommandEngine("server --port {port}").not_modelled(config) == []
    # an engine plugin that does not override it models everything (BaseEngine's default)
    assert BaseEngine().not_modelled(config) == []
    # a no-op flag is not "unmodelled": SGLang itself reads it nowhere, so the twin's "no change" is right
    assert SimEngine().not_modelled(m.ServerConfig.parse("--num-continuous-decode-steps 8")) == []


def test_the_autopilot_spends_no_launch_on_an_unmodelled_change(store, paths):
    with _session(store, paths) as s:
        outcome = loop.run(s)
        sid = s.id
    assert outcome.status in ("pivot", "finished")
    exps = {e.plan_item: e for e in store.experiments(sid) if e.plan_item}
    e1 = exps["01"]
    assert e1.verdict == "not_measured" and store.bench_results(e1.id or 0) == []
    assert "the twin does not model --enable-torch-compile and --torch-compile-max-bs" in (e1.reason or "")
    assert "measure it on a GPU" in (e1.reason or "")
    assert e1.started_at is None and e1.log_path is None  # never launched
    # a change the twin models in part is measured, and the part it does not model is named
    e2 = exps["02"]
    assert e2.verdict in ("adopted", "no_gain", "regressed") and store.bench_results(e2.id or 0)
    assert e2.not_modelled == ["--enable-torch-compile"]
    assert "the twin does not model --enable-torch-compile, also changed" in (e2.reason or "")

    ledger = reports.Ledger.read(store, sid)
    doc = reports.render_improvement(ledger, ledger.plan.item("01"))[0]
    assert "the twin does not model --enable-torch-compile, --torch-compile-max-bs; measure it on a GPU" in doc
    assert "+0.0%" not in doc and "below the expected range" not in doc
    summary = reports.render_status(ledger, 1, "q?", ["a"]).markdown
    tried = next(t for t in reports.tables(summary) if t[0][0] == "experiment")
    row = next(r for r in tried if r[1] == "01")
    assert row[3].startswith("not measured: the twin does not model") and "%" not in row[3]
    assert "To measure on a GPU" in summary


def test_a_launched_unmodelled_change_is_judged_not_measured_and_refuses_other_verdicts(store, paths):
    from tools.docs import record_verdict

    with _session(store, paths) as s:
        method = Method.read(store, s.id)
        base = store.add_experiment(
            s.id,
            m.Experiment(kind="baseline", config=method.plan.target.base_config(), workload=method.plan.workload),
        )
        config = method.plan.item("01").apply(base.config)
        e = store.add_experiment(
            s.id,
            m.Experiment(
                plan_item="01",
                config=config,
                base_experiment_id=base.id,
                workload=method.plan.workload,
                not_modelled=SimEngine().not_modelled(config),
                status="finished",
            ),
        )
        j = Method.read(store, s.id).judge(e)
        assert j.suggestion == "not_measured" and "measure it on a GPU" in j.text

        class Ctx:
            deps = s

        for verdict in ("adopted", "no_gain", "regressed"):
            with pytest.raises(ModelRetry, match="cannot be judged"):
                record_verdict(Ctx(), verdict, "the twin says +0.0%", experiment_id=e.id)  # type: ignore[arg-type]
        done = record_verdict(Ctx(), "not_measured", "no effect in the twin", experiment_id=e.id)  # type: ignore[arg-type]
        assert done.verdict == "not_measured" and "measure it on a GPU" in done.reason
        # a change the twin models cannot be called not measured
        kv = store.add_experiment(
            s.id,
            m.Experiment(
                plan_item="02",
                config=base.config.with_flags("--kv-cache-dtype fp8_e4m3"),
                base_experiment_id=base.id,
                workload=method.plan.workload,
                status="finished",
            ),
        )
        with pytest.raises(ModelRetry, match="models what it changes"):
            record_verdict(Ctx(), "not_measured", "?", experiment_id=kv.id)  # type: ignore[arg-type]
