"""The llama-server engine's own tests, as a plugin package keeps them: installed beside pivot, run with pytest.

    pip install -e /path/to/pivot -e .  &&  python -m pytest tests/

They drive the engine through pivot's contract only (load_engine, audit, launch, benchmark, stop), against a fake
llama-server that parses its argv with this package's catalog.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent import models as m
from agent.contracts import Engine, load_engine
from agent.errors import PivotError
from tools.engines.process import FlagsRefused

FAKE = [sys.executable, str(Path(__file__).with_name("fake_llama_server.py"))]


def engine(**options: object) -> Engine:
    return load_engine("llama-server", command=FAKE, ready_timeout_s=30, stop_grace_s=5, **options)


def test_it_is_installed_as_an_engine_that_speaks_the_contract():
    assert isinstance(load_engine("llama-server"), Engine)
    assert load_engine("llama-server").model_flags[0] == "-m"


def test_the_audit_is_its_own_catalogs_in_its_own_words():
    report = load_engine("llama-server").audit(
        m.ServerConfig.parse("-m x.gguf -c 8192 -ngl all -fa maybe --memory-f32")
    )
    rows = {r.flag: r for r in report.rows}
    assert rows["-c"].status == "ok" and rows["-ngl"].status == "ok"  # -ngl takes its own type: a number or all
    assert rows["-fa"].status == "invalid" and "invalid choice: 'maybe'" in (rows["-fa"].message or "")
    assert rows["--memory-f32"].status == "unknown" and "--cache-type-k f32" in (rows["--memory-f32"].message or "")
    assert report.parser == "shipped catalog of llama-server b4000"


def test_a_bad_option_is_one_line_that_names_it():
    with pytest.raises(PivotError, match=r"^engine 'llama-server': option port='abc': Input should be a valid integer"):
        load_engine("llama-server", port="abc")
    with pytest.raises(PivotError, match=r"no option 'colour'"):
        load_engine("llama-server", colour="blue")


def test_a_plan_gets_its_model_as_m_not_as_a_flag_it_never_wrote():
    target = m.Target(model="/models/qwen.gguf", hardware="h200", gpus=1, engine="llama-server",
                      flags=m.ServerConfig.parse("-c 8192"))  # fmt: skip
    assert target.base_config(load_engine("llama-server").model_flags).argv() == [
        "-m",
        "/models/qwen.gguf",
        "-c",
        "8192",
    ]


def test_flags_it_refuses_are_not_launched(tmp_path):
    with pytest.raises(FlagsRefused, match="--memory-f32 is unknown"):
        engine().launch(m.ServerConfig.parse("-m x.gguf --memory-f32"), tmp_path / "server.log")
    with pytest.raises(PivotError, match="give the model: -m PATH"):
        engine().launch(m.ServerConfig.parse("-c 4096"), tmp_path / "server.log")


def test_launch_benchmark_read_and_stop(tmp_path):
    deployment = engine().launch(m.ServerConfig.parse("-m qwen.gguf -np 4 --metrics"), tmp_path / "server.log")
    try:
        deployment.wait_ready(30)
        assert deployment.argv is not None and deployment.argv[-4:-2] == ["--host", "127.0.0.1"]
        result = deployment.benchmark(m.BenchSpec(random_input_len=16, random_output_len=8, num_prompts=8,
                                                  concurrency=[1, 4]))  # fmt: skip
        assert [lv.completed for lv in result.levels] == [8, 8] and all(lv.failed == 0 for lv in result.levels)
        assert "num_running_reqs" in deployment.metrics()["metrics"]
    finally:
        deployment.stop()
    assert not deployment.alive()


def test_a_context_that_does_not_fit_is_classified_oom(tmp_path):
    deployment = engine().launch(m.ServerConfig.parse("-m qwen.gguf -c 262144"), tmp_path / "server.log")
    with pytest.raises(PivotError):
        deployment.wait_ready(30)
    deployment.stop()
    assert deployment.failure == "oom"
