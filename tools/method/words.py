"""The method's words for a change it cannot measure: a launch the engine refused (in the engine's own sentence,
pivot's framing taken off) and a change of flags a simulated engine does not model."""

from __future__ import annotations

import re

from agent import models as m

# the words a launch failure was recorded with (tools/engines/process.py): "vllm exited while starting (exit code 1):
# argument-validation (Value error, ...)"; the engine's own sentence is the part in brackets at the end
_STARTUP_WORDS = re.compile(r"^.*? exited while starting \([^)]*\): [\w-]+ \((?P<words>.*)\)$", re.DOTALL)


def engine_words(detail: str | None) -> str:
    """The engine's own sentence from a failure's recorded detail (pivot's framing taken off), else ''."""
    if not detail:
        return ""
    found = _STARTUP_WORDS.match(detail.strip())
    return (found.group("words") if found else detail).strip()


def refused_text(e: m.Experiment) -> str:
    """Why a change the engine refused at startup is ruled out, in the engine's own words where it gave some."""
    words = engine_words(e.failure_detail)
    what = (
        "the engine cannot run it on this hardware"
        if e.failure == "unsupported-hardware"
        else "the engine refused the flags"
    )
    return f"{what} ({e.failure})" + (f": {words}" if words else "")


def _names(flags: list[str]) -> str:
    return ", ".join(flags[:-1]) + f" and {flags[-1]}" if len(flags) > 1 else (flags[0] if flags else "")


def not_measured_text(flags: list[str]) -> str:
    """Why a change is not measured, and what would measure it."""
    return (
        f"not measured: the twin does not model {_names(flags)}, so its numbers cannot show what this change does; "
        "measure it on a GPU (--engine sglang)"
    )
