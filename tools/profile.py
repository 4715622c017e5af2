"""Where GPU time goes under load: SGLang's torch-profiler traces, or the twin's breakdown, as time per kernel category.

On SGLang (0.5.23's API): `POST /start_profile` with `output_dir`, `activities`, `profile_id` (and
optionally `num_steps`, after which SGLang stops by itself), a short load from tools.loadgen, then
`POST /stop_profile`; each GPU rank writes `<profile_id>-TP-<rank>[-DP-..][-PP-..][-EP-..].trace.json.gz`
(Chrome trace JSON) into `output_dir`, which must be a directory the server can write and pivot can
read. Kernel events (`"cat": "kernel"`) are put into categories by name with KERNEL_CATEGORIES, a
first-match table of regular expressions; seconds are per GPU (the mean over the ranks traced).
On the twin (`pivot sim serve`), /stop_profile answers with its step-time breakdown, mapped onto the
same categories. Both become one `models.ProfileSummary`.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

from agent.errors import PivotError, redact
from agent.models import BenchSpec, ProfileCategory, ProfileKernel, ProfileSummary
from tools.tls import tls_context

CATEGORIES = ("expert_gemm", "other_gemm", "attention", "communication", "other")

# (category, pattern): a kernel's name goes to the first row whose pattern it contains (case-insensitive);
# none matching: "other". Communication first (fused all-reduce kernels may name a GEMM or a norm), then MoE
# kernels (fused_moe, cutlass/flashinfer MoE GEMMs, grouped GEMMs, routing), then attention kernels by their
# own names, then GEMMs (cuBLAS incl. nvjet, CUTLASS, sm90/sm100 GEMMs), then norms, sampling, RoPE, activations
# and quantization (other), and last the generic "flash"/"flashinfer", which name attention kernels more often
# than anything else.
KERNEL_CATEGORIES: tuple[tuple[str, str], ...] = (
    (
        "communication",
        r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|custom_?ar|cross_device|mscclpp|deep_?ep",
    ),
    ("expert_gemm", r"moe|grouped_?gemm|group_?gemm|expert"),
    ("attention", r"fmha|flash_?attn|flash_fwd|flash_bwd|attention|attn|mla|batchprefill|batchdecode|merge_state"),
    ("other_gemm", r"gemm|gemv|cublas|cutlass|sm90_|sm100_|sm120_|nvjet|matmul|xmma|wgmma|bmm"),
    ("other", r"norm|sampl|rotary|rope|silu|gelu|activation|quant"),
    ("attention", r"flashinfer|flash"),
)
_COMPILED = tuple((category, re.compile(pattern, re.IGNORECASE)) for category, pattern in KERNEL_CATEGORIES)
# The twin's breakdown keys (tools/engines/sim/costmodel.py StepCost.breakdown) in these categories.
TWIN_CATEGORIES = {
    "expert_gemm": "expert_gemm",
    "dense_gemm": "other_gemm",
    "attention": "attention",
    "communication": "communication",
    "host_overhead": "other",
    "elementwise": "other",
}
TOP_KERNELS = 15
START_TIMEOUT_S = 120.0  # starting the torch profiler on a big server takes a while
STOP_TIMEOUT_S = 600.0  # exporting the traces takes longer


def kernel_category(name: str) -> str:
    """The category of a kernel, by its name (KERNEL_CATEGORIES, first match; else "other")."""
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return "other"


# ------------------------------------------------------------------------------------------------ traces


def _load_trace(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, EOFError, ValueError) as e:
        raise PivotError(f"cannot read the trace {path}: {type(e).__name__}: {e}") from e
    if isinstance(data, list):  # the JSON Array Format of Chrome traces
        return {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise PivotError(f"{path} is not a Chrome trace (no traceEvents)")
    return data


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def trace_files(path: str | Path, profile_id: str | None = None) -> list[Path]:
    """The trace files at `path` (a file, or a directory of *.trace.json[.gz] / *.json[.gz]), optionally one profile's."""
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise PivotError(f"no trace at {p}", hint="give a .trace.json.gz file or the profile's output directory")
    files = sorted(f for f in p.iterdir() if f.is_file() and re.search(r"\.json(\.gz)?$", f.name))
    if profile_id is not None:
        files = [f for f in files if profile_id in f.name]
    return files


