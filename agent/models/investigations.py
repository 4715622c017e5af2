"""Investigations: a question put to a sub-agent with a read-only toolset, and the report it gave back."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from agent.models.base import _Model, utcnow

InvestigationKind = Literal["crash", "root_cause", "question"]
InvestigationStatus = Literal["running", "done", "limit", "failed"]


class Investigation(_Model):
    """One sub-agent investigation: the question, what it read (tools), its model's use, and its report."""

    id: int | None = None
    session_id: str | None = None
    kind: InvestigationKind = Field(
        default="question",
        description="crash (after a crash: the log and what to try), root_cause (the GEMM and "
        "roofline evidence of the best configuration) or question (anything else asked).",
    )
    question: str = Field(min_length=1)
    experiment_id: int | None = Field(default=None, description="The experiment the question is about, if any.")
    model: str = Field(description="The model string the sub-agent ran on (never a key).")
    tools_used: list[str] = Field(default_factory=list, description="The read-only tools it called, in order.")
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    status: InvestigationStatus = "running"
    report: str = Field(default="", description="The sub-agent's report, in its words; facts with their sources.")
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
