"""GEMM micro-benchmarks of a model's expert and dense GEMM shapes on one GPU, with PyTorch.

Standard library and PyTorch only (torch is imported when something is measured), so it runs as
`python -m tools.gemm` on a GPU host that has PyTorch but none of pivot's other dependencies; its JSON is
imported into the ledger with `pivot microbench --from-json` (tools/microbench.py does the recording).

What one case is (one call, as an engine issues it for one layer):
- experts: the hit experts' gate/up projection (m x hidden by hidden x 2w, one per expert) and down
  projection (m x w by w x hidden) for m rows per expert, w = expert_ffn / tp, as ONE grouped or batched
  call each (torch._grouped_mm, torch.bmm, torch._scaled_grouped_mm), or as per-expert torch._scaled_mm
  calls captured in one CUDA graph; never a Python loop of launches, which would measure launch overhead.
  The experts per call are those hit when the layer's batch gives m rows per hit expert (uniform routing:
  8 at one row, all 256 from about 10 rows on), capped so one call stays under WEIGHT_CAP_BYTES of weights
  and FLOP_CAP of work (more experts of the same shape run at the same rate once the GPU is full).
- dense: each linear layer of a dense model (qkv, o, gate/up, down) at m rows, sharded by tp.
Every case is timed as CUDA-graph replays (launch gaps excluded), rotating over enough copies of its
operands that they do not fit in L2 (so weights stream from HBM as they do across a model's layers),
after warm-up, as the median of several timed batches.

Reported per case: TFLOPS = FLOPs / time; share of the dense peak of the dtype; share of the roofline
min(peak, AI x bandwidth) where AI = FLOPs / bytes, bytes = weights + activations in + bf16 outputs
(the peak and the bandwidth come from the hardware profile).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FORMAT = "pivot-microbench/1"
PROFILES = Path(__file__).resolve().parent / "profiles"
DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DTYPES = ("bf16", "fp8")
OPERAND_BYTES = {"bf16": 2, "fp8": 1}  # weights and activations in; W8A8 quantizes activations too
OUT_BYTES = 2  # outputs are bf16 for both
WEIGHT_CAP_BYTES = 1 << 30
FLOP_CAP = 1.0e12
ROTATE_BYTES = 256 << 20  # at least this much distinct operand data per graph replay (the H200's L2 is 50-60 MB)
MAX_COPIES = 32
TARGET_BATCH_S = 0.02
BATCHES = 5
BACKENDS = {
    ("experts", "bf16"): ("grouped_mm", "bmm"),
    ("experts", "fp8"): ("scaled_grouped_mm", "scaled_mm_graph"),
    ("dense", "bf16"): ("mm",),
    ("dense", "fp8"): ("scaled_mm",),
}
BACKEND_TITLES = {
    "grouped_mm": "torch._grouped_mm",
    "bmm": "torch.bmm",
    "scaled_grouped_mm": "torch._scaled_grouped_mm rowwise",
    "scaled_mm_graph": "torch._scaled_mm rowwise per expert in one CUDA graph",
    "mm": "torch.mm",
    "scaled_mm": "torch._scaled_mm rowwise",
}


class Unavailable(Exception):
    """No GPU to measure on (no PyTorch, no CUDA device): the message says which."""


# --------------------------------------------------------------------------------------------------
# Shapes.


@dataclass(frozen=True)
class Gemm:
    """`groups` GEMMs of (m x k) by (k x n) in one call."""

    m: int
    n: int
    k: int
    groups: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.groups

    def weight_bytes(self, dtype: str) -> float:
        return float(self.n * self.k * self.groups * OPERAND_BYTES[dtype])

    def bytes(self, dtype: str) -> float:
        """Fewest bytes one call moves: weights and activations read once, bf16 outputs written once."""
        act = self.m * self.k * OPERAND_BYTES[dtype] + self.m * self.n * OUT_BYTES
        return self.weight_bytes(dtype) + float(act * self.groups)


@dataclass(frozen=True)
class Case:
    """One measurement: a model's GEMM shape at `rows` rows (per expert for experts) in one dtype."""

    model: str
    kind: str  # experts | dense
    name: str  # experts | qkv_proj | o_proj | gate_up_proj | down_proj ...
    tp: int
    dtype: str
    rows: int
    n: int  # experts: the expert's width on one GPU (expert_ffn / tp); dense: the GEMM's output width
    k: int  # experts: hidden size; dense: the GEMM's input width
    groups: int
    experts_hit: float | None
    gemms: tuple[Gemm, ...]

    @property
    def flops(self) -> float:
        return sum(g.flops for g in self.gemms)

    @property
    def bytes(self) -> float:
        return sum(g.bytes(self.dtype) for g in self.gemms)

    @property
    def weight_bytes(self) -> float:
        return sum(g.weight_bytes(self.dtype) for g in self.gemms)

    @property
    def intensity(self) -> float:
        """FLOP per byte of one call."""
        return self.flops / self.bytes

    @property
    def label(self) -> str:
        return f"{self.model} {self.name} tp{self.tp} {self.dtype} m={self.rows}"


