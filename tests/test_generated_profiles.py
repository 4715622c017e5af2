"""Profiles pivot generates when a plan names none (config.json, NVML or the CPU), recorded with the session; and the
analysis that checks measurements against the profiles' physics, or reads them alone where there is no roofline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import models as m
from agent.cli import cli
from agent.plans import load_plan, parse_plan
from agent.session import Session
from tests.factories import bench_level
from tools import reports
from tools.analysis import analyze
from tools.profiles import load_hardware
from tools.profiles.generated import (
    cpu_profile,
    find_model_config,
    gpu_profile,
    model_from_config,
    model_vocab_size,
)
from tools.profiles.target import session_profiles, target_profiles
from tools.reports import SessionRef

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 384,
    "intermediate_size": 1024,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 12000,
    "max_position_embeddings": 2048,
    "dtype": "bfloat16",
}


def write_model(where: Path, config: dict, tokenizer_ids: int | None = None) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "config.json").write_text(json.dumps(config))
    if tokenizer_ids is not None:
        vocab = {f"w{i}": i for i in range(tokenizer_ids - 1)}
        tok = {"model": {"type": "WordLevel", "vocab": vocab}, "added_tokens": [{"id": tokenizer_ids - 1}]}
        (where / "tokenizer.json").write_text(json.dumps(tok))
    return where


def plan_text(model: str) -> str:
    return f"""
