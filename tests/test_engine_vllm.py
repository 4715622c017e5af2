"""vLLM as the second engine, through the Engine contract only: its catalog (generated from vLLM 0.33.0's parser), the
audit, its parallelism, failure rules and gauges, and launches against a fake `vllm serve` (tests/fake_vllm.py) that
parses its argv with the same catalog and serves the OpenAI endpoints, /health and /metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import models as m
from agent.cli import cli
from agent.contracts import Engine, Parallelism, engine_names, load_engine
from agent.plans import load_plan
from agent.session import Session
from tests.procs import gone
from tools.analysis import layout
from tools.engines.catalog import load_catalog
from tools.engines.http import launch_in_session
from tools.engines.process import FlagsRefused, ServerStartError, live_servers
from tools.engines.vllm import GAUGES, VLLMEngine

ROOT = Path(__file__).resolve().parents[1]
FAKE = [sys.executable, str(ROOT / "tests" / "fake_vllm.py"), "serve"]
SPEC = m.BenchSpec(concurrency=[1, 4], random_input_len=16, random_output_len=8, random_range_ratio=1.0,
                   min_prompts=2, prompts_per_concurrency=1, endpoint="completions")  # fmt: skip


@pytest.fixture(autouse=True)
def _no_server_left():
    yield
    assert live_servers() == []


@pytest.fixture
def session(store, paths, small_plan):
    s = Session.create(store, paths, small_plan, engine_name="vllm")
    yield s
    s.close()


def fake(**kw) -> VLLMEngine:
    return VLLMEngine(command=FAKE, stop_grace_s=5, ready_timeout_s=60, **kw)


# ---------------------------------------------------------------------------------------------- catalog and audit


def test_the_catalog_is_vllms_parser_with_its_spellings():
    catalog = load_catalog("vllm", "0.33.0")
    assert len(catalog.flags) > 300 and catalog.prog == "vllm serve"
    values = catalog.parse(["MODEL", "-tp", "2", "--max_num_seqs", "64", "--no-enable-prefix-caching"])
    assert values["model_tag"] == "MODEL" and values["tensor_parallel_size"] == 2 and values["max_num_seqs"] == 64
    assert values["enable_prefix_caching"] is False and values["gpu_memory_utilization"] == 0.92
    assert catalog.parse(["--disable-expert-parallel"])["enable_expert_parallel"] is False
    assert catalog.parse(["--max-model-len", "8k"])["max_model_len"] == 8000  # vLLM's human-readable ints
    assert catalog.parse(["--max-model-len", "1K"])["max_model_len"] == 1024


def test_audit_flags_for_vllm_says_what_vllm_refuses_and_what_is_deprecated():
    flags = ["--tensor-parallel-size", "2", "--task", "generate", "--disable-cascade-attn", "--enable-prefix",
             "--gpu-memory-utilization", "x", "--log-config-file", "f.json", "--max_num_seqs", "8"]  # fmt: skip
    result = CliRunner().invoke(cli, ["audit-flags", "--engine", "vllm", "--json", "--", *flags])
    assert result.exit_code == 1, result.output
    rows = {r["flag"]: r for r in json.loads(result.stdout)}
    assert rows["--tensor-parallel-size"]["status"] == "ok" and rows["--max_num_seqs"]["status"] == "ok"
    assert rows["--task"]["status"] == "unknown" and "--runner pooling" in rows["--task"]["message"]
    assert rows["--disable-cascade-attn"]["status"] == "deprecated"
    assert "--logging-config.pylogging_config_file" in rows["--log-config-file"]["message"]
    assert rows["--enable-prefix"]["message"].startswith("Abbreviation of --enable-prefix-caching")
    assert rows["--gpu-memory-utilization"]["status"] == "invalid"
    assert "invalid float value: 'x'" in rows["--gpu-memory-utilization"]["message"]


def test_the_shipped_vllm_plan_audits_clean_and_runs_on_one_gpu():
    plan = load_plan("llama70b-fp8-h200x1-vllm")
    engine = VLLMEngine()
    assert plan.target.engine == "vllm" and plan.target.gpus == 1
    for item in plan.items:
        config = item.apply(plan.target.base_config())
        assert [i for i in engine.validate(config) if i.status != "ok"] == [], item.id
    assert engine.parallelism(plan.target.base_config()) == Parallelism()


# ---------------------------------------------------------------------------------------------- what the engine knows


def test_vllm_is_an_installed_engine_and_a_choice_of_every_command():
    assert "vllm" in engine_names()
    assert isinstance(load_engine("vllm"), Engine)
    result = CliRunner().invoke(cli, ["run", "glm5-nvfp4-rtxpro6000x8", "--engine", "nope"])
    assert result.exit_code == 2 and "installed:" in result.output and "vllm" in result.output


def test_parallelism_is_read_as_vllm_reads_its_flags():
    engine = VLLMEngine()
    config = m.ServerConfig.parse("-tp 4 --data-parallel-size 2 --pipeline-parallel-size 2 --enable-expert-parallel")
    assert engine.parallelism(config) == Parallelism(tp=4, pp=2, ep=8, dp=2)  # EP spans TP x DP
    assert layout(config, engine=engine) == {"tp": 4, "pp": 2, "ep": 8}
    assert engine.parallelism(m.ServerConfig.parse("--tensor_parallel_size 2")).tp == 2
    assert engine.not_modelled(config) == []


VLLM_LOGS = [
    ("oom", ["ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
             "initializing the engine.", "RuntimeError: Engine core initialization failed. See root cause above."]),
    ("oom", ["ValueError: To serve at least one request with the model's max seq len (131072), (40.0 GiB KV cache is "
             "needed, which is larger than the available KV cache memory (12.3 GiB)."]),
    ("oom", ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB"]),
    ("unrecognized-argument", ["vllm serve: error: unrecognized arguments: --task generate"]),
    ("argument-validation", ["pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig",
                             "  Value error, data_parallel_size_local (2) must be <= data_parallel_size (1)"]),
    ("argument-validation", ['  File "/usr/lib/python3/dist-packages/vllm/engine/arg_utils.py", line 1500, in '
                             "create_engine_config", "ValueError: --grpc and --grpc-port are mutually exclusive."]),
    ("engine-not-installed", ["bash: vllm: command not found"]),
    ("engine-not-installed", ["/usr/bin/python3: Error while finding module specification for "
                              "'vllm.entrypoints.openai.api_server' (ModuleNotFoundError: No module named 'vllm')"]),
    ("cuda-error", ["RuntimeError: CUDA error: an illegal memory access was encountered"]),
    ("port-in-use", ["OSError: [Errno 98] Address already in use"]),
]  # fmt: skip


@pytest.mark.parametrize(("failure", "lines"), VLLM_LOGS)
def test_vllms_failure_messages_are_classified(failure, lines):
    assert VLLMEngine().diagnose(lines).failure == failure


def test_the_gauges_are_vllms():
    from tools.telemetry import parse_metrics

    text = textwrap.dedent(
        """\
        # TYPE vllm:num_requests_running gauge
        vllm:num_requests_running{engine="0",model_name="m"} 12.0
        vllm:num_requests_running{engine="1",model_name="m"} 3.0
        # TYPE vllm:num_requests_waiting gauge
        vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
        # TYPE vllm:kv_cache_usage_perc gauge
        vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
        vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
        """
    )
    # requests add up across the data-parallel engines; KV usage is the fuller one's
    assert parse_metrics(text, GAUGES) == {"num_running_reqs": 15.0, "num_queue_reqs": 5.0, "token_usage": 0.75}


def test_the_command_line_binds_loopback_unless_told():
    engine = VLLMEngine(port=8123)
    argv, host, port = engine.argv(m.ServerConfig.parse("--model m -tp 2"))
    assert argv == ["vllm", "serve", "--model", "m", "-tp", "2", "--host", "127.0.0.1", "--port", "8123"]
    argv, host, port = engine.argv(m.ServerConfig.parse("--model m --host 0.0.0.0 --port=9000"))
    assert argv == ["vllm", "serve", "--model", "m", "--host", "0.0.0.0", "--port", "9000"]
    assert (host, port) == ("0.0.0.0", 9000)
    api = VLLMEngine(launcher="api_server", python="/opt/vllm/bin/python", prefix="docker exec box")
    assert api.launch_command() == ["docker", "exec", "box", "/opt/vllm/bin/python", "-m",
                                    "vllm.entrypoints.openai.api_server"]  # fmt: skip


def test_flags_vllm_refuses_are_not_launched(session, store):
    with pytest.raises(FlagsRefused, match="--task is unknown"):
        launch_in_session(session, m.ServerConfig.parse("--model m --task generate"), engine=fake())
    assert store.servers(session.id) == []


# ---------------------------------------------------------------------------------------------- against the fake


@pytest.mark.slow
def test_launch_ready_benchmark_metrics_and_stop_against_the_fake(session, store, tmp_path):
    dep = launch_in_session(session, m.ServerConfig.parse("--model fake-8b --max-num-seqs 2"), engine=fake())
    try:
        assert dep.argv is not None and dep.argv[-4:-2] == ["--host", "127.0.0.1"]
        dep.wait_ready(60)
        out = tmp_path / "runs.jsonl"
        result = dep.benchmark(SPEC, output_file=out)
        assert [(lv.max_concurrency, lv.completed, lv.failed) for lv in result.levels] == [(1, 2, 0), (4, 4, 0)]
        assert len(out.read_text().splitlines()) == 2 and result.levels[0].backend == "vllm-oai"
        assert [t.max_concurrency for t in dep.level_telemetry] == [1, 4]
        assert dep.level_telemetry[1].server_metrics.get("num_running_reqs_max", 0) <= 2.0  # --max-num-seqs 2
        metrics = dep.metrics()["metrics"]
        assert set(metrics) == {"num_running_reqs", "num_queue_reqs", "token_usage"}
        assert any("Application startup complete." in line for line in dep.log_tail(20))
    finally:
        dep.stop()
    assert gone(store.servers(session.id)[0].pid, 1.0)
    assert store.servers(session.id)[0].status == "stopped"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "failure"),
    [("--model m --foo 1", "unrecognized-argument"), ("--model m --gpu-memory-utilization 0.05", "oom")],
)
def test_the_fakes_refusals_are_classified_by_vllms_rules(session, store, flags, failure):
    dep = launch_in_session(session, m.ServerConfig.parse(flags), engine=fake(), force=True)
    with pytest.raises(ServerStartError) as info:
        dep.wait_ready(60)
    assert info.value.failure == failure
    assert store.servers(session.id)[0].failure == failure
    dep.stop()


@pytest.mark.slow
def test_launch_bench_with_the_vllm_engine_from_the_cli():
    command = " ".join(FAKE)
    result = CliRunner().invoke(
        cli,
        ["launch-bench", "--engine", "vllm", "-o", f"command={command}", "--concurrency", "1,4", "--input-len", "16",
         "--output-len", "8", "--json", "--", "--model", "fake-8b"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    levels = json.loads(result.stdout)
    assert [lv["max_concurrency"] for lv in levels] == [1, 4] and all(lv["failed"] == 0 for lv in levels)


# ---------------------------------------------------------------------------------------------- the generator


def test_the_generator_finds_deprecated_and_noop_flags_in_the_source(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_vllm_catalog as gen
    finally:
        sys.path.pop(0)
    src = tmp_path / "vllm" / "engine"
    src.mkdir(parents=True)
    (src / "arg_utils.py").write_text(
        '_OLD_DEPRECATION_MESSAGE = (\n    "--old-flag is deprecated and has no effect. Use --new-flag instead."\n)\n'
    )
    flags = [
        {"opts": ["--old-flag"], "dest": "old_flag"},
        {"opts": ["--new-flag"], "dest": "new_flag"},
        {"opts": ["--device-ids"], "dest": "device_ids"},
    ]
    helps = {"device_ids": "GPU ids. Note: has no effect with Ray executors.", "new_flag": "", "old_flag": ""}
    deprecated, noop = gen.detect(tmp_path, flags, helps)
    assert [(d["flag"], d["replacement"]) for d in deprecated] == [("--old-flag", "--new-flag")]
    assert [n["flag"] for n in noop] == ["--old-flag"]  # "no effect with Ray" is a condition, not a no-op


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("PIVOT_VLLM_SOURCE"), reason="set PIVOT_VLLM_SOURCE to an unpacked vllm 0.33.0 wheel"
)
def test_the_committed_catalog_is_what_the_generator_writes_from_vllms_source():
    proc = subprocess.run(
        [sys.executable, "scripts/gen_vllm_catalog.py", "--source", os.environ["PIVOT_VLLM_SOURCE"], "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