def experts_hit(experts: int, per_token: int, batch: float) -> float:
    """Experts that get at least one of `batch` tokens, each token picking `per_token` of `experts` uniformly."""
    return experts * (1.0 - (1.0 - per_token / experts) ** batch) if batch > 0 else 0.0


def experts_for_rows(experts: int, per_token: int, rows: float) -> float:
    """Experts hit in a layer whose batch gives `rows` rows to each hit expert (batch * k / E_hit(batch) = rows)."""
    if rows <= 1:
        return float(per_token)
    lo, hi = 1.0, 1.0
    while hi * per_token / experts_hit(experts, per_token, hi) < rows:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if mid * per_token / experts_hit(experts, per_token, mid) < rows:
            lo = mid
        else:
            hi = mid
    return experts_hit(experts, per_token, hi)


def expert_cases(model: dict[str, Any], tps: Iterable[int], rows: Iterable[int], dtypes: Iterable[str]) -> list[Case]:
    """The routed experts' GEMMs of a MoE model profile (a dict as in tools/profiles/models/*.toml)."""
    hidden, ffn = int(model["hidden_size"]), int(model["expert_ffn"])
    experts, per_token = int(model["experts"]), int(model["experts_per_token"])
    if not experts or not ffn:
        return []
    out = []
    for tp in tps:
        if ffn % tp:
            raise ValueError(f"expert_ffn {ffn} does not split over tp {tp}")
        w = ffn // tp
        for dtype in dtypes:
            for m in rows:
                hit = experts_for_rows(experts, per_token, m)
                per_expert = Gemm(m, 2 * w, hidden).weight_bytes(dtype) + Gemm(m, hidden, w).weight_bytes(dtype)
                per_flops = Gemm(m, 2 * w, hidden).flops + Gemm(m, hidden, w).flops
                cap = min(WEIGHT_CAP_BYTES / per_expert, FLOP_CAP / per_flops)
                groups = max(1, min(round(hit), int(cap)))
                gemms = (Gemm(m, 2 * w, hidden, groups), Gemm(m, hidden, w, groups))
                out.append(Case(model["name"], "experts", "experts", tp, dtype, m, w, hidden, groups, hit, gemms))
    return out


def dense_cases(model: dict[str, Any], tps: Iterable[int], rows: Iterable[int], dtypes: Iterable[str]) -> list[Case]:
    """The per-layer linear layers of a model profile's `dense_gemms` (split `n`: column-parallel, `k`: row-parallel)."""
    out = []
    for tp in tps:
        for spec in model.get("dense_gemms", []):
            n, k = int(spec["n"]), int(spec["k"])
            split = spec.get("split", "n")
            if split == "n":
                n //= tp
            elif split == "k":
                k //= tp
            for dtype in dtypes:
                for m in rows:
                    out.append(
                        Case(model["name"], "dense", spec["name"], tp, dtype, m, n, k, 1, None, (Gemm(m, n, k),))
                    )
    return out


