"""A whole decode step of a dense transformer on one GPU, with PyTorch: the figure `pivot sim step` is held against.

Standard library and PyTorch only (torch is imported when something is measured), so it runs as
`python -m tools.stepbench` on a GPU host that has PyTorch (and, for power, nvidia-ml-py) but none of pivot's other
dependencies, like tools.gemm; its JSON is the recorded fixture (scripts/calibration/h200-step-*.json) that
benchmarks/step_fidelity.py compares with the twin.

What one step is: for each layer, RMSNorm, the fused QKV projection, rotary embedding (an elementwise multiply-add),
decode attention of every request's one new token over `context` cached tokens (grouped-query: the query heads of
one KV head are that head's queries, `scaled_dot_product_attention`), the output projection and the residual, then
RMSNorm, the fused gate/up projection, SiLU-and-multiply, the down projection and the residual; then the final norm
and the output layer (the vocabulary). Weights are random and distinct per layer (they stream from HBM as a real
model's do); bf16 matrices with `torch.mm`, FP8 ones (W8A8, e4m3) with `torch._scaled_mm` and the activations
quantized per row in the step. The KV cache of one layer (batch x KV heads x context x head dim, bf16) is shared by
the layers: every layer reads as many bytes from HBM as its own cache would hold (the cache is far larger than the
L2), at a fraction of the memory. The step is captured once in a CUDA graph and replayed (launch gaps excluded, as
an engine's decode graphs run); its time is the median of several timed batches of replays; NVML's power and SM
clock are sampled while it replays for at least MIN_POWER_S.

    python -m tools.stepbench --model llama-3.1-8b --batch 1,8,32,64,128,256 --context 1024,4096 --out step.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FORMAT = "pivot-stepbench/1"
BATCHES = 5
MIN_POWER_S = 1.5
SAMPLE_S = 0.02


@dataclass(frozen=True)
class Shape:
    """A dense decoder's shape (as its config.json gives it) and the dtype of its linear layers."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype: str = "bf16"  # the linear layers': bf16 or fp8 (W8A8); norms, attention and the output layer are bf16

    @classmethod
    def from_config(cls, name: str, cfg: dict[str, Any], dtype: str = "bf16") -> Shape:
        heads = int(cfg["num_attention_heads"])
        return cls(name, int(cfg["num_hidden_layers"]), int(cfg["hidden_size"]), int(cfg["intermediate_size"]), heads,
                   int(cfg.get("num_key_value_heads") or heads), int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
                   int(cfg["vocab_size"]), dtype)  # fmt: skip


