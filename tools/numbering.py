"""Experiment numbers as users and models read them: the n-th experiment of a session (1, 2, ...), mapped to and from
the ledger's row ids, which stay internal (one ledger holds every session, so its ids run on across sessions).

Every report, the CLI and the TUI show `Experiment.number`. The model speaks numbers too: `NumberedToolset`, the
outermost wrapper of every toolset, turns the numbers a model gives (`experiment_id` arguments, at any depth) into
the ledger's ids before the method's guard and the tool see them, and the ids in what a tool returns
(`experiment_id`, `base_experiment_id`, `experiment_ids`) back into numbers. So "rerun experiment 3", read off a
summary, names the same experiment to the user, the model and the ledger.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from agent.session import Session
from agent.store import Store

ID_KEYS = ("experiment_id", "base_experiment_id", "best_experiment_id")
MAX_TOOL_ARGS_CHARS = 64 * 1024  # the largest arguments a tool call may bring (a summary's question and options fit)
LIST_KEYS = ("experiment_ids",)


class Numbering:
    """One session's mapping between experiment numbers and the ledger's ids."""

    def __init__(self, store: Store, session_id: str) -> None:
        experiments = store.experiments(session_id)
        self.by_id = {e.id: e.number for e in experiments if e.id is not None and e.number is not None}
        self.by_number = {n: i for i, n in self.by_id.items()}

    def number(self, experiment_id: int | None) -> int | None:
        return self.by_id.get(experiment_id) if experiment_id is not None else None

    def ledger_id(self, number: Any) -> int:
        """The ledger id of the session's experiment `number`; a retry naming the numbers there are when none is."""
        try:
            n = int(number)
        except (TypeError, ValueError):
            n = -1
        if n not in self.by_number:
            known = ", ".join(map(str, sorted(self.by_number))) or "none yet"
            raise ModelRetry(f"no experiment {number} in this session; its experiments: {known}")
        return self.by_number[n]

    def to_ids(self, data: Any) -> Any:
        """`data` (tool arguments) with every experiment number turned into the ledger's id."""
        if isinstance(data, Mapping):
            return {k: self._arg(k, v) for k, v in data.items()}
        if isinstance(data, list):
            return [self.to_ids(v) for v in data]
        return data

    def _arg(self, key: str, value: Any) -> Any:
        if key in ID_KEYS and value is not None:
            return self.ledger_id(value)
        return self.to_ids(value)

    def to_numbers(self, data: Any) -> Any:
        """`data` (what a tool returned) as plain data, with every ledger id of an experiment turned into its number."""
        if isinstance(data, BaseModel):  # the same model back, its ids numbered (a dict if it will not take them)
            plain = self.to_numbers(data.model_dump(mode="json"))
            try:
                return type(data).model_validate(plain)
            except ValueError:
                return plain
        if isinstance(data, Mapping):
            out: dict[str, Any] = {}
            for k, v in data.items():
                if k in ID_KEYS and isinstance(v, int) and not isinstance(v, bool):
                    out[k] = self.by_id.get(v, v)
                elif k in LIST_KEYS and isinstance(v, list):
                    out[k] = [self.by_id.get(x, x) if isinstance(x, int) else x for x in v]
                else:
                    out[k] = self.to_numbers(v)
            return out
        if isinstance(data, list):
            return [self.to_numbers(v) for v in data]
        return data


def number_of(session: Session, experiment_id: int | None) -> int | str:
    """The session's number of an experiment known by its ledger id, for a line a user reads ("?" when unknown)."""
    if experiment_id is None:
        return "?"
    try:
        e = session.store.get_experiment(experiment_id)
    except Exception:
        return "?"
    return e.number if e.number is not None else "?"


@dataclass
class NumberedToolset(WrapperToolset[Session]):
    """Wraps a toolset (outside the method's guard): the model's experiment numbers in, the ledger's ids to the tools;
    the tools' ids out, numbers to the model; and a call whose arguments pass MAX_TOOL_ARGS_CHARS refused."""

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Session], tool: ToolsetTool[Session]
    ) -> Any:
        size = len(json.dumps(tool_args, default=str))
        if size > MAX_TOOL_ARGS_CHARS:  # no tool takes megabytes: refused before anything (the guard, the tool) runs
            raise ModelRetry(
                f"the arguments of this {name} call are {size:,} characters; a call's arguments are at most "
                f"{MAX_TOOL_ARGS_CHARS:,}: send the call again with short arguments"
            )
        numbering = Numbering(ctx.deps.store, ctx.deps.id)
        result = await super().call_tool(name, numbering.to_ids(tool_args), ctx, tool)
        return Numbering(ctx.deps.store, ctx.deps.id).to_numbers(result)  # the call may have added experiments