name = "own"
title = "A model and host pivot ships no profile for"
[target]
model = "{model}"
gpus = 1
engine = "vllm"
flags = "--model {model} --max-num-seqs 8"
[workload]
endpoint = "completions"
concurrency = [1, 8]
[[items]]
id = "01"
tier = 1
kind = "flag"
title = "No prefix caching"
flags = "--no-enable-prefix-caching"
hypothesis = "Hashing costs."
expected_impact = "+1% output tok/s"
"""


def plan_for(model: str) -> m.Plan:
    return parse_plan(plan_text(model))


def test_a_dense_config_gives_its_shape_parameters_and_kv_size(tmp_path):
    path = write_model(tmp_path / "m", LLAMA) / "config.json"
    p = model_from_config(path, str(tmp_path / "m"))
    assert (p.kind, p.layers, p.hidden_size, p.experts, p.vocab_size) == ("dense", 3, 384, 0, 12000)
    # attention: 3 x (2 x 384 x 6 x 64 + 2 x 384 x 2 x 64); MLP 3 x 3 x 384 x 1024; embedding and lm_head 12000 x 384
    assert p.total_params == pytest.approx(3 * (2 * 384 * 384 + 2 * 384 * 128) + 9 * 384 * 1024 + 2 * 12000 * 384)
    assert p.kv_bytes("auto") == 3 * 2 * 2 * 64 * 2  # layers x (K, V) x KV heads x head_dim x bf16
    assert [g.name for g in p.dense_gemms] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    assert p.dense_gemms[0].n == (6 + 2 * 2) * 64 and p.source.startswith("generated from")


def test_moe_and_mla_configs_give_experts_and_the_latent_kv(tmp_path):
    moe = {**LLAMA, "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512}
    p = model_from_config(write_model(tmp_path / "moe", moe) / "config.json", "moe")
    assert (p.kind, p.experts, p.experts_per_token, p.expert_ffn, p.moe_layers) == ("moe", 8, 2, 512, 3)
    assert p.active_params < p.total_params
    mla = {**moe, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "first_k_dense_replace": 1, "n_shared_experts": 1}
    q = model_from_config(write_model(tmp_path / "mla", mla) / "config.json", "mla")
    assert q.moe_layers == 2 and q.kv_replicated_across_tp and q.kv_bytes("bf16") == 3 * (512 + 64) * 2
    assert {part.name for part in q.parts} >= {"mlp", "experts", "shared_experts"}


# Shapes of real architectures' config.json files, cut to the keys that matter here (values as the hub ships them,
# layers and widths made small): what decides tied embeddings and sliding windows.
QWEN2_TIED = {
    **LLAMA,
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 21,
    "vocab_size": 16000,
}
MISTRAL_SWA = {
    **LLAMA,
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "sliding_window": 64,
    "num_key_value_heads": 1,
    "vocab_size": 50048,
    "tie_word_embeddings": False,
}
GEMMA2 = {
    **LLAMA,
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "sliding_window": 4096,
    "num_hidden_layers": 4,
}  # no tie_word_embeddings: Gemma's config class ties them
GEMMA3 = {
    **LLAMA,
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "sliding_window": 512,
    "num_hidden_layers": 6,
    "tie_word_embeddings": True,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
}
QWEN2_SWA = {**QWEN2_TIED, "use_sliding_window": True, "max_window_layers": 1}


@pytest.mark.parametrize(
    ("config", "tied", "window", "window_layers"),
    [(LLAMA, False, None, 0), (QWEN2_TIED, True, None, 0), (MISTRAL_SWA, False, 64, 3), (GEMMA2, True, 4096, 2),
     (GEMMA3, True, 512, 5), (QWEN2_SWA, True, 4096, 2)],
)  # fmt: skip
def test_tied_embeddings_and_sliding_windows_are_read_from_each_architecture(tmp_path, config, tied, window,
                                                                             window_layers):  # fmt: skip
    p = model_from_config(write_model(tmp_path / "m", config) / "config.json", "m")
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    embedding = sum(part.params for part in p.parts if part.name.startswith(("embedding", "lm_head")))
    assert embedding == (1 if tied else 2) * vocab * hidden  # a tied lm_head is the embedding: counted once
    assert any(part.name.startswith("lm_head") and part.kind == "dense" for part in p.parts)  # still read each step
    assert (p.sliding_window, p.sliding_window_layers) == (window, window_layers)


def test_a_sliding_window_caps_the_kv_a_long_request_reads_in_the_twin(tmp_path):
    from tools.engines.sim.costmodel import CostModel, Parallel

    full = model_from_config(write_model(tmp_path / "full", {**MISTRAL_SWA, "sliding_window": None}) / "config.json",
                             "full")  # fmt: skip
    swa = model_from_config(write_model(tmp_path / "swa", MISTRAL_SWA) / "config.json", "swa")
    assert swa.kv_share(64) == 1.0 and swa.kv_share(6400) == pytest.approx(0.01)
    hw = load_hardware("h200")
    steps = [CostModel(p, hw, Parallel()).decode(64, 64 * 6400) for p in (full, swa)]
    assert steps[1].attention_s < steps[0].attention_s / 10  # 6,400 tokens of context, 64 read


def test_a_hub_id_is_found_in_the_hugging_face_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--org--tiny"
    write_model(repo / "snapshots" / "abc123", LLAMA)
    write_model(repo / "snapshots" / "old", {**LLAMA, "num_hidden_layers": 9})
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert find_model_config("org/tiny") == repo / "snapshots" / "abc123" / "config.json"
    assert find_model_config("org/missing") is None and find_model_config(str(tmp_path / "nowhere")) is None


def test_the_vocabulary_is_the_smaller_of_the_config_and_the_tokenizer(tmp_path):
    assert model_vocab_size(str(write_model(tmp_path / "a", LLAMA, tokenizer_ids=8003))) == 8003
    assert model_vocab_size(str(write_model(tmp_path / "b", LLAMA))) == 12000
    assert model_vocab_size("org/not-here") is None


def test_a_gpu_is_a_shipped_profile_or_its_datasheet_figures_and_a_cpu_knows_only_its_memory():
    h200 = gpu_profile({"name": "NVIDIA H200", "memory_gib": 139.8, "power_limit_w": 700.0})
    assert h200 == load_hardware("h200") and h200.calibrated
    sxm = gpu_profile({"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.6, "power_limit_w": 700.0})
    assert sxm == load_hardware("h100-sxm") and sxm.calibrated  # shipped (its GEMM model borrowed from the H200)
    h100 = gpu_profile({"name": "NVIDIA H100 PCIe", "memory_gib": 79.6, "power_limit_w": 350.0})
    assert (h100.memory_bandwidth_gbs, h100.dense_tflops["bf16"], h100.calibrated) == (2000, 756, False)
    assert h100.has_roofline and "the twin's calibration" in h100.unknown()
    odd = gpu_profile({"name": "NVIDIA Z9", "memory_gib": 10.0, "power_limit_w": None})
    assert not odd.has_roofline and "peaks unknown" in odd.source
    cpu = cpu_profile()
    assert cpu.kind == "cpu" and cpu.memory_gib > 0 and not cpu.has_roofline
    assert cpu.unknown()[:2] == ["the peak memory bandwidth", "the peak compute throughput"]


def test_plan_check_passes_a_plan_that_names_no_profile(tmp_path, monkeypatch):
    import tools.profiles.target as target_mod

    monkeypatch.setattr(target_mod, "detect_hardware", cpu_profile)  # this host, whatever NVML says
    model = write_model(tmp_path / "tiny", LLAMA)
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(plan_text(str(model)))
    result = CliRunner().invoke(cli, ["plan", "check", str(plan_file), "--json"])
    assert result.exit_code == 0, result.output
    problems = json.loads(result.output)["problems"]
    assert [p for p in problems if p["severity"] == "error"] == []
    texts = " | ".join(p["message"] for p in problems)
    assert "model profile generated from" in texts and "hardware detected here" in texts
    assert "predictions are not available for this target" in texts


def test_the_generated_profiles_are_recorded_with_the_session_and_read_back(store, paths, tmp_path, monkeypatch):
    import tools.profiles.target as target_mod

    monkeypatch.setattr(target_mod, "detect_hardware", cpu_profile)
    model = write_model(tmp_path / "tiny", LLAMA)
    with Session.create(store, paths, plan_for(str(model)), engine_name="vllm") as s:
        first = session_profiles(store, s.id)
    assert set(store.get_session(s.id).settings.profiles) == {"model", "hardware"}
    (model / "config.json").unlink()  # a resume on a host without the model's files reads the same figures
    again = session_profiles(store, s.id)
    assert again.model == first.model and again.hardware == first.hardware
    with pytest.raises(Exception, match=r"config\.json is not here"):
        target_profiles(plan_for(str(model)).target)


def test_detected_hardware_is_pinned_to_the_session_a_shipped_profile_too(store, paths, tmp_path, monkeypatch):
    """A campaign on a GPU host whose hardware the plan leaves unset (scripts/gpu_campaign: NVML named the shipped
    h100-sxm) is read elsewhere as it was measured there, not as this host's CPU."""
    import tools.profiles.target as target_mod
    from tools.profiles import load_hardware

    monkeypatch.setattr(target_mod, "detect_hardware", lambda: load_hardware("h100-sxm"))
    model = write_model(tmp_path / "tiny", LLAMA)
    with Session.create(store, paths, plan_for(str(model)), engine_name="vllm") as s:
        there = session_profiles(store, s.id)
    assert there.hardware.name == "h100-sxm"
    monkeypatch.setattr(target_mod, "detect_hardware", cpu_profile)  # read on another host
    here = session_profiles(store, s.id)
    assert here.hardware == there.hardware and "recorded with the session" in " ".join(here.notes)