SHAPES = {  # the public configs of the models the twin ships profiles of
    "llama-3.1-8b": Shape("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256, "bf16"),
    "llama-3.3-70b-fp8": Shape("llama-3.3-70b-fp8", 80, 8192, 28672, 64, 8, 128, 128256, "fp8"),
}


@dataclass
class Row:
    model: str
    dtype: str
    tp: int
    batch: int
    context: int
    step_ms: float | None = None
    step_ms_batches: list[float] = field(default_factory=list)
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    power_samples: int = 0
    error: str | None = None


class Power:
    """NVML's power and SM clock of GPU 0, sampled in a thread while `sampling` is on (None without NVML)."""

    def __init__(self) -> None:
        try:
            import pynvml as nv

            nv.nvmlInit()
            self.nv, self.handle = nv, nv.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML here: the rows have no power
            self.nv = self.handle = None
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def info(self) -> dict[str, Any]:
        if self.nv is None:
            return {}
        nv, h = self.nv, self.handle
        out: dict[str, Any] = {"driver": _text(nv.nvmlSystemGetDriverVersion())}
        with contextlib.suppress(Exception):
            out["power_limit_w"] = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
        return out

    def read(self) -> tuple[float, float] | None:
        if self.nv is None:
            return None
        nv, h = self.nv, self.handle
        return nv.nvmlDeviceGetPowerUsage(h) / 1000, float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))

    def start(self) -> None:
        self.samples, self._stop = [], threading.Event()
        if self.nv is None:
            return

        def loop() -> None:
            while not self._stop.is_set():
                reading = self.read()
                if reading is not None:
                    self.samples.append(reading)
                time.sleep(SAMPLE_S)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> tuple[float | None, float | None, int]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        kept = self.samples[len(self.samples) // 5 :]  # the first fifth: the card still ramping
        if not kept:
            return None, None, 0
        return statistics.mean(p for p, _ in kept), statistics.mean(c for _, c in kept), len(kept)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Step:
    """One decode step's tensors and its work, for one (batch, context)."""

    def __init__(self, torch: Any, shape: Shape, batch: int, context: int, weights: list[dict[str, Any]],
                 head: Any) -> None:  # fmt: skip
        self.t, self.s, self.batch, self.context = torch, shape, batch, context
        self.weights, self.head = weights, head
        dev, bf16 = "cuda", torch.bfloat16
        s = shape
        self.x = torch.randn(batch, s.hidden, device=dev, dtype=bf16)
        self.k = torch.randn(batch, s.kv_heads, context, s.head_dim, device=dev, dtype=bf16)
        self.v = torch.randn(batch, s.kv_heads, context, s.head_dim, device=dev, dtype=bf16)
        self.cos = torch.randn(batch, 1, s.head_dim, device=dev, dtype=bf16)
        self.sin = torch.randn(batch, 1, s.head_dim, device=dev, dtype=bf16)
        self.out: Any = None

    def linear(self, x: Any, w: dict[str, Any]) -> Any:
        t = self.t
        if "scale" not in w:
            return t.mm(x, w["w"])
        amax = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-6)
        scale = amax / 448.0
        xq = (x.float() / scale).to(t.float8_e4m3fn)
        return t._scaled_mm(xq, w["w"], scale_a=scale, scale_b=w["scale"], out_dtype=t.bfloat16)

    def norm(self, x: Any) -> Any:
        t = self.t
        return x * t.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def __call__(self) -> None:
        t, s, b = self.t, self.s, self.batch
        x = self.x
        q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
        group = s.heads // s.kv_heads
        for w in self.weights:
            qkv = self.linear(self.norm(x), w["qkv"])
            q = qkv[:, :q_width].reshape(b, s.heads, s.head_dim)
            q = q * self.cos + q * self.sin  # rotary embedding's elementwise work
            # the new token's key and value written to the cache's last slot, as an engine writes them
            self.k[:, :, -1, :].copy_(qkv[:, q_width : q_width + kv_width].reshape(b, s.kv_heads, s.head_dim))
            self.v[:, :, -1, :].copy_(qkv[:, q_width + kv_width :].reshape(b, s.kv_heads, s.head_dim))
            a = t.nn.functional.scaled_dot_product_attention(
                q.reshape(b, s.kv_heads, group, s.head_dim), self.k, self.v
            )  # the new token's attention over the cache
            x = x + self.linear(a.reshape(b, q_width), w["o"])
            gu = self.linear(self.norm(x), w["gate_up"])
            g, u = gu[:, : s.intermediate], gu[:, s.intermediate :]
            x = x + self.linear(t.nn.functional.silu(g) * u, w["down"])
        self.out = t.mm(self.norm(x), self.head)


def _weights(torch: Any, s: Shape) -> tuple[list[dict[str, Any]], Any]:
    """Random weights, distinct per layer, laid out as the GEMM calls take them (K x N; FP8 column-major)."""
    dev = "cuda"

    def matrix(k: int, n: int) -> dict[str, Any]:
        if s.dtype == "fp8":
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
            return {"w": w.t(), "scale": torch.full((1, n), 0.01, device=dev, dtype=torch.float32)}
        return {"w": torch.randn(k, n, device=dev, dtype=torch.bfloat16) * 0.02}

    layers = []
    q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for _ in range(s.layers):
        layers.append({
            "qkv": matrix(s.hidden, q_width + 2 * kv_width),
            "o": matrix(q_width, s.hidden),
            "gate_up": matrix(s.hidden, 2 * s.intermediate),
            "down": matrix(s.intermediate, s.hidden),
        })  # fmt: skip
    head = torch.randn(s.hidden, s.vocab, device=dev, dtype=torch.bfloat16) * 0.02
    return layers, head


