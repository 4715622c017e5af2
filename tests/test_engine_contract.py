"""The engine contract: every installed engine speaks the Engine protocol, and no caller looks past it (no signature
inspection, no probing of an engine's or a deployment's attributes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent import models as m
from agent.contracts import Diagnosis, Engine, FlagAudit, Parallelism, engine_names, load_engine

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"command": {"command": "server --port {port}"}}
# getattr/hasattr on the objects the protocols describe, by the names callers give them
PROBE = re.compile(r"\b(getattr|hasattr)\(\s*(engine|deployment|dep|live\.deployment|session\.engine|self\.engine)\b")


@pytest.mark.parametrize("name", ["sglang", "vllm", "sim", "sim-http", "command"])
def test_every_built_in_engine_speaks_the_whole_protocol(name):
    assert name in engine_names()
    engine = load_engine(name, **OPTIONS.get(name, {}))
    assert isinstance(engine, Engine)
    config = m.ServerConfig.parse("--port 8000")
    assert isinstance(engine.parallelism(config), Parallelism)
    assert isinstance(
        engine.diagnose(["RuntimeError: CUDA error: an illegal memory access was encountered"]), Diagnosis
    )
    assert (
        engine.diagnose(["RuntimeError: CUDA error: an illegal memory access was encountered"]).failure == "cuda-error"
    )
    assert isinstance(engine.audit(config), FlagAudit)
    assert isinstance(engine.not_modelled(config), list)
    assert isinstance(engine.with_seed(3), Engine)
    assert engine.ready_timeout_s > 0 and all(isinstance(k, str) for k in engine.gauges)


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