def cases_for(model: dict[str, Any], tps: Iterable[int], rows: Iterable[int], dtypes: Iterable[str]) -> list[Case]:
    """Expert cases for a MoE model, dense cases for a dense model."""
    tps, rows, dtypes = list(tps), list(rows), list(dtypes)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"unknown dtype {bad[0]!r}: measured dtypes are {', '.join(DTYPES)}")
    if model.get("kind") == "moe" and model.get("experts"):
        return expert_cases(model, tps, rows, dtypes)
    if not model.get("dense_gemms"):
        raise ValueError(f"model profile {model.get('name')} lists no dense_gemms to measure")
    return dense_cases(model, tps, rows, dtypes)


# --------------------------------------------------------------------------------------------------
# Peak, roofline and shares.


def peak_tflops(hardware: dict[str, Any], dtype: str) -> float:
    """The hardware profile's dense peak for `dtype` (as HardwareProfile.peak_tflops reads it)."""
    peaks = hardware["dense_tflops"]
    key = "fp4" if dtype == "nvfp4" else dtype
    if key in peaks:
        return float(peaks[key])
    if key == "fp4" and "fp8" in peaks:
        return float(peaks["fp8"])
    return float(peaks["bf16"])


def roofline_tflops(intensity: float, peak: float, bandwidth_gbs: float) -> float:
    """min(peak, AI x bandwidth): the most a GEMM of that arithmetic intensity can reach, TFLOPS."""
    return min(peak, intensity * bandwidth_gbs * 1e9 / 1e12)


def figures(flops: float, nbytes: float, seconds: float, peak: float, bandwidth_gbs: float) -> dict[str, float]:
    """TFLOPS, share of peak and share of the roofline of one timed call."""
    tflops = flops / seconds / 1e12
    roof = roofline_tflops(flops / nbytes, peak, bandwidth_gbs)
    return {
        "tflops": tflops,
        "peak_tflops": peak,
        "roofline_tflops": roof,
        "share_of_peak": tflops / peak,
        "share_of_roofline": tflops / roof,
        "achieved_gbs": nbytes / seconds / 1e9,
    }


# --------------------------------------------------------------------------------------------------
# Profiles without pydantic.


def read_profile(kind: str, ref: str) -> dict[str, Any]:
    """A profile as a plain dict: `ref` is a shipped name (glm-5-nvfp4, h200) or a path to a TOML file."""
    path = Path(ref)
    if not (path.suffix == ".toml" and path.is_file()):
        path = PROFILES / kind / f"{ref}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in (PROFILES / kind).glob("*.toml")))
        raise ValueError(f"no {kind} profile {ref!r} (shipped: {known})")
    return tomllib.loads(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------------------
# Measuring (PyTorch).


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise Unavailable("PyTorch is not installed here, so there is no GPU to measure GEMMs on") from e
    return torch


def gpu_status() -> tuple[bool, str]:
    """(True, the GPU's name) when a CUDA GPU can be measured, else (False, why not)."""
    try:
        torch = _torch()
    except Unavailable as e:
        return False, str(e)
    if not torch.cuda.is_available():
        return False, f"PyTorch {torch.__version__} sees no CUDA GPU here"
    return True, torch.cuda.get_device_name(0)


def fp8_supported() -> tuple[bool, str]:
    """FP8 GEMMs need compute capability 8.9 or later and torch._scaled_mm."""
    torch = _torch()
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return False, f"PyTorch {torch.__version__} has no torch._scaled_mm"
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) < (8, 9):
        return False, f"compute capability {major}.{minor} has no FP8 tensor cores (8.9 or later)"
    return True, ""


