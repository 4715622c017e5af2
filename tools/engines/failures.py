"""Why a server failed, from its log: tables of regular expressions over the log's tail.

The classes are the ones pivot records as an experiment's `failure`: oom, cuda-error, nccl-error,
unrecognized-argument, ambiguous-argument, invalid-choice (argparse's: a value not among a flag's choices),
argument-validation, unsupported-hardware (the engine says this host cannot run what was asked: "FP8 KV cache on CPU
requires x86 with AVX-512 or AMX"), compile-failure, port-in-use, model-not-found, engine-not-installed (the launch
command cannot find the engine), and unknown when no rule matches. The line a diagnosis gives is the one that says
why: the matched line, else the first exception the log raised (the line that ends its first Python traceback), never
merely the last line (a warning printed at exit says nothing of the cause). The rules here
are the ones every engine shares (argparse's, PyTorch's, CUDA's, NCCL's, Hugging Face's words); each engine owns
its list (`failure_rules`: SGLang's in tools/engines/sglang.py, vLLM's in tools/engines/vllm.py), which puts these
in order with its own, and `Engine.diagnose` applies it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.contracts import Diagnosis


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


@dataclass(frozen=True)
class FailureRule:
    """A failure class and the log line that shows it; `needs` must also appear in the tail, `unless` must not.
    `detail`: a line after the matched one that says why (pydantic's "Value error, ..." under its count of errors),
    joined to it in the diagnosis."""

    failure: str
    pattern: re.Pattern[str]
    needs: re.Pattern[str] | None = None
    unless: re.Pattern[str] | None = None
    detail: re.Pattern[str] | None = None


# Rules shared by every engine; an engine's own list (its `failure_rules`) puts them in order with its own. The
# first rule with a matching line wins, so the specific come before the general (CUDA's out-of-memory error is an
# OOM before it is a CUDA error; NCCL reports CUDA errors as NCCL errors).

# argparse's own errors: every engine here parses its command line with argparse (or a subclass of it)
ARGPARSE_RULES: tuple[FailureRule, ...] = (
    FailureRule("unrecognized-argument", _rx(r": error: unrecognized arguments?:")),
    FailureRule("ambiguous-argument", _rx(r": error: ambiguous option:")),
    FailureRule("invalid-choice", _rx(r": error: argument \S+: invalid choice:")),
    FailureRule(
        "argument-validation",
        _rx(r": error: (argument \S+|the following arguments are required|invalid choice|expected one argument)"),
    ),
)
# pivot's own refusal of its own options (`pivot sim serve` behind the sim-http engine prints `error: ...` and `hint:
# ...`, at the start of a line where engines' argparse writes `PROG: error:`): a failure of pivot's, never the engine's
PIVOT_FAILURE = "pivot-error"
PIVOT_RULE = FailureRule(PIVOT_FAILURE, _rx(r"^error: "), needs=re.compile(r"^hint: ", re.MULTILINE))
PORT_RULE = FailureRule("port-in-use", _rx(r"address already in use|\[errno 98\]|\bEADDRINUSE\b"))
# PyTorch's, CUDA's, NCCL's, compilers' and Hugging Face's words, whichever engine runs them
RUNTIME_RULES: tuple[FailureRule, ...] = (
    FailureRule(
        "unsupported-hardware",
        _rx(
            r"\b(NotImplementedError|RuntimeError|ValueError|AssertionError|TypeError)\b.*("
            r"\brequires? (an? )?(x86|AVX|AMX|ARM|NEON|GPU|CUDA|ROCm|compute capability|sm_?\d+|Hopper|Ampere|Ada|"
            r"Blackwell|Turing|Volta|H100|H200|B200|SM ?\d+)|"
            r"\bnot (yet )?(supported|implemented|available) (on|for) (this |the current |your )?"
            r"(CPU|GPU|platform|hardware|device|ROCm|XPU|TPU|HPU|architecture|backend)|"
            r"\bonly (be )?(supported|available) on\b|"
            r"\bunsupported (platform|device|hardware|GPU|architecture|compute capability)|"
            r"\bis not supported (on|by) (this|the current|your) (platform|device|hardware|GPU|CPU|machine))"
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
)
COMMON_RULES: tuple[FailureRule, ...] = (*ARGPARSE_RULES, PORT_RULE, *RUNTIME_RULES)


def not_installed_rule(module: str, command: str) -> FailureRule:
    """engine-not-installed: the launch command cannot find the engine's Python package `module` or its `command`."""
    m, c = re.escape(module), re.escape(command)
    return FailureRule(
        "engine-not-installed",
        _rx(
            rf"No module named '?{m}\b|Error while finding module specification for '{m}\b|"
            rf"\b{c}: (command )?not found|No such file or directory: '?{c}'?$"
        ),
    )


UNKNOWN = "unknown"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_LOG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:.]+[^\]]*\]\s*")
_MODULE_PREFIX = re.compile(r"^(?:[A-Za-z_]\w*\.)+(?=\w+(?:Error|Exception)\b)")  # pydantic_core._pydantic_core.


