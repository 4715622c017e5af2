"""Why a server failed, from its log: one table of regular expressions (FAILURE_RULES) over the log's tail.

The classes are the ones pivot records as an experiment's `failure`: oom, cuda-error, nccl-error,
unrecognized-argument, ambiguous-argument, argument-validation, compile-failure, port-in-use, model-not-found,
engine-not-installed (the launch command cannot find SGLang), and unknown when no rule matches. The lines are SGLang's (and PyTorch's, NCCL's, Hugging Face's, argparse's) as
they appear in a server log, and the twin's (`pivot sim serve`), which writes the same words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


@dataclass(frozen=True)
class FailureRule:
    """A failure class and the log line that shows it; `needs` must also appear in the tail, `unless` must not."""

    failure: str
    pattern: re.Pattern[str]
    needs: re.Pattern[str] | None = None
    unless: re.Pattern[str] | None = None


# The first rule with a matching line wins, so the specific come before the general (CUDA's out-of-memory error
# is an OOM before it is a CUDA error; NCCL reports CUDA errors as NCCL errors).
FAILURE_RULES: tuple[FailureRule, ...] = (
    FailureRule("unrecognized-argument", _rx(r": error: unrecognized arguments?:")),
    FailureRule("ambiguous-argument", _rx(r": error: ambiguous option:")),
    FailureRule(
        "argument-validation",
        _rx(r": error: (argument \S+|the following arguments are required|invalid choice|expected one argument)"),
    ),
    FailureRule("port-in-use", _rx(r"address already in use|\[errno 98\]|\bEADDRINUSE\b")),
    FailureRule(
        "engine-not-installed",
        _rx(
            r"No module named '?sglang|Error while finding module specification for 'sglang|"
            r"\bsglang: (command )?not found|No such file or directory: '?sglang'?$"
        ),
    ),
    FailureRule(
        "oom",
        _rx(
            r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|Not enough memory|"
            r"cudaErrorMemoryAllocation|\bMemoryError\b|(Error|Exception): .*\bout of memory"
        ),
    ),
    FailureRule(
        "nccl-error",
        _rx(
            r"NCCL error|\bnccl(UnhandledCudaError|InternalError|SystemError|InvalidUsage|InvalidArgument|RemoteError)|"
            r"NCCL WARN|ProcessGroupNCCL.*(timeout|timed out|watchdog)|DistBackendError"
        ),
    ),
    FailureRule(
        "cuda-error",
        _rx(
            r"CUDA error|CUDA driver error|\bcudaError\w+|CUBLAS_STATUS_\w+|cuDNN error|illegal memory access|"
            r"device-side assert|no CUDA-capable device|CUDA driver version is insufficient|AcceleratorError"
        ),
    ),
    FailureRule(
        "compile-failure",
        _rx(
            r"CompilationError|triton\.compiler\.errors|InductorError|BackendCompilerFailed|nvcc (fatal|error)|"
            r"ptxas (fatal|error)|Error building extension|ninja: build stopped|"
            r"CalledProcessError.*\b(nvcc|gcc|g\+\+|ninja|cc1plus)\b|failed to compile"
        ),
    ),
    FailureRule(
        "model-not-found",
        _rx(
            r"is not a local folder and is not a valid model identifier|RepositoryNotFoundError|"
            r"Repository Not Found|does not appear to have a file named config\.json|"
            r"Can't load the configuration of|No such file or directory: \S*config\.json|GatedRepoError|"
            r"LocalEntryNotFoundError|couldn't connect to 'https://huggingface\.co'|OfflineModeIsEnabled"
        ),
    ),
    # the twin (`pivot sim serve`): a value SGLang's parser takes but the twin cannot simulate
    FailureRule("not-simulable", _rx(r"pivot twin: cannot simulate")),
    # SGLang checks its arguments in ServerArgs (server_args.py) and its arg_groups hooks, in the launching process
    FailureRule(
        "argument-validation",
        _rx(r"\b(ValueError|AssertionError|ArgumentTypeError|NotImplementedError)\b"),
        needs=_rx(r"server_args\.py|arg_groups|check_server_args|prepare_server_args|argparse\.py"),
    ),
    # a ValueError or AssertionError that ends the launcher itself (not one raised in a scheduler process)
    FailureRule(
        "argument-validation",
        _rx(r"^(\[[^\]]*\]\s*)?(ValueError|AssertionError)\b"),
        unless=_rx(r"Scheduler hit an exception|TpModelWorker|DetokenizerManager"),
    ),
)
UNKNOWN = "unknown"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_LOG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:.]+[^\]]*\]\s*")


@dataclass(frozen=True)
class Diagnosis:
    """Why a server failed: the failure class and the log line that shows it (None when nothing matched)."""

    failure: str
    line: str | None = None

    def __str__(self) -> str:
        return self.failure if self.line is None else f"{self.failure}: {self.line}"


def diagnose(lines: str | Sequence[str]) -> Diagnosis:
    """The failure class of a log tail, by FAILURE_RULES (first matching rule wins), and the line that matched."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    clean = [ANSI.sub("", line).rstrip() for line in lines]
    text = "\n".join(clean)
    for rule in FAILURE_RULES:
        if rule.needs is not None and not rule.needs.search(text):
            continue
        if rule.unless is not None and rule.unless.search(text):
            continue
        for line in reversed(clean):
            if rule.pattern.search(line):
                return Diagnosis(rule.failure, line.strip())
    return Diagnosis(UNKNOWN)


def classify_failure(lines: str | Sequence[str]) -> str:
    """The failure class of a log tail: oom, cuda-error, nccl-error, unrecognized-argument, ..., or unknown."""
    return diagnose(lines).failure


def short_line(line: str, limit: int = 160) -> str:
    """A log line without SGLang's timestamp prefix, cut to `limit` characters."""
    line = _LOG_PREFIX.sub("", ANSI.sub("", line)).strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."
