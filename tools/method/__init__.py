"""The method: its reading of the ledger (reading.py: Method, Judgement; objective.py: what is judged and the noise
statistic; answers.py: what the answers at pivots decide), its moves (moves.py: everything that may happen next,
one value for every reader), and its rules, enforced for every model (guard.py: RULES, MethodGuard, method_text).
Callers import from here: `from tools.method import Method, Moves, MethodGuard`."""

from tools.method.answers import (
    CONTINUE_WORDS,
    STOP_ANSWERS,
    STOP_WORDS,
    Decision,
    decision,
    interpret,
    understood,
)
from tools.method.guard import (
    GUARDED_TOOLS,
    MIN_OPTIONS,
    MIN_QUESTION_CHARS,
    RULES,
    Args,
    Check,
    MethodGuard,
    Rule,
    method_text,
    refusal,
)
from tools.method.moves import (
    BENCHMARK_REFUSED,
    Moves,
    PivotDue,
    Refusal,
    baseline_runs_needed,
    permitted,
)
from tools.method.objective import (
    THROUGHPUT,
    Objective,
    PlanObjective,
    noise_pct,
    objective_for,
)
from tools.method.reading import (
    REFUSED_FAILURES,
    Judgement,
    Method,
    Suggestion,
    not_measured_text,
)

__all__ = [
    "BENCHMARK_REFUSED",
    "CONTINUE_WORDS",
    "GUARDED_TOOLS",
    "MIN_OPTIONS",
    "MIN_QUESTION_CHARS",
    "REFUSED_FAILURES",
    "RULES",
    "STOP_ANSWERS",
    "STOP_WORDS",
    "THROUGHPUT",
    "Args",
    "Check",
    "Decision",
    "Judgement",
    "Method",
    "MethodGuard",
    "Moves",
    "Objective",
    "PivotDue",
    "PlanObjective",
    "Refusal",
    "Rule",
    "Suggestion",
    "baseline_runs_needed",
    "decision",
    "interpret",
    "method_text",
    "noise_pct",
    "not_measured_text",
    "objective_for",
    "permitted",
    "refusal",
    "understood",
]
