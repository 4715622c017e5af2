"""A short helper subprocess (an interpreter probed for vLLM, its parser dumped) run with bounds: its own process
group, killed whole when it overruns its time (a wrapper script that hangs leaves no child behind), and at most
`max_bytes` of each output kept (a script that prints 200 MB costs no more memory than that)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_OUTPUT_BYTES = 8 * 2**20


@dataclass
class Bounded:
    returncode: int
    stdout: str
    stderr: str
    truncated: bool = False  # an output passed max_bytes: the rest was read and dropped


def run_bounded(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                max_bytes: int = MAX_OUTPUT_BYTES) -> Bounded:  # fmt: skip
    """Run `argv` to its end within `timeout` s; subprocess.TimeoutExpired (after its whole process group is
    killed) when it overruns, OSError when it cannot start."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(env) if env is not None else None, start_new_session=True)  # fmt: skip
    kept: dict[str, bytearray] = {"out": bytearray(), "err": bytearray()}
    cut = {"out": False, "err": False}

    def drain(name: str, pipe: object) -> None:
        buf = kept[name]
        while chunk := pipe.read(65536):  # type: ignore[attr-defined]
            room = max_bytes - len(buf)
            if room > 0:
                buf += chunk[:room]
            if len(chunk) > room:
                cut[name] = True

    readers = [threading.Thread(target=drain, args=(n, p), daemon=True) for n, p in (("out", proc.stdout),
                                                                                   ("err", proc.stderr))]  # fmt: skip
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # what it started and left behind goes with it
        for r in readers:
            r.join(timeout=5)
    decode = lambda b: bytes(b).decode("utf-8", errors="replace")  # noqa: E731
    return Bounded(proc.returncode, decode(kept["out"]), decode(kept["err"]), cut["out"] or cut["err"])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
