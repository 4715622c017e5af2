"""The autopilot: pivot's built-in offline model, a deterministic policy behind pydantic-ai's FunctionModel.

Each time the agent asks it for a response, it reads the method's moves (tools/method/moves.py: everything that may
happen next, computed from the plan, the ledger and the answers; never the conversation, except to pair two calls
it makes back to back: an audit and the launch it clears, a status summary and the question it ends with) and
answers with the one tool call that comes next:

1. the todo list, kept in step with the ledger;
2. a server still up: benchmark it, profile it when its item asks for that, else stop it;
3. an improvement document for every plan item, before the first experiment;
4. the verdict (or the rerun) the moves permit for each measured experiment;
5. documents whose item changed since they were written (the ledger says which);
6. the pivot the moves owe (an analysis of the best first, a sub-agent investigation where the seeds made one:
   after a crash, the best's root cause (agent/investigate.py), a status summary, then ask_user with the questions
   of agent/questions.py);
7. the baseline, run until its runs measure the noise;
8. the first of the moves' steps: what was asked for at a pivot, then the search's steps (a candidate predicted
   beyond the noise band, alone, combined, retested on a new best, or a revert; an item settled without a launch),
   then the plan's order: audit first, launch, benchmark, verdict, stop;
9. nothing left: the final summary, once, then the end.

It only ever calls what the moves contain. A call the method refuses is a bug of the autopilot, not something to
retry: it raises AutopilotRefused, and the loop leaves the session resumable with a crash report. Nothing in this
module knows any particular plan.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic_ai import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.messages import ModelMessage, ModelRequest, RetryPromptPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent import models as m
from agent.investigate import investigation_due
from agent.questions import question
from agent.session import Session
from agent.steps import Call, Steps
from tools import reports, search
from tools.method import Method, Moves
from tools.method.compute import moves_of
from tools.method.moves import profiled
from tools.numbering import Numbering


class AutopilotRefused(RuntimeError):
    """The method refused a call the autopilot made: the autopilot chose something that is not among the moves."""


class Autopilot(Steps):
    """The method as a deterministic policy over a session's moves (see the module docstring)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._doc_keys: dict[str, tuple] = {}  # item -> what its document was last checked against

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self.respond, model_name="autopilot")

    # ---- the model interface

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        refused = _refusals(messages)
        if refused:
            raise AutopilotRefused(f"the method refused the autopilot's call: {refused[0][:400]}")
        last = _last_returns(messages)  # as the model sent and read them: the session's experiment numbers
        call = self.next_call(last)
        if call.tool is None:
            return ModelResponse(parts=[TextPart(call.text)])
        # the policy reads the ledger's ids; a model speaks the session's experiment numbers (tools/numbering.py)
        call = Call(call.tool, Numbering(self.session.store, self.session.id).to_numbers(call.args), call.text)
        prev = last.get("record_verdict")
        if call.tool == "record_verdict" and prev is not None and prev[0] == call.args and isinstance(prev[1], dict):
            raise AutopilotRefused(f"the same verdict twice in a row changed nothing: {call.args}")
        tool_call_id = (
            "ap-"
            + hashlib.sha256(
                json.dumps([len(messages), call.tool, call.args], sort_keys=True, default=str).encode()
            ).hexdigest()[:12]
        )
        return ModelResponse(parts=[ToolCallPart(call.tool, call.args, tool_call_id=tool_call_id)])

    # ---- the policy

    def next_call(self, last: dict[str, tuple[dict[str, Any], Any]] | None = None) -> Call:
        """The next step, from the moves (`last`: the previous response's tool calls and their results). With an
        executor (`pivot run --ray`), every launch is a step of run_experiments: its servers run where the executor
        puts them, never in this process."""
        moves = moves_of(self.session)
        call = self.call_for(moves, last or {})
        if self.session.settings.executor is not None and call.tool == "launch_server":
            return Call(
                "run_experiments", {"experiments": [{**call.args, "runs": self.runs_at_once(call.args, moves)}]}
            )
        return call

    def call_for(self, moves: Moves, last: dict[str, tuple[dict[str, Any], Any]]) -> Call:
        s = self.session
        method = moves.method
        plan = method.plan
        ledger = reports.Ledger.read(s.store, s.id)

        if moves.phase == "asked":  # a question waits for the user (a resume gives the answer first)
            return Call(None, text=f"Waiting for the answer: {moves.why}.")
        todos = self.todos(moves, ledger)  # 1. the todo list
        if [(t.content, t.status) for t in s.store.todos(s.id)] != [(t.content, t.status) for t in todos]:
            return Call("todo_write", {"todos": [t.model_dump(exclude={"id"}) for t in todos]})
        live = s.live  # 2. a server still up
        if live is not None:
            e = method.experiment(live.experiment_id)
            if e is not None and method.run_count(e) > live.runs_at_start:
                item = plan.item(e.plan_item) if e.plan_item in plan.item_ids() else None
                if item is not None and item.kind == "profile" and not profiled(method, e):
                    return Call("profile")
                return Call("stop_server")
            if e is not None and e.status == "running":
                return Call("run_benchmark")
            return Call("stop_server")
        if moves.phase == "documents":  # 3. documents before the first experiment
            written = {d.plan_item for d in ledger.documents if d.kind == "improvement"}
            return Call("write_improvement_doc", {"plan_item": next(i for i in plan.item_ids() if i not in written)})
        call = self.judge_step(moves)  # 4. verdicts and the reruns they wait for
        if call is not None:
            return call
        stale = self.stale_doc(ledger, last)  # 5. documents out of date with the ledger
        if stale is not None:
            return Call("write_improvement_doc", {"plan_item": stale})
        if moves.pivot is not None:  # 6. the pivot owed
            return self.pivot(moves, ledger, last)
        if moves.phase == "baseline":  # 7. the baseline
            if moves.baseline:
                return self.audited(last, None, Call("launch_server", {"baseline": True}))
            return Call("launch_server", {"experiment_id": min(moves.reruns)})
        if moves.steps:  # 8. the first step
            return self.take(moves, moves.steps[0], last)
        return self.finish(moves, ledger, last)  # 9. the end

    # ---- documents

    def stale_doc(self, ledger: reports.Ledger, last: dict[str, tuple[dict[str, Any], Any]]) -> str | None:
        """The first item whose document no longer says what the ledger does. Only items whose experiments or
        plan checks changed since they were last checked are rendered again; a document kept by hand counts as
        written (pivot writes its version beside it once), and an item written by the previous step is not
        written again."""
        just = (last.get("write_improvement_doc") or ({},))[0].get("plan_item")
        for item in ledger.plan.items:
            key = self._doc_key(ledger, item)
            if self._doc_keys.get(item.id) == key or item.id == just:
                self._doc_keys[item.id] = key
                continue
            docs = [d for d in ledger.documents if d.kind == "improvement" and d.plan_item == item.id]
            newest = max(docs, key=lambda d: (d.updated_at, d.id or 0), default=None)
            text, _, _ = reports.render_improvement(ledger, item)
            if newest is not None and hashlib.sha256(text.encode("utf-8")).hexdigest() == newest.sha256:
                self._doc_keys[item.id] = key
                continue
            return item.id
        return None

    def _doc_key(self, ledger: reports.Ledger, item: m.PlanItem) -> tuple:
        exps = tuple(
            (e.id, e.status, e.verdict, e.reason, ledger.runs.get(e.id or 0, 0), tuple(e.audit))
            for e in ledger.experiments
            if item.id in e.plan_items or item.id in e.reverts
        )
        claims = tuple(f.text for f in ledger.findings if f.kind == "claim" and f.plan_item == item.id)
        return exps, claims, ledger.record.plan.model_dump_json()

    # ---- the steps

    def _validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        return self.session.engine_for(self.session.settings.seed).validate(config)

    def take(self, moves: Moves, step: search.Step, last: dict[str, tuple[dict[str, Any], Any]]) -> Call:
        parallel = self.session.settings.parallel
        if step.action == "launch" and parallel > 1 and self.session.settings.executor is not None:
            return self.take_many(moves, step, last, parallel)
        return self.take_one(moves, step, last)

    def take_one(self, moves: Moves, step: search.Step, last: dict[str, tuple[dict[str, Any], Any]]) -> Call:
        if step.action != "launch":
            return Call("record_verdict", {"plan_item": step.items[0], "verdict": step.action, "reason": step.reason})
        args = step.launch_args()
        launch = Call("launch_server", {**args, "hypothesis": step.reason})
        profile = len(step.items) == 1 and moves.method.plan.item(step.items[0]).kind == "profile"
        if step.baseline or profile or step.experiment_id is not None:
            return launch  # a workload's baseline, a profile of the best and a rerun run what was audited before
        return self.audited(last, {k: v for k, v in args.items() if k != "baseline"}, launch)

    def audited(self, last: dict[str, tuple[dict[str, Any], Any]], key: dict[str, Any] | None, launch: Call) -> Call:
        """Audit before launching: the launch follows an audit of the same command line that would start.
        `key`: the launch's item arguments (plan_item / plan_items / flags / revert_items), None for the baseline."""
        key = key or {}
        prev = last.get("audit_flags")
        if (
            prev is not None
            and {k: v for k, v in prev[0].items() if v is not None} == key
            and isinstance(prev[1], dict)
        ):
            if prev[1].get("would_start"):
                return launch
            issues = [i for i in prev[1].get("issues", []) if i.get("status") in m.BLOCKING_FLAG_STATUSES]
            why = "; ".join(f"{i['flag']}: {i.get('message') or i['status']}" for i in issues)
            plan_item = key.get("plan_item") or (key.get("plan_items") or [None])[0]
            if plan_item is None:
                return Call(None, text=f"The plan's base flags would not start: {why}. Fix the plan and resume.")
            return Call(
                "record_verdict",
                {"plan_item": plan_item, "verdict": "ruled_out", "reason": f"refused before launch: {why}"},
            )
        return Call("audit_flags", key)

    def verdict_call(self, moves: Moves, e: m.Experiment) -> Call:
        """The verdict the moves permit for a measured experiment, with the judgement's words as its reason."""
        method = moves.method
        j = moves.judgements[e.id or 0]
        verdict = moves.verdicts[e.id or 0][0]
        if verdict == "measured":
            return Call(
                "record_verdict",
                {
                    "experiment_id": e.id,
                    "verdict": verdict,
                    "reason": f"profile of the best configuration: {self._profile_text(e)}",
                },
            )
        reason = j.text
        if verdict == "crashed" and e.failure and e.failure not in reason:
            reason += f" ({e.failure})"
        if verdict == "crashed":
            first = [lv for r in method.runs.get(e.id or 0, []) for lv in r.levels if lv.failed > 0]
            if first:  # the first level that failed says why; later ones only find the server gone
                lv = min(first, key=lambda x: x.max_concurrency or 0)
                if lv.errors:
                    reason += f": {max(lv.errors.items(), key=lambda kv: kv[1])[0][:200]}"
        return Call("record_verdict", {"experiment_id": e.id, "verdict": verdict, "reason": reason})

    def _profile_text(self, e: m.Experiment) -> str:
        for f in self.session.store.findings(self.session.id, experiment_id=e.id, kind="evidence"):
            shares = {
                k[len("profile_") : -len("_share_pct")]: v
                for k, v in f.values.items()
                if k.startswith("profile_") and k.endswith("_share_pct")
            }
            if shares:
                parts = sorted(shares.items(), key=lambda kv: -kv[1])
                return ", ".join(f"{k.replace('_', ' ')} {v:.0f}%" for k, v in parts) + f" (experiment {e.number})"
        return f"recorded with experiment {e.number}"

    # ---- pivots and the end

    def pivot(self, moves: Moves, ledger: reports.Ledger, last: dict[str, tuple[dict[str, Any], Any]]) -> Call:
        analysis = self.analysis(moves.method, ledger) or self.investigation()
        if analysis is not None:
            return analysis
        q, options = question(moves)
        prev = last.get("write_status_summary")
        assert moves.pivot is not None
        if moves.pivot.kind == "clarify" or (prev is not None and prev[0].get("question") == q):
            return Call("ask_user", {"question": q, "options": options})
        return Call("write_status_summary", {"question": q, "options": options})

    def investigation(self) -> Call | None:
        """A sub-agent investigation where the seeds made one (after a crash; the best's root cause), before the
        status summary that cites it."""
        due = investigation_due(self.session)
        return Call(due[0], due[1]) if due is not None else None

    def analysis(self, method: Method, ledger: reports.Ledger) -> Call | None:
        """Analyse the best configuration before a summary explains it (once per best experiment)."""
        best = method.best()
        if best is None or method.run_count(best) == 0:
            return None
        if any(f.experiment_id == best.id for f in ledger.findings):
            return None
        return Call("analyze", {"experiment_id": best.id})

    def finish(self, moves: Moves, ledger: reports.Ledger, last: dict[str, tuple[dict[str, Any], Any]]) -> Call:
        method = moves.method
        q = reports.FINISHED_QUESTION
        latest = reports.latest_status_doc(ledger.documents)
        written = "write_status_summary" in last or (
            latest is not None
            and not any(p.summary_path == latest.path for p in ledger.pivots)
            and latest.updated_at
            >= max((e.finished_at or e.created_at for e in method.experiments), default=latest.updated_at)
        )
        if not written:
            return (
                self.analysis(method, ledger)
                or self.investigation()
                or Call("write_status_summary", {"question": q, "options": []})
            )
        best = method.best()
        j = method.judge(best) if best is not None else None
        line = (
            f"best {method.objective.number(j.after_tok_s)} {method.objective.at(j.concurrency or 0)} with experiment "
            f"{best.number} ({best.config})"
            if j is not None and j.after_tok_s is not None and best is not None
            else "no result"
        )
        where = latest.path if latest is not None else "docs_out"
        why = (
            "stopped as you asked"
            if moves.decision.stopped_at is not None
            else moves.why
            if moves.why.startswith("the launch budget")
            else "nothing is left to do in the tiers opened so far"
        )
        return Call(None, text=f"Campaign finished ({why}): {line}. Final summary: {where}")

    # ---- the todo list

    def todos(self, moves: Moves, ledger: reports.Ledger) -> list[m.Todo]:
        method, d = moves.method, moves.decision
        plan = method.plan
        base = method.baseline()
        docs = {x.plan_item for x in ledger.documents if x.kind == "improvement"}
        first = moves.steps[0] if moves.steps and moves.phase == "work" else None
        current = {first.items[0]} if first is not None and first.items else set()  # one in progress at a time
        out = [
            m.Todo(
                content=f"Write the improvement documents {plan.items[0].id}-{plan.items[-1].id}",
                status="completed" if all(it.id in docs for it in plan.items) else "pending",
                priority="high",
            ),
            m.Todo(
                content="Measure the baseline (the plan's base flags, twice: the noise)",
                status="completed" if base is not None and base.verdict is not None else "pending",
                priority="high",
            ),
        ]
        started = out[0].status == "completed" and out[1].status == "completed"
        active = set(method.active_items())
        if out[0].status != "completed":
            out[0].status = "in_progress"
        elif out[1].status != "completed":
            out[1].status = "in_progress"
        for it in plan.items:
            if it.kind == "code":
                status: m.TodoStatus = "completed" if it.id in docs else "pending"
                content = f"{it.id} {it.title} (a code change for you: documented)"
            else:
                done = method.done(it)
                final = method.final(it)
                status = "completed" if done else "in_progress" if started and it.id in current else "pending"
                verdict = f": {reports.VERDICT_WORDS[final[-1].verdict]}" if done and final else ""
                if verdict and final[-1].verdict == "adopted" and it.id not in active:
                    verdict += ", then taken back"  # a revert (or a check of a rider) dropped it from the best
                content = f"{it.id} {it.title}{verdict}"
            if d.stopped_at is not None and status == "pending":
                status = "cancelled"
            priority: m.TodoPriority = (
                "high" if it.tier == min(d.released) else "medium" if it.tier in d.released else "low"
            )
            out.append(m.Todo(content=content, status=status, priority=priority, plan_item=it.id))
        return out