def summarize_traces(paths: Iterable[str | Path]) -> ProfileSummary:
    """Kernel time by category over torch-profiler Chrome traces (each GPU device in each file is one rank)."""
    files = [Path(p) for p in paths]
    if not files:
        raise PivotError("no trace files to summarize")
    per_cat_us = dict.fromkeys(CATEGORIES, 0.0)
    per_cat_n = dict.fromkeys(CATEGORIES, 0)
    per_kernel: dict[str, list[float]] = {}  # name -> [us, count]
    spans: dict[tuple[str, Any], list[tuple[float, float]]] = {}
    for path in files:
        for ev in _load_trace(path)["traceEvents"]:
            if not isinstance(ev, dict) or ev.get("ph") != "X" or str(ev.get("cat", "")).lower() != "kernel":
                continue
            try:
                dur, ts = float(ev.get("dur", 0.0)), float(ev.get("ts", 0.0))
            except (TypeError, ValueError):
                continue
            name = str(ev.get("name", ""))
            category = kernel_category(name)
            per_cat_us[category] += dur
            per_cat_n[category] += 1
            k = per_kernel.setdefault(name, [0.0, 0])
            k[0] += dur
            k[1] += 1
            device = (ev.get("args") or {}).get("device", ev.get("pid"))
            spans.setdefault((str(path), device), []).append((ts, ts + dur))
    ranks = max(len(spans), 1)
    total_us = sum(per_cat_us.values())
    notes = []
    if total_us == 0:
        notes.append("no GPU kernel events in the traces (was the profile started with activities GPU?)")
    categories = {
        c: ProfileCategory(
            seconds=per_cat_us[c] / ranks / 1e6,
            share=per_cat_us[c] / total_us if total_us > 0 else 0.0,
            kernels=per_cat_n[c],
        )
        for c in CATEGORIES
    }
    top = sorted(per_kernel.items(), key=lambda kv: kv[1][0], reverse=True)[:TOP_KERNELS]
    windows = [max(e for _, e in iv) - min(s for s, _ in iv) for iv in spans.values()]
    return ProfileSummary(
        source="measured",
        categories=categories,
        total_s=total_us / ranks / 1e6,
        window_s=sum(windows) / len(windows) / 1e6 if windows else None,
        busy_s=sum(_busy_us(iv) for iv in spans.values()) / len(spans) / 1e6 if spans else None,
        ranks=len(spans) or len(files),
        trace_files=[str(f) for f in files],
        top_kernels=[
            ProfileKernel(name=n[:300], category=kernel_category(n), seconds=v[0] / ranks / 1e6, count=int(v[1]))
            for n, v in top
        ],
        notes=notes,
    )


def summarize_twin(breakdown: dict[str, Any]) -> ProfileSummary:
    """The twin's /stop_profile answer (its step-time breakdown) in the categories of a measured profile."""
    parts = breakdown.get("breakdown")
    if not isinstance(parts, dict):
        raise PivotError("the twin's /stop_profile answer has no breakdown")
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    for key, value in parts.items():
        s = value.get("seconds", 0.0) if isinstance(value, dict) else value
        seconds[TWIN_CATEGORIES.get(key, "other")] += float(s or 0.0)
    total = sum(seconds.values())
    steps = f"{breakdown.get('prefill_steps', 0)} prefill and {breakdown.get('decode_steps', 0)} decode steps"
    return ProfileSummary(
        source="simulated",
        categories={c: ProfileCategory(seconds=s, share=s / total if total > 0 else 0.0) for c, s in seconds.items()},
        total_s=total,
        window_s=breakdown.get("window_s"),
        busy_s=breakdown.get("busy_s"),
        ranks=1,
        notes=[f"simulated: the twin's step-time breakdown over {steps}"],
    )


# ------------------------------------------------------------------------------------------------ live