def _session_with(store, paths, plan: m.Plan, levels: list[m.BenchLevel]) -> str:
    with Session.create(store, paths, plan, engine_name=plan.target.engine) as s:
        e = store.add_experiment(s.id, m.Experiment(kind="baseline", title="baseline", config=plan.target.base_config(),
                                                    workload=plan.workload))  # fmt: skip
        store.add_bench_result(
            e.id, m.BenchResult(spec=plan.workload, engine=plan.target.engine, source="measured", levels=levels)
        )
        store.update_experiment(e.model_copy(update={"status": "finished", "verdict": "baseline"}))
        return s.id


def test_a_level_faster_than_the_profiles_allow_is_a_contradiction_not_a_finding(store, paths):
    """The issue's case: the H200 and Llama 70B profiles named for a tiny model served elsewhere. TPOT 0.5 ms is under
    the 14.7 ms it takes to read 70.6 GB, so the analysis says the profiles do not describe the server."""
    plan = load_plan("llama70b-fp8-h200x1-vllm")
    levels = [bench_level(1, 2000.0, mean_tpot_ms=0.5, mean_itl_ms=0.5), bench_level(8, 9000.0, mean_tpot_ms=0.8)]
    sid = _session_with(store, paths, plan, levels)
    ref = SessionRef(store, paths, sid)
    result = analyze(ref)
    assert result.bottleneck is None and result.levels == []
    texts = [f.text for f in result.findings]
    assert any("The profiles do not describe what was served" in t for t in texts)
    assert not any("x the" in t and "floor" in t for t in texts)  # no "TPOT is 0.03x the floor" sentence
    doc = reports.write_status_summary(ref)
    text = (paths.home / doc.path).read_text()
    assert "No bottleneck named" in text and "The profiles do not describe what was served" in text
    assert "it takes to read" not in text and "bandwidth floor ms" not in text


def test_a_cpu_target_is_analysed_from_its_measurements_and_says_what_is_not_known(store, paths, tmp_path, monkeypatch):
    import tools.profiles.target as target_mod

    monkeypatch.setattr(target_mod, "detect_hardware", cpu_profile)
    model = write_model(tmp_path / "tiny", LLAMA)
    levels = [bench_level(1, 40.0, mean_tpot_ms=20.0), bench_level(8, 230.0, mean_tpot_ms=30.0)]
    sid = _session_with(store, paths, plan_for(str(model)), levels)
    result = analyze(SessionRef(store, paths, sid))
    assert result.bottleneck is None and result.reference_concurrency == 8
    notes = [f.text for f in result.findings if f.kind == "note"]
    assert notes and notes[0].startswith("No roofline for") and "peak memory bandwidth" in notes[0]
    level_texts = [f.text for f in result.findings if f.kind == "level"]
    assert len(level_texts) == 2 and all("(measured)" in t and "floor" not in t for t in level_texts)
    assert "No bottleneck is named" in result.summary


def test_a_model_pivot_cannot_read_is_analysed_from_its_measurements(store, paths, tmp_path):
    """A hub id that is not downloaded here (the engine fetches it): no profile yet, so the measurements alone."""
    levels = [bench_level(1, 40.0, mean_tpot_ms=20.0), bench_level(8, 230.0, mean_tpot_ms=30.0)]
    sid = _session_with(store, paths, plan_for("org/not-downloaded"), levels)
    result = analyze(SessionRef(store, paths, sid))
    assert result.bottleneck is None and result.reference_concurrency == 8
    notes = [f.text for f in result.findings if f.kind == "note"]
    assert notes and "no model profile serves 'org/not-downloaded'" in notes[0]