def diagnose(lines: str | Sequence[str], rules: Sequence[FailureRule] = COMMON_RULES) -> Diagnosis:
    """The failure class of a log tail by `rules` (an engine's `failure_rules`; the first matching rule wins), and
    the line that matched."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    clean = [ANSI.sub("", line).rstrip() for line in lines]
    text = "\n".join(clean)
    for rule in rules:
        if rule.needs is not None and not rule.needs.search(text):
            continue
        if rule.unless is not None and rule.unless.search(text):
            continue
        for i in range(len(clean) - 1, -1, -1):
            if rule.pattern.search(clean[i]):
                line = clean[i].strip()
                after = next((x for x in clean[i + 1 : i + 6] if rule.detail and rule.detail.search(x)), None)
                if after is None:
                    return Diagnosis(rule.failure, line)
                line = _MODULE_PREFIX.sub("", _LOG_PREFIX.sub("", line))  # the detail needs the room
                return Diagnosis(rule.failure, f"{line}: {after.strip()}")
    return Diagnosis(UNKNOWN, first_exception(clean))


def serving_failure(errors: Iterable[str]) -> Diagnosis | None:
    """The failure class a running server's own error answers name (PyTorch's CUDA out-of-memory while it serves a
    batch, a CUDA error, ...: the runtime rules), or None when they name none of them. A server that loads its model
    on the first request (transformers serve) or runs out of memory at a larger batch fails requests, not its start:
    its answers are where the cause is."""
    for text in errors:
        found = diagnose(text, RUNTIME_RULES)
        if found.failure != UNKNOWN:
            return found
    return None


# An exception as Python prints it at the end of a traceback: `NotImplementedError: FP8 KV cache ...`,
# `pydantic_core._pydantic_core.ValidationError: 1 validation error ...`, `torch.OutOfMemoryError`, `SystemExit: 1`
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure))(?::\s.*|:?$)")
_WARNING = re.compile(r"Warning\b|warnings\.warn\(")
# a prefix engines print before a line: vLLM's `(EngineCore_DP0 pid=123) ` and `ERROR 12-04 10:00:00 [core.py:7] `,
# SGLang's `[2026-12-04 10:00:00 TP0] `
_ENGINE_PREFIX = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:.]+ \[[^\]]*\]\s*)?"
)


def _bare(line: str) -> str:
    return _ENGINE_PREFIX.sub("", _LOG_PREFIX.sub("", ANSI.sub("", line))).rstrip()


def first_exception(lines: str | Sequence[str]) -> str | None:
    """The first exception a log raised: the line that ends its first Python traceback (in a chain, the first is the
    cause: "During handling of the above exception, another exception occurred"), else the first line that reads
    as an exception; None when there is none. Warnings (`UserWarning: ...`, `warnings.warn(...)`) are not
    exceptions. The line is given without the engine's log prefix."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    bare = [_bare(line) for line in lines]
    in_traceback = False
    for line in bare:
        if line.endswith("Traceback (most recent call last):"):
            in_traceback = True
            continue
        if in_traceback and line and not line[0].isspace() and _EXCEPTION.match(line) and not _WARNING.search(line):
            return line.strip()
    return next((x.strip() for x in bare if _EXCEPTION.match(x) and not _WARNING.search(x)), None)


def classify_failure(lines: str | Sequence[str], rules: Sequence[FailureRule] = COMMON_RULES) -> str:
    """The failure class of a log tail: oom, cuda-error, nccl-error, unrecognized-argument, ..., or unknown."""
    return diagnose(lines, rules).failure


def short_line(line: str, limit: int = 160) -> str:
    """A log line without SGLang's timestamp prefix, cut to `limit` characters."""
    line = _LOG_PREFIX.sub("", ANSI.sub("", line)).strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."