def device_info() -> dict[str, Any]:
    torch = _torch()
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "capability": list(torch.cuda.get_device_capability(0)),
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_mib": round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def time_calls(calls: Sequence[Callable[[], Any]], *, graph: bool = True) -> tuple[float, bool]:
    """Median seconds per call of `calls` run back to back: CUDA-graph replays when capture works, else eager.

    Returns (seconds per call, whether a graph was used).
    """
    torch = _torch()
    for fn in calls:  # warm-up: handles, workspaces, kernel selection
        fn()
    torch.cuda.synchronize()
    replay: Callable[[], None]
    used_graph = False
    if graph:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for fn in calls:
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for fn in calls:
                    fn()
            replay = g.replay
            used_graph = True
        except Exception:  # capture unsupported by this op: fall back to back-to-back eager launches
            torch.cuda.synchronize()
            replay = lambda: [fn() for fn in calls]  # noqa: E731
    else:
        replay = lambda: [fn() for fn in calls]  # noqa: E731
    replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    replay()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end) / 1e3, 1e-6)
    reps = max(1, min(2000, int(TARGET_BATCH_S / once)))
    samples = []
    for _ in range(BATCHES):
        start.record()
        for _ in range(reps):
            replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(samples) / len(calls), used_graph


def _copies(case: Case) -> int:
    return max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / case.bytes)))


def _randn(torch: Any, shape: tuple[int, ...], dtype: str) -> Any:
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    return x.to(torch.float8_e4m3fn) if dtype == "fp8" else x


def _scales(torch: Any, *shape: int) -> Any:
    return torch.rand(shape, device="cuda", dtype=torch.float32) * 0.01 + 0.005


def build_calls(case: Case, backend: str) -> list[Callable[[], Any]]:
    """One callable per operand copy, each doing one case's call with `backend`."""
    torch = _torch()
    calls: list[Callable[[], Any]] = []
    for _ in range(_copies(case)):
        ops = []
        for g in case.gemms:
            if case.kind == "experts":
                a = _randn(torch, (g.groups, g.m, g.k), case.dtype)
                w = _randn(torch, (g.groups, g.n, g.k), case.dtype)  # nn.Linear layout: out x in
                sa, sb = (
                    (_scales(torch, g.groups, g.m), _scales(torch, g.groups, g.n))
                    if case.dtype == "fp8"
                    else (None, None)
                )
            else:
                a = _randn(torch, (g.m, g.k), case.dtype)
                w = _randn(torch, (g.n, g.k), case.dtype)
                sa, sb = (_scales(torch, g.m, 1), _scales(torch, 1, g.n)) if case.dtype == "fp8" else (None, None)
            ops.append(_op(torch, backend, a, w, sa, sb))

        def call(ops: list[Callable[[], Any]] = ops) -> None:
            for op in ops:
                op()

        calls.append(call)
    return calls


def _op(torch: Any, backend: str, a: Any, w: Any, sa: Any, sb: Any) -> Callable[[], Any]:
    bf16 = torch.bfloat16
    if backend == "grouped_mm":
        return lambda: torch._grouped_mm(a, w.transpose(-2, -1), out_dtype=bf16)
    if backend == "bmm":
        return lambda: torch.bmm(a, w.transpose(-2, -1))
    if backend == "scaled_grouped_mm":
        return lambda: torch._scaled_grouped_mm(a, w.transpose(-2, -1), sa, sb, out_dtype=bf16, use_fast_accum=True)
    if backend == "scaled_mm_graph":
        per = [(a[i], w[i].t(), sa[i].unsqueeze(-1), sb[i].unsqueeze(0)) for i in range(a.shape[0])]
        return lambda: [
            torch._scaled_mm(x, y, scale_a=p, scale_b=q, out_dtype=bf16, use_fast_accum=True) for x, y, p, q in per
        ]
    if backend == "mm":
        return lambda: torch.mm(a, w.t())
    if backend == "scaled_mm":
        return lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=bf16, use_fast_accum=True)
    raise ValueError(f"unknown backend {backend!r}")


