"""`--via sglang`: SGLang's own `sglang.benchmark.serving`, run once per level, as the reference."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent.errors import PivotError
from agent.models import BenchResult, BenchSpec, utcnow
from tools.loadgen.connect import _normalize_base_url
from tools.loadgen.level import LevelProgress
from tools.loadgen.output import read_jsonl

# ---------------------------------------------------------------------------------------------- --via sglang


def sglang_argv(
    base_url: str,
    spec: BenchSpec,
    concurrency: int,
    output_file: Path,
    *,
    python: str = sys.executable,
    model: str | None = None,
    tokenizer: str | None = None,
) -> list[str]:
    """The `python -m sglang.benchmark.serving` command line for one level of `spec`."""
    backend = {"generate": "sglang", "completions": "sglang-oai", "chat": "sglang-oai-chat"}[spec.endpoint]
    argv = [
        python,
        "-m",
        "sglang.benchmark.serving",
        "--backend",
        backend,
        "--base-url",
        _normalize_base_url(base_url),
        # bench_serving's "random" samples ShareGPT text (a download); random-ids is its download-free twin
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        str(spec.random_input_len),
        "--random-output-len",
        str(spec.random_output_len),
        "--random-range-ratio",
        repr(spec.random_range_ratio),
        "--num-prompts",
        str(spec.prompts_for(concurrency)),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf" if math.isinf(spec.request_rate) else repr(spec.request_rate),
        "--seed",
        str(spec.seed),
        "--warmup-requests",
        str(spec.warmup_requests),
        "--output-file",
        str(output_file),
        "--disable-tqdm",
    ]
    if spec.endpoint == "generate" and spec.dataset_name == "random-ids":
        argv.append("--tokenize-prompt")  # send input_ids, as pivot does, instead of decoded text
    if not spec.ignore_eos:
        argv.append("--disable-ignore-eos")
    if spec.goodput_slos_ms:  # SGLang 0.5.23's own goodput keys, from its own definitions
        argv += ["--goodput", *(f"{name}:{ms:g}" for name, ms in spec.goodput_slos_ms.items())]
    if model:
        argv += ["--model", model]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    return argv


def has_sglang_benchmark(python: str = sys.executable) -> bool:
    """Whether `python` can import SGLang's benchmark module."""
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('sglang.benchmark.serving') else 1)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def reference_sweep(
    base_url: str,
    spec: BenchSpec,
    *,
    python: str = sys.executable,
    model: str | None = None,
    tokenizer: str | None = None,
    output_file: Path | None = None,
    on_progress: Callable[[LevelProgress], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> BenchResult:
    """The same sweep run by SGLang's own benchmark module, one process per level; its JSONL read back.

    Raises PivotError when `python` has no SGLang or a level's process fails. Ctrl-C stops the
    running level and returns the finished ones with `interrupted=True`. Each level's client_cpu_s
    is its whole bench_serving process (start-up and imports included).
    """
    if not has_sglang_benchmark(python):
        raise PivotError(
            f"SGLang's benchmark module (sglang.benchmark.serving) is not installed for {python}",
            hint="install sglang (pip install 'pivot[sglang]'), or name an interpreter that has it with --sglang-python",
        )
    result = BenchResult(
        spec=spec, engine="sglang", source="measured", raw_path=str(output_file) if output_file else None
    )
    with tempfile.TemporaryDirectory(prefix="pivot-bench-") as tmp:
        target = output_file if output_file is not None else Path(tmp) / "bench_serving.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        for index, concurrency in enumerate(spec.concurrency):
            base = dict(
                level_index=index,
                levels_total=len(spec.concurrency),
                max_concurrency=concurrency,
                requests_total=spec.prompts_for(concurrency),
            )
            if on_progress:
                on_progress(LevelProgress(phase="running", **base))
            before = len(read_jsonl(target)) if target.exists() else 0
            argv = sglang_argv(base_url, spec, concurrency, target, python=python, model=model, tokenizer=tokenizer)
            cpu0 = os.times()
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                assert proc.stdout is not None
                lines = []
                for line in proc.stdout:
                    lines.append(line.rstrip("\n"))
                    if log:
                        log(line.rstrip("\n"))
                code = proc.wait()
            except KeyboardInterrupt:
                with contextlib.suppress(Exception):
                    proc.terminate()
                    proc.wait(timeout=10)
                result.interrupted = True
                break
            cpu1 = os.times()
            levels = read_jsonl(target) if target.exists() else []
            if code != 0 or len(levels) <= before:
                tail = "\n".join(lines[-15:])
                raise PivotError(
                    f"sglang.benchmark.serving failed at concurrency {concurrency} (exit {code})",
                    hint=f"its last lines:\n{tail}",
                )
            level = levels[-1].model_copy(
                update={
                    "client_cpu_s": (cpu1.children_user + cpu1.children_system)
                    - (cpu0.children_user + cpu0.children_system)
                }
            )
            result.levels.append(level)
            if on_progress:
                on_progress(LevelProgress(phase="done", requests_done=level.completed, level=level, **base))
    result.finished_at = utcnow()
    return result
