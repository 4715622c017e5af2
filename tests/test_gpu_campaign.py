"""The real GPU campaign's parts, exercised on this host without a GPU ([silicon] step 6).

scripts/gpu_campaign/run.sh runs scripts/gpu_campaign/plan.toml on a device machine with `transformers serve`; here
the same plan runs to its end through `pivot run` and `pivot resume` on the command engine, with a stand-in server
(tests/standin_transformers_serve.py) that takes the same options and fails the co-tenant item with PyTorch's CUDA
out-of-memory. The command engine names no model flag of its own (an arbitrary server's command names its model), and
scripts/gpu_serve.py reads the co-tenant's share of the card from the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import models as m
from tools.engines.command import CommandEngine

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "scripts" / "gpu_campaign" / "plan.toml"
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}  # fmt: skip


def _gpu_serve():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_serve
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return gpu_serve


def test_the_command_engine_adds_no_model_flag_unless_told():
    target = m.Target(model="/models/x", gpus=1, engine="command", flags=m.ServerConfig.parse("--dtype bfloat16"))
    plain = CommandEngine("transformers serve --port {port} /models/x")
    assert plain.model_flags == ()
    assert target.base_config(plain.model_flags).argv() == ["--dtype", "bfloat16"]
    argv, _ = plain.argv(target.base_config(plain.model_flags))
    assert "--model-path" not in argv and argv[:2] == ["transformers", "serve"]
    told = CommandEngine("python -m sglang.launch_server --port {port}", model_flag="--model-path")
    assert told.model_flags == ("--model-path",)
    assert target.base_config(told.model_flags).argv()[:2] == ["--model-path", "/models/x"]


def test_gpu_serve_reads_the_co_tenants_share_of_the_card():
    gpu_serve = _gpu_serve()
    assert gpu_serve.hold_fraction({}) is None
    assert gpu_serve.hold_fraction({"PIVOT_GPU_HOLD_FRACTION": " "}) is None
    assert gpu_serve.hold_fraction({"PIVOT_GPU_HOLD_FRACTION": "0.9"}) == 0.9
    for bad, words in (("1.5", "between 0 and 1"), ("0", "between 0 and 1"), ("most", "is not a number")):
        with pytest.raises(SystemExit, match=words):
            gpu_serve.hold_fraction({"PIVOT_GPU_HOLD_FRACTION": bad})


def pivot(home: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env, "PIVOT_HOME": str(home)}, cwd=ROOT)  # fmt: skip


@pytest.mark.slow
def test_the_gpu_plan_runs_to_its_end_on_the_command_engine(tmp_path):
    model = tmp_path / "llama-3.1-8b-random"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_8B))
    env = {"PIVOT_GPU_MODEL": str(model)}
    command = f"{sys.executable} -m tests.standin_transformers_serve serve --continuous-batching --host {{host}} "
    options = ["-o", f"command={command}--port {{port}} {model}", "-o", f"model={model}", "-o", f"cwd={ROOT}"]
    checked = pivot(tmp_path, "plan", "check", str(PLAN), *options, "--json", env=env)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    started = time.monotonic()
    run = pivot(tmp_path, "run", str(PLAN), "--engine", "command", *options, "--json", env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    session = json.loads(run.stdout)["session"]
    for _ in range(4):
        shown = json.loads(pivot(tmp_path, "show", session, "--json", env=env).stdout)
        if shown["session"]["status"] == "finished":
            break
        resumed = pivot(tmp_path, "resume", session, "--answer", "continue", "--json", env=env)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert shown["session"]["status"] == "finished", shown["pivots"]
    print(
        f"the GPU plan on the stand-in: {len(shown['experiments'])} experiments in {time.monotonic() - started:.0f} s"
    )
    by_item = {}
    for e in shown["experiments"]:
        by_item.setdefault(e.get("plan_item") or "baseline", e)
    assert by_item["baseline"]["verdict"] == "baseline"
    assert by_item["02"]["verdict"] == "adopted" and by_item["04"]["verdict"] == "regressed"
    # as on the H100: eager attention serves the first level and runs out of memory at 32; the co-tenant leaves the
    # server up and every request, the first included, fails with PyTorch's CUDA out-of-memory: both are oom
    eager = by_item["01"]
    assert (eager["status"], eager["failure"], eager["verdict"]) == ("finished", "oom", "crashed"), eager
    oom = by_item["03"]
    assert (oom["status"], oom["failure"], oom["verdict"]) == ("failed", "oom", "crashed"), oom
    assert "CUDA out of memory" in oom["failure_detail"] and "--endpoint" not in oom["failure_detail"]
    assert oom["reason"].startswith("started, then failed every first request (oom): warmup failed"), oom["reason"]
    summary = (tmp_path / "docs_out" / session).glob("status-*.md")
    text = max(summary).read_text()
    assert "started, failed every first request (oom)" in text and "requests failed at 32" in text
    servers = json.loads(pivot(tmp_path, "servers", session, "--json", env=env).stdout)
    assert servers and all(s["status"] != "running" for s in servers)
    assert not any("--model-path" in s["argv"] for s in servers), [s["argv"] for s in servers]
    assert any("PIVOT_GPU_HOLD_FRACTION" in json.dumps(e["config"]) for e in shown["experiments"])


RECORDED = {
    # the first run: the plan with float16 as item 02, the classification and analysis pivot had then
    "2026-12-06-h100": [(None, "baseline"), ("01", "crashed"), ("02", "no_gain"), ("04", "regressed"), ("03", "crashed")],
    # the second, after the fixes: CUDA graphs adopted, both out-of-memory crashes classified oom
    "2026-12-06-h100-cuda-graphs": [
        (None, "baseline"), ("02", "adopted"), ("01", "crashed"), ("04", "regressed"), ("03", "crashed")
    ],
}  # fmt: skip


@pytest.mark.parametrize("run", sorted(RECORDED))
def test_a_recorded_h100_campaign_is_read_as_host_bound(tmp_path, run):
    """A ledger an H100 campaign brought back (scripts/gpu_campaign/recorded/RUN/pivot.db), analysed here:
    transformers serve's TPOT of 35-56 ms at 4 requests for 7 ms of GPU work is host overhead, not the memory
    bandwidth the analysis named when only levels of at most 2 could show the host. The session's hardware was the
    device's (NVML: NVIDIA H100 80GB HBM3, the shipped h100-sxm) and its model a folder there: both are pinned here."""
    import shutil
    import sqlite3

    recorded = ROOT / "scripts" / "gpu_campaign" / "recorded" / run
    (tmp_path / "state").mkdir()
    shutil.copy(recorded / "pivot.db", tmp_path / "state" / "pivot.db")
    model = tmp_path / "llama-3.1-8b-random"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_8B))
    db = sqlite3.connect(tmp_path / "state" / "pivot.db")
    (session, plan_json), = db.execute("select id, plan_json from sessions").fetchall()  # fmt: skip
    plan = json.loads(plan_json)
    plan["target"].update(hardware="h100-sxm", model=str(model))
    db.execute("update sessions set plan_json = ? where id = ?", (json.dumps(plan), session))
    db.commit()
    db.close()
    shown = json.loads(pivot(tmp_path, "show", session, "--json", env={}).stdout)
    verdicts = [(e.get("plan_item"), e["verdict"]) for e in shown["experiments"]]
    assert verdicts == RECORDED[run]
    done = pivot(tmp_path, "analyze", session, "--json", env={})
    assert done.returncode == 0, done.stderr[-3000:]
    analysis = json.loads(done.stdout)["analysis"]
    assert analysis["bottleneck"] == "host_overhead", analysis["bottleneck"]
    low = next(lv for lv in analysis["levels"] if lv["max_concurrency"] == 4)
    assert low["mean_tpot_ms"] > 30 and low["tpot_over_floor"] > 5
    if run.endswith("cuda-graphs"):  # recorded after serving_failure: both crashes are the out-of-memory they were
        crashed = [e for e in shown["experiments"] if e["verdict"] == "crashed"]
        assert [e["failure"] for e in crashed] == ["oom", "oom"], [e["failure"] for e in crashed]