def check_backend(kind: str, dtype: str, backend: str) -> float:
    """Relative error of `backend` against a float32 reference on small random operands (bf16: ~1e-2 or less)."""
    torch = _torch()
    g, m, n, k = (4, 16, 256, 512) if kind == "experts" else (1, 16, 256, 512)
    shape_a, shape_w = ((g, m, k), (g, n, k)) if kind == "experts" else ((m, k), (n, k))
    a, w = _randn(torch, shape_a, dtype), _randn(torch, shape_w, dtype)
    if dtype == "fp8":
        sa, sb = ((_scales(torch, g, m), _scales(torch, g, n)) if kind == "experts"
                  else (_scales(torch, m, 1), _scales(torch, 1, n)))  # fmt: skip
    else:
        sa = sb = None
    out = _op(torch, backend, a, w, sa, sb)()
    if isinstance(out, list):
        out = torch.stack(out)
    af, wf = a.float(), w.float()
    if dtype == "fp8":
        af = af * (sa.unsqueeze(-1) if kind == "experts" else sa)
        wf = wf * (sb.unsqueeze(-1) if kind == "experts" else sb.t())
    ref = af @ wf.transpose(-2, -1)
    err = (out.float() - ref).norm() / ref.norm()
    return float(err)


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read plus written per second (the achievable memory bandwidth)."""
    torch = _torch()
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds, _ = time_calls([lambda: dst.copy_(src)], graph=False)
    return 2 * nbytes / seconds / 1e9


def matmul_ceiling_tflops(dtype: str, size: int = 8192) -> float:
    """A large square GEMM on random data: the achievable tensor-core rate."""
    torch = _torch()
    a, w = _randn(torch, (size, size), dtype), _randn(torch, (size, size), dtype)
    if dtype == "fp8":
        one = torch.ones((), device="cuda", dtype=torch.float32)
        fn = lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)  # noqa: E731
    else:
        fn = lambda: torch.mm(a, w.t())  # noqa: E731
    seconds, _ = time_calls([fn], graph=False)
    return 2 * size**3 / seconds / 1e12


@dataclass
class Run:
    """What a measuring run produced: the JSON that `pivot microbench --from-json` imports."""

    hardware: str
    models: list[str]
    device: dict[str, Any] = field(default_factory=dict)
    ceilings: dict[str, float] = field(default_factory=dict)
    checks: dict[str, float | str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cases: list[dict[str, Any]] = field(default_factory=list)
    measured_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}


def case_row(case: Case, backend: str, seconds: float | None, hardware: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One case as a JSON row: shape, FLOPs, bytes, time and (when timed) the figures against the profile."""
    peak = peak_tflops(hardware, case.dtype)
    row: dict[str, Any] = {
        "model": case.model,
        "kind": case.kind,
        "name": case.name,
        "tp": case.tp,
        "dtype": case.dtype,
        "backend": backend,
        "rows": case.rows,
        "n": case.n,
        "k": case.k,
        "groups": case.groups,
        "experts_hit": case.experts_hit,
        "gemms": [[g.m, g.n, g.k, g.groups] for g in case.gemms],
        "flops": case.flops,
        "bytes": case.bytes,
        "weight_bytes": case.weight_bytes,
        "seconds": seconds,
    }
    if seconds:
        row.update(figures(case.flops, case.bytes, seconds, peak, float(hardware["memory_bandwidth_gbs"])))
    row.update(extra)
    return row


