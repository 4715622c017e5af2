"""Profiles pivot makes itself when a plan names none: the model's from its config.json, the hardware from NVML or
this host's CPU; recorded with the session (tools/profiles/target.py) so a resume and the reports see the same.

    config = find_model_config("Qwen/Qwen2.5-7B-Instruct")     # a local directory, else the Hugging Face cache
    model = model_from_config(config, "Qwen/Qwen2.5-7B-Instruct")
    hardware = detect_hardware()                                 # NVML's GPU 0 with datasheet peaks, else "cpu"

From config.json (the text model's, for multimodal configs that nest it): layers, hidden size, attention heads, KV
heads and head size (MLA's latent KV where there is one), MLP width, routed experts and experts per token with their
width, shared experts and the leading dense layers, vocabulary, context length, dtype (FP8 when its quantization
config says so). The parameters by part (attention, MLP, experts, embedding, output layer) and the KV bytes per
token follow from the shape, for a gated MLP (three projections), which every current model has; MLA's attention
weights are counted as standard attention of the same heads (its KV per token is the latent one). A GPU is named by
NVML with its memory and power limit; a shipped profile of the same GPU is used whole (it is calibrated), else its
peaks come from KNOWN_GPUS (datasheets). A host without NVML is its CPU: memory known, bandwidth and peaks not.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

from agent.errors import PivotError
from tools.profiles import HardwareProfile, ModelProfile, load_hardware, names

GIB = float(1 << 30)
# Dense tensor-core peaks (TFLOPS, no sparsity) and memory bandwidth (GB/s), from NVIDIA's datasheets, by a key found
# in NVML's name. The first key that the name contains wins, so the specific come first.
KNOWN_GPUS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("H200", {"bandwidth": 4800, "tflops": {"bf16": 989, "fp8": 1979}, "tdp": 700, "arch": "hopper"}),
    ("H100 NVL", {"bandwidth": 3900, "tflops": {"bf16": 835, "fp8": 1671}, "tdp": 400, "arch": "hopper"}),
    ("H100 PCIe", {"bandwidth": 2000, "tflops": {"bf16": 756, "fp8": 1513}, "tdp": 350, "arch": "hopper"}),
    ("H100", {"bandwidth": 3350, "tflops": {"bf16": 989, "fp8": 1979}, "tdp": 700, "arch": "hopper"}),
    ("H800", {"bandwidth": 3350, "tflops": {"bf16": 989, "fp8": 1979}, "tdp": 700, "arch": "hopper"}),
    ("B200", {"bandwidth": 8000, "tflops": {"bf16": 2250, "fp8": 4500, "fp4": 9000}, "tdp": 1000, "arch": "blackwell"}),
    ("A100-SXM4-80GB", {"bandwidth": 2039, "tflops": {"bf16": 312}, "tdp": 400, "arch": "ampere"}),
    ("A100 80GB PCIe", {"bandwidth": 1935, "tflops": {"bf16": 312}, "tdp": 300, "arch": "ampere"}),
    ("A100", {"bandwidth": 1555, "tflops": {"bf16": 312}, "tdp": 400, "arch": "ampere"}),
    ("L40S", {"bandwidth": 864, "tflops": {"bf16": 362, "fp8": 733}, "tdp": 350, "arch": "ada"}),
    ("L4", {"bandwidth": 300, "tflops": {"bf16": 121, "fp8": 242}, "tdp": 72, "arch": "ada"}),
    ("A10G", {"bandwidth": 600, "tflops": {"bf16": 70}, "tdp": 300, "arch": "ampere"}),
    ("A10", {"bandwidth": 600, "tflops": {"bf16": 125}, "tdp": 150, "arch": "ampere"}),
    ("RTX 4090", {"bandwidth": 1008, "tflops": {"bf16": 165, "fp8": 330}, "tdp": 450, "arch": "ada"}),
)
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


# ---------------------------------------------------------------------------------------------- the model


def hub_cache() -> Path:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser() / "hub"


def find_model_config(model: str) -> Path | None:
    """The config.json of `model`: in the directory it names, else in the hub cache's snapshot of that repo id (the
    one refs/main points at, else the newest); None when neither has it."""
    local = Path(model).expanduser()
    if local.is_dir():
        return local / "config.json" if (local / "config.json").is_file() else None
    if model.count("/") != 1 or model.startswith((".", "/", "~")):
        return None
    repo = hub_cache() / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        chosen = repo / "snapshots" / ref.read_text(encoding="utf-8").strip() / "config.json"
        if chosen.is_file():
            return chosen
    found = sorted((repo / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def model_vocab_size(model: str) -> int | None:
    """The token ids the served model accepts, read from its files (a local directory or the hub cache): the smaller
    of config.json's vocab_size and the tokenizer's ids (tokenizer.json's vocabulary and added tokens); None when
    neither is here. What bench_serving's random prompts stay inside (it draws below the tokenizer's size)."""
    config = find_model_config(model)
    if config is None:
        return None
    sizes = []
    try:
        top = json.loads(config.read_text(encoding="utf-8"))
        cfg = top.get("text_config") if isinstance(top.get("text_config"), dict) else top
        if isinstance(cfg.get("vocab_size") or top.get("vocab_size"), int):
            sizes.append(int(cfg.get("vocab_size") or top.get("vocab_size")))
    except (OSError, ValueError, AttributeError):
        pass
    tokenizer = config.parent / "tokenizer.json"
    try:
        data = json.loads(tokenizer.read_text(encoding="utf-8")) if tokenizer.is_file() else {}
        vocab = (data.get("model") or {}).get("vocab")
        ids = list(vocab.values()) if isinstance(vocab, dict) else [i for i, _ in enumerate(vocab or [])]
        ids += [t["id"] for t in data.get("added_tokens") or [] if isinstance(t.get("id"), int)]
        if ids:
            sizes.append(max(ids) + 1)
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    return min(sizes) if sizes else None


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) not in (None, ""):
            return cfg[key]
    return default


def _dtype(cfg: dict[str, Any], top: dict[str, Any]) -> str:
    quant = top.get("quantization_config") or cfg.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower() if isinstance(quant, dict) else ""
    text = json.dumps(quant).lower() if quant else ""
    if method == "fp8" or '"fp8"' in text or "float8" in text or '"num_bits": 8, "type": "float"' in text:
        return "fp8"
    if "nvfp4" in text or method in ("modelopt_fp4",):
        return "nvfp4"
    raw = str(_first(cfg, "torch_dtype", "dtype", default=_first(top, "torch_dtype", "dtype", default="bfloat16")))
    return _DTYPES.get(raw.removeprefix("torch."), "bf16")


# model types whose config class ties the output layer to the embedding when config.json does not say
_TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")


def tied_embeddings(cfg: dict[str, Any], top: dict[str, Any]) -> bool:
    """Whether the output layer is the embedding matrix (tie_word_embeddings): one matrix in memory, not two."""
    for source in (cfg, top):
        if isinstance(source.get("tie_word_embeddings"), bool):
            return bool(source["tie_word_embeddings"])
    return str(cfg.get("model_type") or top.get("model_type") or "") in _TIED_BY_DEFAULT


def sliding_window(cfg: dict[str, Any], layers: int) -> tuple[int | None, int]:
    """(window, layers that use it) from config.json: `layer_types` where it lists them (Gemma 3, Qwen3's newer
    configs); Qwen2's `use_sliding_window` with `max_window_layers` (the first that many layers attend to the whole
    context); Gemma 2's every other layer, Gemma 3's `sliding_window_pattern`; else every layer (Mistral). (None, 0)
    without a window, or with one switched off (`use_sliding_window: false`)."""
    raw = cfg.get("sliding_window")
    window = int(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) and raw > 0 else None
    if window is None or cfg.get("use_sliding_window") is False:
        return None, 0
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return window, min(sum(1 for t in types if "sliding" in str(t)), layers)
    if cfg.get("use_sliding_window") is True and isinstance(cfg.get("max_window_layers"), int):
        return window, max(0, min(layers - int(cfg["max_window_layers"]), layers))
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1:
        return window, layers - layers // pattern
    if str(cfg.get("model_type")) == "gemma2":
        return window, layers - layers // 2
    return window, layers


def model_from_config(path: Path, model: str) -> ModelProfile:
    """A model profile from a config.json (PivotError naming the file and the field when it lacks the shape)."""
    try:
        top = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PivotError(f"{path}: cannot read the model's config: {e}") from e
    cfg = top.get("text_config") if isinstance(top.get("text_config"), dict) else top
    try:
        layers = int(_first(cfg, "num_hidden_layers", "n_layer", "num_layers"))
        hidden = int(_first(cfg, "hidden_size", "n_embd", "d_model"))
        heads = int(_first(cfg, "num_attention_heads", "n_head"))
    except (TypeError, ValueError) as e:
        raise PivotError(
            f"{path}: no num_hidden_layers, hidden_size or num_attention_heads: not a transformer config pivot reads",
            hint="name a model profile in the plan (target.model_profile)",
        ) from e
    kv_heads = int(_first(cfg, "num_key_value_heads", "num_kv_heads", default=1 if cfg.get("multi_query") else heads))
    head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
    inter = int(_first(cfg, "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden))
    vocab = int(_first(cfg, "vocab_size", default=_first(top, "vocab_size", default=0)) or 0) or None
    experts = int(_first(cfg, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", default=0))
    per_token = (
        int(_first(cfg, "num_experts_per_tok", "moe_topk", "num_experts_per_token", default=0)) if experts else 0
    )
    expert_ffn = int(_first(cfg, "moe_intermediate_size", default=inter)) if experts else 0
    shared_ffn = int(_first(cfg, "shared_expert_intermediate_size", default=expert_ffn)) if experts else 0
    shared = int(_first(cfg, "n_shared_experts", default=1 if cfg.get("shared_expert_intermediate_size") else 0))
    moe_layers = max(layers - int(_first(cfg, "first_k_dense_replace", default=0)), 0) if experts else 0
    dtype = _dtype(cfg, top)
    kv_lora = int(cfg.get("kv_lora_rank") or 0)
    kv_elems = kv_lora + int(cfg.get("qk_rope_head_dim") or 0) if kv_lora else 2 * kv_heads * head_dim
    attention = layers * (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim)
    parts: list[dict[str, Any]] = [{"name": "attention", "params": float(attention), "dtype": dtype, "kind": "dense"}]
    dense_layers = layers - moe_layers
    if dense_layers:
        parts.append({"name": "mlp", "params": float(dense_layers * 3 * hidden * inter), "dtype": dtype,
                      "kind": "dense", "layers": "dense" if moe_layers else "all"})  # fmt: skip
    if experts:
        parts.append({"name": "experts", "params": float(moe_layers * experts * 3 * hidden * expert_ffn),
                      "dtype": dtype, "kind": "experts", "layers": "moe"})  # fmt: skip
        if shared:
            parts.append({"name": "shared_experts", "params": float(moe_layers * shared * 3 * hidden * shared_ffn),
                          "dtype": dtype, "kind": "dense", "layers": "moe"})  # fmt: skip
    tied = tied_embeddings(cfg, top)
    if vocab:
        embed_dtype = "bf16" if dtype in ("fp8", "nvfp4") else dtype
        if not tied:  # tied: one matrix, the embedding and the output layer (read whole each step as the lm_head)
            parts.append({"name": "embedding", "params": float(vocab * hidden), "dtype": embed_dtype,
                          "kind": "embedding", "layers": "first"})  # fmt: skip
        parts.append({"name": "lm_head (tied to the embedding)" if tied else "lm_head", "params": float(vocab * hidden),
                      "dtype": embed_dtype, "kind": "dense", "layers": "last"})  # fmt: skip
    window, window_layers = sliding_window(cfg, layers)
    gemms = []
    if not experts:
        gemms = [
            {"name": "qkv_proj", "n": (heads + 2 * kv_heads) * head_dim, "k": hidden, "split": "n"},
            {"name": "o_proj", "n": hidden, "k": heads * head_dim, "split": "k"},
            {"name": "gate_up_proj", "n": 2 * inter, "k": hidden, "split": "n"},
            {"name": "down_proj", "n": hidden, "k": inter, "split": "k"},
        ]
    kv_default = "fp8" if str(cfg.get("kv_cache_dtype", "")).startswith("fp8") else "bf16"
    data = {
        "name": "config-" + re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[-60:],
        "title": f"{Path(model).name or model} ({layers} layers, hidden {hidden}, from config.json)",
        "model_path": model,
        "architecture": str((top.get("architectures") or [cfg.get("model_type") or "unknown"])[0]),
        "kind": "moe" if experts else "dense",
        "layers": layers,
        "moe_layers": moe_layers,
        "hidden_size": hidden,
        "experts": experts,
        "experts_per_token": per_token,
        "shared_experts": shared,
        "expert_ffn": expert_ffn,
        "context_length": int(_first(cfg, "max_position_embeddings", "n_positions", "seq_length", default=4096)),
        "attention_flops_per_ctx_token": float(4 * heads * head_dim * layers),
        "kv_replicated_across_tp": bool(kv_lora) or kv_heads == 1,
        "default_kv_dtype": kv_default,
        "kv_bytes_per_token": {
            "bf16": float(layers * kv_elems * 2),
            "fp8_e4m3": float(layers * kv_elems),
            "fp8": float(layers * kv_elems),
        },
        "parts": parts,
        "dense_gemms": gemms,
        "vocab_size": vocab,
        "sliding_window": window,
        "sliding_window_layers": window_layers,
        "source": f"generated from {path}",
    }
    return ModelProfile.model_validate(data)


# ---------------------------------------------------------------------------------------------- the hardware


def _nvml() -> dict[str, Any] | None:
    """GPU 0 as NVML names it: name, memory, enforced power limit, count; None without NVML or a GPU."""
    try:
        import pynvml as nv
    except ImportError:
        return None
    try:
        nv.nvmlInit()
    except nv.NVMLError:
        return None
    try:
        count = nv.nvmlDeviceGetCount()
        if count < 1:
            return None
        h = nv.nvmlDeviceGetHandleByIndex(0)
        name = nv.nvmlDeviceGetName(h)
        memory = nv.nvmlDeviceGetMemoryInfo(h).total / GIB
        try:
            limit_w = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
        except nv.NVMLError:
            limit_w = None
        return {"name": name.decode() if isinstance(name, bytes) else str(name), "memory_gib": memory,
                "power_limit_w": limit_w, "count": count}  # fmt: skip
    except nv.NVMLError:
        return None
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


def _shipped_for(gpu_name: str) -> HardwareProfile | None:
    """The shipped (calibrated) profile of the GPU NVML names, when every word of its title is in that name."""
    said = set(gpu_name.lower().replace("nvidia", "").replace("-", " ").split())
    for ref in names("hardware"):
        hw = load_hardware(ref)
        title = set(hw.title.lower().replace("nvidia", "").replace("-", " ").split()) - {"sxm", "gpu"}
        if title and ({hw.name.lower()} <= said or title <= said):
            return hw
    return None


def gpu_profile(gpu: dict[str, Any]) -> HardwareProfile:
    """The profile of an NVML GPU: a shipped one when it is the same GPU, else its datasheet peaks (no calibration)."""
    shipped = _shipped_for(gpu["name"])
    if shipped is not None:
        return shipped
    known = next((spec for key, spec in KNOWN_GPUS if key.lower() in gpu["name"].lower()), None)
    slug = re.sub(r"[^a-z0-9]+", "-", gpu["name"].lower().replace("nvidia", "")).strip("-") or "gpu"
    return HardwareProfile(
        name=f"nvml-{slug}",
        title=gpu["name"],
        kind="gpu",
        arch=known["arch"] if known else "",
        memory_gib=round(gpu["memory_gib"], 2),
        memory_bandwidth_gbs=known["bandwidth"] if known else None,
        dense_tflops=dict(known["tflops"]) if known else {},
        tdp_w=gpu.get("power_limit_w") or (known["tdp"] if known else None),
        source="NVML (name, memory, power limit)"
        + ("; peaks from pivot's table of datasheet figures" if known else "; peaks unknown (not in pivot's table)"),
    )


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def cpu_profile() -> HardwareProfile:
    """This host's CPU as a profile: its name, cores and memory; bandwidth, peaks and power are not known."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        memory = 1.0
    cores = os.cpu_count() or 1
    return HardwareProfile(
        name="cpu",
        title=f"{_cpu_name()} ({cores} cores, {memory:.0f} GiB)",
        kind="cpu",
        memory_gib=round(memory, 2),
        source="this host (no NVML): /proc/cpuinfo and the memory the OS reports",
    )


def detect_hardware() -> HardwareProfile:
    """This host's accelerator as a profile: NVML's GPU 0, else the CPU."""
    gpu = _nvml()
    return gpu_profile(gpu) if gpu is not None else cpu_profile()