def attention_backends(torch: Any) -> tuple[Any, str]:
    """A context that prefers cuDNN's attention for decode (torch's own flash kernel is far from the bandwidth limit
    on one query per request; STACK.md), then flash, memory-efficient and the math kernel; and its name."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH]  # fmt: skip
        return sdpa_kernel(order, set_priority=True), "cudnn>flash>efficient>math"
    except Exception:  # an older torch: its default choice
        return contextlib.nullcontext(), "default"


def measure(torch: Any, step: Step, power: Power) -> tuple[float, list[float], float | None, float | None, int]:
    """(median ms per step, per-batch ms, mean W, mean SM MHz, samples) of CUDA-graph replays of `step`."""
    context, _ = attention_backends(torch)
    with context:
        return _measure(torch, step, power)


def _measure(torch: Any, step: Step, power: Power) -> tuple[float, list[float], float | None, float | None, int]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    reps = max(3, int(200 / one))  # about 0.2 s per timed batch
    per_batch = []
    for _ in range(BATCHES):
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        per_batch.append(start.elapsed_time(end) / reps)
    power.start()
    began = time.monotonic()
    while time.monotonic() - began < MIN_POWER_S:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    watts, clock, samples = power.stop()
    del graph
    return statistics.median(per_batch), per_batch, watts, clock, samples


def run(shape: Shape, batches: list[int], contexts: list[int], power: Power) -> list[Row]:
    import torch

    torch.manual_seed(0)
    weights, head = _weights(torch, shape)
    rows = []
    for context in contexts:
        for batch in batches:
            row = Row(shape.name, shape.dtype, 1, batch, context)
            try:
                step = Step(torch, shape, batch, context, weights, head)
                row.step_ms, row.step_ms_batches, row.power_w, row.sm_clock_mhz, row.power_samples = measure(
                    torch, step, power
                )
                del step
            except Exception as e:  # one case that does not fit or fails: recorded, the others go on
                row.error = f"{type(e).__name__}: {str(e)[:300]}"
            torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(asdict(row)), file=sys.stderr, flush=True)
    del weights, head
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", choices=sorted(SHAPES), help="A model's shape (repeatable).")
    ap.add_argument("--config", help="A config.json instead (dense models): its shape, with --dtype.")
    ap.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16")
    ap.add_argument("--layers", type=int, help="Fewer layers than the model has (a quick check).")
    ap.add_argument("--batch", default="1,8,32,64,128,256")
    ap.add_argument("--context", default="1024,4096")
    ap.add_argument("--out", help="Write the JSON here (default: stdout).")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure", file=sys.stderr)
        return 2
    shapes = [SHAPES[name] for name in args.model or []]
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            where = Path(args.config).resolve()
            name = (where.parent.name if where.stem == "config" else where.stem) + (
                "-fp8" if args.dtype == "fp8" else ""
            )
            shapes.append(Shape.from_config(name, json.load(f), args.dtype))
    if args.layers:
        shapes = [Shape(**{**asdict(s), "layers": args.layers}) for s in shapes]
    power = Power()
    time.sleep(0.5)
    idle = power.read()
    batches = [int(x) for x in args.batch.split(",")]
    contexts = [int(x) for x in args.context.split(",")]
    rows = [row for shape in shapes for row in run(shape, batches, contexts, power)]
    data = {
        "format": FORMAT,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "attention": attention_backends(torch)[1],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "idle_power_w": idle[0] if idle else None,
        "idle_sm_clock_mhz": idle[1] if idle else None,
        **power.info(),
        "shapes": [asdict(s) for s in shapes],
        "rows": [asdict(r) for r in rows],
    }
    text = json.dumps(data, indent=1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