def measure(
    cases: Sequence[Case],
    hardware: dict[str, Any],
    *,
    backends: Sequence[str] | None = None,
    ceilings: bool = True,
    on_case: Callable[[dict[str, Any]], None] | None = None,
    run: Run | None = None,
) -> Run:
    """Time every case with every backend of its kind and dtype (or those in `backends`) on GPU 0.

    A backend that fails (unsupported here) is recorded with its error and skipped for the rest of its kind
    and dtype; FP8 cases are skipped with a note where the GPU or PyTorch has no FP8 GEMM.
    """
    ok, why = gpu_status()
    if not ok:
        raise Unavailable(why)
    torch = _torch()
    run = run or Run(hardware=hardware["name"], models=sorted({c.model for c in cases}))
    run.device = device_info()
    if ceilings and not run.ceilings:
        run.ceilings["copy_gbs"] = round(copy_bandwidth_gbs(), 1)
        run.ceilings["bf16_tflops_8192"] = round(matmul_ceiling_tflops("bf16"), 1)
    fp8_ok, fp8_why = fp8_supported()
    if not fp8_ok and any(c.dtype == "fp8" for c in cases):
        run.notes.append(f"fp8 skipped: {fp8_why}")
    elif ceilings and fp8_ok and "fp8_tflops_8192" not in run.ceilings:
        run.ceilings["fp8_tflops_8192"] = round(matmul_ceiling_tflops("fp8"), 1)
    broken: dict[tuple[str, str, str], str] = {}
    checked: set[tuple[str, str, str]] = set()
    for case in cases:
        if case.dtype == "fp8" and not fp8_ok:
            continue
        for backend in BACKENDS[(case.kind, case.dtype)]:
            if backends and backend not in backends:
                continue
            key = (case.kind, case.dtype, backend)
            if key not in checked:
                checked.add(key)
                try:
                    run.checks["/".join(key)] = round(check_backend(*key), 5)
                except Exception as e:
                    broken[key] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                    run.checks["/".join(key)] = broken[key]
            if key in broken:
                continue
            row: dict[str, Any]
            try:
                calls = build_calls(case, backend)
                seconds, graphed = time_calls(calls)
                row = case_row(case, backend, seconds, hardware, graph=graphed, copies=len(calls))
            except Exception as e:
                message = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                row = case_row(case, backend, None, hardware, error=message)
            finally:
                calls = []
                torch.cuda.empty_cache()
            run.cases.append(row)
            if on_case is not None:
                on_case(row)
    return run


# --------------------------------------------------------------------------------------------------
# Standalone entry: python -m tools.gemm


def parse_ints(text: str) -> list[int]:
    try:
        values = [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError as e:
        raise ValueError(f"bad list {text!r}: write it as 1,2,4") from e
    if not values or any(v < 1 for v in values):
        raise ValueError(f"bad list {text!r}: positive integers, e.g. 1,2,4")
    return values


def format_row(row: dict[str, Any]) -> str:
    head = f"{row['model']:<18} {row['name']:<12} tp{row['tp']:<2} {row['dtype']:<4} {row['backend']:<17} m={row['rows']:<5}"
    if row.get("error"):
        return f"{head} error: {row['error']}"
    return (
        f"{head} G={row['groups']:<4} {row['tflops']:8.1f} TFLOPS  {100 * row['share_of_peak']:5.1f}% of peak  "
        f"{100 * row['share_of_roofline']:5.1f}% of roofline  {row['achieved_gbs']:7.0f} GB/s  {row['seconds'] * 1e6:9.1f} us"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gemm", description=__doc__.splitlines()[0])
    parser.add_argument("--model-profile", action="append", required=True, help="Repeatable: glm-5-nvfp4, ...")
    parser.add_argument("--hardware", default="h200")
    parser.add_argument("--tp", default="1", help="TP sizes, e.g. 1,8 (the width each GPU holds).")
    parser.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)))
    parser.add_argument("--dtype", default=",".join(DTYPES))
    parser.add_argument("--backend", action="append", help="Only these backends (default: all of each kind).")
    parser.add_argument("--json-out", required=True, help="Write the results here (rewritten after every case).")
    parser.add_argument("--no-ceilings", action="store_true", help="Skip the copy and 8192^3 GEMM ceilings.")
    args = parser.parse_args(argv)
    hardware = read_profile("hardware", args.hardware)
    models = [read_profile("models", ref) for ref in args.model_profile]
    cases = [
        c
        for model in models
        for c in cases_for(model, parse_ints(args.tp), parse_ints(args.rows), args.dtype.split(","))
    ]
    run = Run(hardware=hardware["name"], models=[m["name"] for m in models])
    out = Path(args.json_out)

    def on_case(row: dict[str, Any]) -> None:
        print(format_row(row), flush=True)
        out.write_text(json.dumps(run.to_json(), indent=1))

    started = time.monotonic()
    try:
        measure(cases, hardware, backends=args.backend, ceilings=not args.no_ceilings, on_case=on_case, run=run)
    except Unavailable as e:
        print(f"no GPU: {e}", file=sys.stderr)
        return 2
    out.write_text(json.dumps(run.to_json(), indent=1))
    print(f"{len(run.cases)} cases in {time.monotonic() - started:.0f} s; ceilings {run.ceilings}; checks {run.checks}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
