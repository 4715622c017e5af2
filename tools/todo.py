"""The todo toolset: the agent's todo list (kept in the ledger) and read access to the plan."""

from __future__ import annotations

from pydantic import BaseModel, Field
from pydantic_ai import FunctionToolset, ModelRetry, RunContext

from agent.errors import PivotError
from agent.models import Plan, PlanItem, Todo
from agent.session import Session

toolset: FunctionToolset[Session] = FunctionToolset(id="todo", max_retries=3)


class TodoList(BaseModel):
    """The todo list as stored, with counts by status."""

    todos: list[Todo]
    pending: int = Field(description="Todos not started.")
    in_progress: int
    completed: int
    cancelled: int

    @classmethod
    def of(cls, todos: list[Todo]) -> TodoList:
        count = {s: sum(t.status == s for t in todos) for s in ("pending", "in_progress", "completed", "cancelled")}
        return cls(todos=todos, **count)


@toolset.tool
def todo_read(ctx: RunContext[Session]) -> TodoList:
    """Read the session's todo list (content, status, priority, plan item) in its order."""
    return TodoList.of(ctx.deps.store.todos(ctx.deps.id))


@toolset.tool
def todo_write(ctx: RunContext[Session], todos: list[Todo]) -> TodoList:
    """Replace the whole todo list with `todos`, in the order given.

    Send every todo each time, not only the changed ones. Keep at most one todo `in_progress`.
    status: pending | in_progress | completed | cancelled; priority: high | medium | low.
    Give `plan_item` (e.g. "02") when a todo works on a plan item. Ids are kept; empty ids are assigned.
    """
    active = [t.content for t in todos if t.status == "in_progress"]
    if len(active) > 1:
        raise ModelRetry(f"{len(active)} todos are in_progress ({'; '.join(active)}); keep at most one")
    plan_ids = set(ctx.deps.plan.item_ids())
    unknown = sorted({t.plan_item for t in todos if t.plan_item and t.plan_item not in plan_ids})
    if unknown:
        raise ModelRetry(f"unknown plan item(s) {', '.join(unknown)}; the plan has {', '.join(sorted(plan_ids))}")
    stored = ctx.deps.store.replace_todos(ctx.deps.id, todos)
    ctx.deps.emit("info", f"todo list: {len(stored)} items", todos=[t.model_dump() for t in stored])
    return TodoList.of(stored)


@toolset.tool
def plan_read(ctx: RunContext[Session], item_id: str | None = None) -> Plan | PlanItem:
    """Read the optimization plan, or one of its items.

    Without `item_id`: the whole plan (target and base flags, workload, tiers, items, prior results).
    With `item_id` such as "02": that item (tier, kind, flags or change, hypothesis, expected impact, risks).
    """
    plan = ctx.deps.plan
    if item_id is None:
        return plan
    try:
        return plan.item(item_id)
    except PivotError as e:  # the model named an item the plan lacks: it corrects the call, the run goes on
        raise ModelRetry(f"{e.message}; {e.hint}") from e
