"""A stand-in for `transformers serve` on this host (no GPU), for the GPU campaign's plan in CI.

    python -m tests.standin_transformers_serve serve --continuous-batching --host H --port P [--dtype D]
        [--attn-implementation A] MODEL_DIR

It takes the options the plan's items set (scripts/gpu_campaign/plan.toml) and serves tests/timed_server.py's
exactly timed streams, slower where the real engine is slower: float32 weights read twice the bytes per step, eager
attention adds kernels, CUDA graphs take the launches away; and it fails as transformers serve 5.17 failed on an H100 (docs/gpu-campaign.md): with eager
attention, every request of the second level (concurrency 32) is answered with PyTorch's CUDA out-of-memory; with
PIVOT_GPU_HOLD_FRACTION set (the co-tenant item) it starts, and every request, the first included, is answered so.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tests import timed_server

ITL_MS = 4.0
SLOWER = {"float32": 2.0, "eager": 1.25}
OOM = "CUDA out of memory. Tried to allocate {} GiB. GPU 0 has a total capacity of 79.18 GiB of which {} GiB is free."
FIRST_LEVEL = 1 + 8  # the plan's first level: one warmup request and 8 prompts (min_prompts)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="transformers")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--continuous-batching", action="store_true")
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--attn-implementation", default=None)
    parser.add_argument("--cb-use-cuda-graph", action="store_true")
    args = parser.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        raise SystemExit(f"OSError: {args.model} does not appear to have a file named config.json")
    itl = ITL_MS * SLOWER.get(args.dtype, 1.0) * SLOWER.get(args.attn_implementation or "", 1.0)
    itl *= 0.5 if args.cb_use_cuda_graph else 1.0  # one graph replay per step instead of Python's kernel launches
    serve = ["--host", args.host, "--port", str(args.port), "--itl-ms", str(itl), "--model", args.model]
    if os.environ.get("PIVOT_GPU_HOLD_FRACTION"):
        serve += ["--fail-from", "1", "--error-message", OOM.format("0.98", "0.42")]
    elif args.attn_implementation == "eager":
        serve += ["--fail-from", str(FIRST_LEVEL + 1), "--error-message", OOM.format("4.43", "2.10")]
    timed_server.main(serve)


if __name__ == "__main__":
    main(sys.argv[1:])
