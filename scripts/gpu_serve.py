"""`transformers serve` on a GPU, optionally beside a co-tenant that holds most of the card's memory.

    python scripts/gpu_serve.py serve --continuous-batching --host 127.0.0.1 --port 8000 MODEL_DIR

Everything after the script's name is the `transformers` command line, run in this process (the console script's
own entry point), so the server is this process and pivot stops it as it stops any engine. With
PIVOT_GPU_HOLD_FRACTION=F (0 < F < 1) in the environment, F of the GPU's free memory is allocated first and held
until the server exits, as a second process on a shared card would hold it: the GPU campaign's item that provokes a
CUDA out-of-memory on purpose sets it (scripts/gpu_campaign/plan.toml), so that what pivot classifies is the engine's
own error while it loads the model. Needs torch (for the hold) and transformers with its serving extra.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

HOLD_ENV = "PIVOT_GPU_HOLD_FRACTION"


def hold_fraction(environ: dict[str, str] | os._Environ[str]) -> float | None:
    """The share of free GPU memory to hold, from the environment; None when unset; a clear error when not in (0, 1)."""
    raw = environ.get(HOLD_ENV, "").strip()
    if not raw:
        return None
    try:
        fraction = float(raw)
    except ValueError:
        raise SystemExit(f"gpu_serve: {HOLD_ENV}={raw!r} is not a number") from None
    if not 0 < fraction < 1:
        raise SystemExit(f"gpu_serve: {HOLD_ENV}={raw} must be between 0 and 1")
    return fraction


def hold(fraction: float) -> object:
    """Allocate `fraction` of the GPU's free memory and return the tensor (held while referenced)."""
    import torch

    free, total = torch.cuda.mem_get_info()
    size = int(free * fraction)
    held = torch.empty(size, dtype=torch.uint8, device="cuda")
    gib = 2**30
    print(
        f"gpu_serve: a co-tenant holds {size / gib:.1f} GiB of {torch.cuda.get_device_name()} "
        f"({free / gib:.1f} GiB free of {total / gib:.1f} GiB before it)",
        flush=True,
    )
    return held


def transformers_main() -> Callable[[], object]:
    """The `transformers` console script's entry point, found the way pip's launcher finds it."""
    from importlib.metadata import entry_points

    found = [e for e in entry_points(group="console_scripts") if e.name == "transformers"]
    if not found:
        raise SystemExit("gpu_serve: transformers has no `transformers` command here (pip install transformers)")
    return found[0].load()


def main(argv: list[str]) -> None:
    fraction = hold_fraction(os.environ)
    held = hold(fraction) if fraction is not None else None
    entry = transformers_main()
    sys.argv = ["transformers", *argv]
    try:
        sys.exit(entry())
    finally:
        del held


if __name__ == "__main__":
    main(sys.argv[1:])
