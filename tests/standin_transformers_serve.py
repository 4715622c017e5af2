"""A stand-in for `transformers serve` on this host (no GPU), for the GPU campaign's plan in CI.

    python -m tests.standin_transformers_serve serve --continuous-batching --host H --port P [--dtype D]
        [--attn-implementation A] MODEL_DIR

It takes the options the plan's items set (scripts/gpu_campaign/plan.toml) and serves tests/timed_server.py's
exactly timed streams, slower where the real engine is slower: float32 weights read twice the bytes per step, eager
attention adds kernels. With PIVOT_GPU_HOLD_FRACTION set (the co-tenant item) it fails as transformers does when
the weights no longer fit: PyTorch's CUDA out-of-memory while loading, exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tests import timed_server

ITL_MS = 4.0
SLOWER = {"float32": 2.0, "eager": 1.25}
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 7.62 GiB is free. Including non-PyTorch memory, this process has 71.56 GiB memory in use."
)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="transformers")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--continuous-batching", action="store_true")
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--attn-implementation", default=None)
    args = parser.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        raise SystemExit(f"OSError: {args.model} does not appear to have a file named config.json")
    if os.environ.get("PIVOT_GPU_HOLD_FRACTION"):
        print("Traceback (most recent call last):", flush=True)
        print('  File "transformers/modeling_utils.py", line 4890, in _load_pretrained_model', flush=True)
        print(OOM, file=sys.stderr, flush=True)
        raise SystemExit(1)
    itl = ITL_MS * SLOWER.get(args.dtype, 1.0) * SLOWER.get(args.attn_implementation or "", 1.0)
    timed_server.main(["--host", args.host, "--port", str(args.port), "--itl-ms", str(itl), "--model", args.model])


if __name__ == "__main__":
    main(sys.argv[1:])