def _post(client: httpx.Client, url: str, body: dict[str, Any] | None, timeout_s: float) -> httpx.Response:
    try:
        return client.post(url, json=body, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise PivotError(f"POST {url} failed: {type(e).__name__}: {e}", hint="is the server running there?") from e


def _wait_for_traces(output_dir: Path, profile_id: str, timeout_s: float) -> list[Path]:
    """The profile's trace files once they exist and stopped growing; [] after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last: dict[Path, int] = {}
    while time.monotonic() < deadline:
        files = trace_files(output_dir, profile_id) if output_dir.is_dir() else []
        sizes = {f: f.stat().st_size for f in files}
        if files and sizes == last:
            return files
        last = sizes
        time.sleep(0.5)
    return list(last)


def profile_server(
    base_url: str,
    output_dir: str | Path,
    *,
    spec: BenchSpec | None = None,
    num_steps: int | None = None,
    activities: Sequence[str] = ("GPU",),
    trace_timeout_s: float = 60.0,
    run_load: Callable[[str, BenchSpec], Any] | None = None,
) -> ProfileSummary:
    """Profile a running server under a short load and summarize where GPU time went.

    `spec` is the load (default: 64 concurrent requests, 128 prompts, input 256 / output 128 tokens, no
    warmup); `run_load(base_url, spec)` replaces tools.loadgen.benchmark. `num_steps` lets SGLang stop by
    itself after that many steps. `output_dir` is where SGLang writes its traces (created if missing; it
    must be the same directory for the server). Raises PivotError when the server refuses to profile or
    no trace appears within `trace_timeout_s`.
    """
    base = base_url.strip().rstrip("/")
    spec = spec or BenchSpec(concurrency=[64], num_prompts=128, random_input_len=256, random_output_len=128,
                             warmup_requests=0)  # fmt: skip
    out_dir = Path(output_dir).expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    profile_id = f"pivot-{time.strftime('%Y%m%d-%H%M%S')}-{int(time.time() * 1000) % 1000:03d}"
    body: dict[str, Any] = {"output_dir": str(out_dir), "activities": list(activities), "profile_id": profile_id,
                            "with_stack": False, "record_shapes": False}  # fmt: skip
    if num_steps is not None:
        body["num_steps"] = int(num_steps)
    if run_load is None:
        from tools import loadgen

        run_load = loadgen.benchmark
    with httpx.Client(trust_env=False, verify=tls_context()) as client:
        r = _post(client, base + "/start_profile", body, START_TIMEOUT_S)
        if r.status_code != 200:
            hint = "the server has no /start_profile" if r.status_code == 404 else None
            raise PivotError(
                f"the server refused to start profiling ({r.status_code}): {redact(r.text.strip()[:300])}", hint=hint
            )
        stopped = False
        try:
            result = run_load(base, spec)
            r = _post(client, base + "/stop_profile", None, STOP_TIMEOUT_S)
            stopped = True
        finally:
            if not stopped:
                with contextlib.suppress(httpx.HTTPError):
                    client.post(base + "/stop_profile", timeout=STOP_TIMEOUT_S)
    level = result.levels[0] if getattr(result, "levels", None) else None
    summary: ProfileSummary | None = None
    if r.status_code == 200 and "json" in r.headers.get("content-type", ""):
        data = r.json()
        if isinstance(data, dict) and "breakdown" in data:
            summary = summarize_twin(data)
    if summary is None:
        if r.status_code != 200 and num_steps is None:
            raise PivotError(f"the server could not stop profiling ({r.status_code}): {redact(r.text.strip()[:300])}")
        files = _wait_for_traces(out_dir, profile_id, trace_timeout_s)
        if not files:
            raise PivotError(
                f"no trace of profile {profile_id} appeared in {out_dir} within {trace_timeout_s:g} s",
                hint="the server writes the traces: output_dir must be a path it can write and pivot can read",
            )
        summary = summarize_traces(files)
    summary.max_concurrency = spec.concurrency[0]
    summary.output_throughput = level.output_throughput if level is not None else None
    return summary
