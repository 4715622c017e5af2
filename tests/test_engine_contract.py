"""The engine contract: every installed engine speaks the Engine protocol, and no caller looks past it (no signature
inspection, no probing of an engine's or a deployment's attributes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent import models as m
from agent.contracts import (
    Diagnosis,
    Engine,
    EngineOptions,
    FlagAudit,
    Parallelism,
    Predictor,
    engine_names,
    load_engine,
)
from agent.errors import PivotError
from tools.engines.base import BaseEngine
from tools.engines.process import FlagsRefused

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"command": {"command": "server --port {port}"}}
# getattr/hasattr on the objects the protocols describe, by the names callers give them
PROBE = re.compile(r"\b(getattr|hasattr)\(\s*(engine|deployment|dep|live\.deployment|session\.engine|self\.engine)\b")


BUILT_IN = ["sglang", "vllm", "sim", "sim-http", "command"]
TP2 = {"vllm": "--tensor-parallel-size 2"}  # each engine's spelling of two-way tensor parallelism
TARGET = m.Target(model="org/m", model_profile="llama-3.3-70b-fp8", hardware="h200", gpus=1)
# What each built-in engine is, member by member: gauges (pivot's names), model flags, a predictor for TARGET,
# whether it has a catalog (an unknown flag is refused), whether the twin leaves flags unmodelled, a seed to draw.
EXPECT = {
    "sglang": {"gauges": "sglang:", "model": ("--model-path", "--model"), "predicts": True, "catalog": True,
               "simulated": False, "seeded": False},
    "vllm": {"gauges": "vllm:", "model": ("--model",), "predicts": False, "catalog": True, "simulated": False,
             "seeded": False},
    "sim": {"gauges": None, "model": ("--model-path", "--model"), "predicts": True, "catalog": True,
            "simulated": True, "seeded": True},
    "sim-http": {"gauges": "sglang:", "model": ("--model-path", "--model"), "predicts": True, "catalog": True,
                 "simulated": True, "seeded": True},
    "command": {"gauges": None, "model": (), "predicts": False, "catalog": False,  # its command names the model
                "simulated": False, "seeded": False},
}  # fmt: skip


def _engine(name: str) -> Engine:
    return load_engine(name, **OPTIONS.get(name, {}))


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_engine_speaks_the_whole_protocol(name):
    assert name in engine_names()
    engine = _engine(name)
    assert isinstance(engine, Engine) and engine.name == name
    assert engine.ready_timeout_s > 0


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_member_behaves_on_every_built_in_engine(name, tmp_path):
    engine, want = _engine(name), EXPECT[name]
    # gauges: pivot's names, mapped to the engine's own Prometheus names
    assert set(engine.gauges) <= {"num_running_reqs", "num_queue_reqs", "token_usage", "gen_throughput"}
    assert all(v.startswith(want["gauges"]) for v in engine.gauges.values()) if want["gauges"] else not engine.gauges
    # Options: declared, and a bad value is one line naming the option
    assert engine.Options is not None and issubclass(engine.Options, EngineOptions)
    with pytest.raises(PivotError, match=rf"^engine '{name}': no option 'no_such_option'"):
        load_engine(name, no_such_option=1, **OPTIONS.get(name, {}))
    # validate and audit: the same rows; a catalog refuses what its engine would
    config = m.ServerConfig.parse("--no-such-flag 1")
    rows = engine.validate(config)
    assert [r.flag for r in rows] == ["--no-such-flag"]
    assert (rows[0].status == "unknown") == want["catalog"] and rows[0].blocking == want["catalog"]
    report = engine.audit(config)
    assert isinstance(report, FlagAudit) and [r.status for r in report.rows] == [r.status for r in rows]
    assert report.blocking == want["catalog"] and report.parser
    # parallelism: the engine's own flag for two-way tensor parallelism, read through its catalog
    lay = engine.parallelism(m.ServerConfig.parse(TP2.get(name, "--tp-size 2")))
    assert isinstance(lay, Parallelism) and lay.tp == (2 if want["catalog"] else 1) and lay.gpus == lay.tp
    # not_modelled: only a simulation leaves flags out
    unmodelled = engine.not_modelled(m.ServerConfig.parse("--enable-torch-compile"))
    assert unmodelled == (["--enable-torch-compile"] if want["simulated"] else [])
    # diagnose: the shared rules, in the engine's order
    assert engine.diagnose(["RuntimeError: CUDA error: an illegal memory access was encountered"]) == Diagnosis(
        "cuda-error", "RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    assert engine.diagnose(["everything is fine"]).failure == "unknown"
    # with_seed: a simulated engine is a new one drawing from the seed; a real one is itself
    seeded = engine.with_seed(7)
    assert isinstance(seeded, Engine) and (seeded is not engine) == want["seeded"]
    # model_flags and predictor
    assert tuple(engine.model_flags) == want["model"]
    base = TARGET.base_config(engine.model_flags).argv()
    assert base[:2] == [want["model"][0], "org/m"] if want["model"] else "org/m" not in base
    predictor = engine.predictor(TARGET)
    assert (predictor is not None) == want["predicts"]
    if predictor is not None:
        assert isinstance(predictor, Predictor)


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_audit_gate_is_the_base_class_and_a_launch_is_audited_once(name, tmp_path, monkeypatch):
    """Given the rows of an audit already made, launch trusts them (validate is not called again) and refuses what
    they refuse; nothing is started, nothing is logged."""
    engine = _engine(name)
    assert type(engine).launch is BaseEngine.launch  # no engine writes its own gate
    monkeypatch.setattr(engine, "validate", lambda config: pytest.fail("the launch audited again"))
    refused = [m.FlagIssue(flag="--tp-size", status="unknown", message="as the caller's audit says")]
    with pytest.raises(FlagsRefused, match="--tp-size is unknown: as the caller's audit says"):
        engine.launch(m.ServerConfig.parse("--tp-size 1"), tmp_path / "server.log", issues=refused)
    assert not (tmp_path / "server.log").exists()


def test_a_plugin_engine_missing_members_is_named_with_what_it_lacks(monkeypatch):
    from agent import plugins
    from agent.errors import PivotError

    class Half:
        name = "half"

        def validate(self, config):
            return []

    monkeypatch.setattr(plugins, "load", lambda group, name: Half)
    with pytest.raises(PivotError, match=r"lacks .*audit.*diagnose") as info:
        load_engine("half")
    assert "BaseEngine" in (info.value.hint or "")


def test_no_caller_inspects_signatures_or_probes_engines():
    offenders = []
    for path in [*(ROOT / "agent").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]:
        text = path.read_text()
        for n, line in enumerate(text.splitlines(), 1):
            if ("inspect.signature(" in line or PROBE.search(line)) and "contract: what a plugin lacks" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders
