"""The method: its reading of the ledger (reading.py: Method, Judgement, Decision, interpret, the answers at
pivots) and its rules, enforced for every model (guard.py: RULES, the checks, MethodGuard, method_text).
Callers import from here: `from tools.method import Method, MethodGuard`."""

from tools.method.guard import (
    GUARDED_TOOLS,
    MIN_OPTIONS,
    MIN_QUESTION_CHARS,
    RULES,
    Args,
    Check,
    MethodGuard,
    Rule,
    baseline_runs_needed,
    method_text,
    refusal,
)
from tools.method.reading import (
    CONTINUE_WORDS,
    REFUSED_FAILURES,
    STOP_ANSWERS,
    STOP_WORDS,
    Decision,
    Judgement,
    Method,
    Suggestion,
    interpret,
    not_measured_text,
    understood,
)

__all__ = [
    "CONTINUE_WORDS",
    "GUARDED_TOOLS",
    "MIN_OPTIONS",
    "MIN_QUESTION_CHARS",
    "REFUSED_FAILURES",
    "RULES",
    "STOP_ANSWERS",
    "STOP_WORDS",
    "Args",
    "Check",
    "Decision",
    "Judgement",
    "Method",
    "MethodGuard",
    "Rule",
    "Suggestion",
    "baseline_runs_needed",
    "interpret",
    "method_text",
    "not_measured_text",
    "refusal",
    "understood",
]