def _refusals(messages: list[ModelMessage]) -> list[str]:
    """The method's refusals (and tools' retries) in the last request: none, when the autopilot chose well."""
    if not messages or not isinstance(messages[-1], ModelRequest):
        return []
    return [
        str(p.content)
        for p in messages[-1].parts
        if isinstance(p, RetryPromptPart)
        or (isinstance(p, ToolReturnPart) and getattr(p, "outcome", None) == "retried")
    ]


def _last_returns(messages: list[ModelMessage]) -> dict[str, tuple[dict[str, Any], Any]]:
    """The previous response's tool calls with their results, by tool name (for the two paired steps)."""
    if len(messages) < 2:
        return {}
    req = messages[-1]
    resp = messages[-2]
    if not isinstance(req, ModelRequest) or not isinstance(resp, ModelResponse):
        return {}
    returns = {p.tool_call_id: p for p in req.parts if isinstance(p, ToolReturnPart)}
    out: dict[str, tuple[dict[str, Any], Any]] = {}
    for part in resp.parts:
        if isinstance(part, ToolCallPart) and part.tool_call_id in returns:
            content = returns[part.tool_call_id].content
            if hasattr(content, "model_dump"):
                content = content.model_dump(mode="json")
            out[part.tool_name] = (part.args_as_dict(), content)
    return out
