"""The autopilot: pivot's built-in offline model, a deterministic policy behind pydantic-ai's FunctionModel.

Each time the agent asks it for a response, it reads the plan and the ledger (never the conversation, except to
pair two calls it makes back to back: an audit and the launch it clears, a status summary and the question it
ends with; after a resume it simply makes the first call again) and answers with the one tool call that comes
next in the method:

1. the todo list, kept in step with the ledger;
2. an improvement document for every plan item, before the first experiment (and again after each verdict);
3. the baseline with the plan's base flags on the plan's workload, run twice: the spread between the runs is the
   measured noise;
4. the search's next step in the opened tiers (tools/search.py: a candidate predicted by the twin beyond the noise
   band, alone, combined with the items it interacts with, or retested on a new best; an item predicted inside the
   band recorded as `predicted`; a no-op item ruled out), then the rest in plan order (requested items, profiles,
   items on their own workload, everything with the search off), one change at a time on the best configuration:
   audit first (a flag the engine refuses is ruled out without a launch), launch, benchmark, verdict by the method
   (tools/method.py: rerun a gain inside the noise band, adopt only beyond it on two runs), stop; a profile item profiles the
   best configuration; a code item is documented for the user; an item with its own workload gets its own
   baseline on it;
5. a pivot (status summary, then ask_user) after each tier, after `stall_after` measured changes in a row without
   gain, and after a crash of a promising item (one the plan expects to gain at least twice the noise floor).

Answers are read from the ledger's pivots, in order: an option's number, a plan item's id or words of its title
(that item is tested next), "continue" (the rest of the tier, or the next tier when the tier is done) and "stop"
(the final summary). Anything else is asked again, with what the autopilot understands. Nothing in this module
knows any particular plan.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Any

from pydantic_ai import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent import models as m
from agent.session import Session
from agent.steps import Call, Steps
from tools import reports, search
from tools.experiments import unmeasurable_item
from tools.method import Decision, Method, baseline_runs_needed, not_measured_text, understood

PROMISING_FACTOR = 2.0  # a plan item is promising when it expects at least this times the noise floor


class Autopilot(Steps):
    """The method as a deterministic policy over a session's ledger (see the module docstring)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self.respond, model_name="autopilot")

    # ---- the model interface

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        call = self.next_call(_last_returns(messages))
        if call.tool is None:
            return ModelResponse(parts=[TextPart(call.text)])
        tool_call_id = (
            "ap-"
            + hashlib.sha256(
                json.dumps([len(messages), call.tool, call.args], sort_keys=True, default=str).encode()
            ).hexdigest()[:12]
        )
        return ModelResponse(parts=[ToolCallPart(call.tool, call.args, tool_call_id=tool_call_id)])

    # ---- the policy

    def next_call(self, last: dict[str, tuple[dict[str, Any], Any]] | None = None) -> Call:
        """The next step, from the ledger (`last`: the previous response's tool calls and their results). With an
        executor (`pivot run --ray`), every launch is a step of run_experiments: its servers run where the executor
        puts them, never in this process."""
        call = self._next_call(last or {})
        if self.session.settings.executor is not None and call.tool == "launch_server":
            return Call("run_experiments", {"experiments": [{**call.args, "runs": self.runs_at_once(call.args)}]})
        return call

    def _next_call(self, last: dict[str, tuple[dict[str, Any], Any]]) -> Call:
        s = self.session
        store = s.store
        method = Method.read(store, s.id)
        plan = method.plan
        ledger = reports.Ledger.read(store, s.id)
        decision = method.decision()

        # 1. the todo list
        todos = self.todos(method, ledger, decision)
        if [(t.content, t.status) for t in store.todos(s.id)] != [(t.content, t.status) for t in todos]:
            return Call("todo_write", {"todos": [t.model_dump(exclude={"id"}) for t in todos]})

        # 2. a server still up for a measured experiment: profile it if its item asks for that, else stop it
        live = s.live
        if live is not None:
            e = method.experiment(live.experiment_id)
            if e is not None and method.run_count(e) > live.runs_at_start:
                item = plan.item(e.plan_item) if e.plan_item in plan.item_ids() else None
                if item is not None and item.kind == "profile" and not self._profiled(e):
                    return Call("profile")
                return Call("stop_server")
            if e is not None and e.status == "running":
                return Call("run_benchmark")
            return Call("stop_server")

        # 3. documents for the whole plan before the first experiment
        missing = [
            it
            for it in plan.items
            if not any(d.plan_item == it.id for d in ledger.documents if d.kind == "improvement")
        ]
        if missing:
            return Call("write_improvement_doc", {"plan_item": missing[0].id})

        # 4. experiments measured but not judged
        call = self.judge_step(method)
        if call is not None:
            return call

        # 5. documents out of date with the ledger
        for item in plan.items:
            if self._stale(ledger, item):
                return Call("write_improvement_doc", {"plan_item": item.id})

        # 6. the baseline
        base = method.baseline()
        if base is None or method.run_count(base) == 0:
            if base is not None and base.status == "failed" and base.verdict is not None:
                if decision.stopped_at is not None:
                    return self.finish(method, ledger, decision, last)
                asked = [p for p in ledger.pivots if p.asked_at > (base.finished_at or base.created_at)]
                if not (asked and asked[-1].answer is not None):  # asked and answered: try again
                    return self.pivot(method, ledger, decision, kind="baseline", last=last)
            return self.audited(last, None, Call("launch_server", {"baseline": True}))

        # 7. a pivot that is due
        step = self.search_step(method, decision)
        due = self.due(method, ledger, decision, step)
        if due is not None:
            return self.pivot(method, ledger, decision, kind=due, last=last)

        # 8. the search's next step in the opened tiers (tools/search.py), else the next item in plan order
        if step is not None:
            return self.take(method, step, last)
        item = method.next_item(decision)
        if item is not None:
            return self.work_on(method, item, last, decision)

        # 9. nothing left: the final summary, once, then the end
        return self.finish(method, ledger, decision, last)

    # ---- item state

    def _profiled(self, e: m.Experiment) -> bool:
        findings = self.session.store.findings(self.session.id, experiment_id=e.id, kind="evidence")
        return any(k.startswith("profile_") for f in findings for k in f.values)

    def _stale(self, ledger: reports.Ledger, item: m.PlanItem) -> bool:
        doc = next((d for d in ledger.documents if d.kind == "improvement" and d.plan_item == item.id), None)
        if doc is None:
            return True
        text, _, _ = reports.render_improvement(ledger, item)
        return hashlib.sha256(text.encode("utf-8")).hexdigest() != doc.sha256

    # ---- the search

    def search_step(self, method: Method, d: Decision) -> search.Step | None:
        """The search's next step (None with the search off, or when it has nothing to propose)."""
        return search.next_step(method, d, self._validate)

    def _validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        return self.session.engine_for(self.session.settings.seed).validate(config)

    def take(self, method: Method, step: search.Step, last: dict[str, tuple[dict[str, Any], Any]]) -> Call:
        parallel = self.session.settings.parallel
        if step.action == "launch" and parallel > 1 and self.session.settings.executor is not None:
            return self.take_many(method, step, last, parallel)
        return self.take_one(method, step, last)

    def take_one(self, method: Method, step: search.Step, last: dict[str, tuple[dict[str, Any], Any]]) -> Call:
        if step.action == "rule_out":
            return Call("record_verdict", {"plan_item": step.items[0], "verdict": "ruled_out", "reason": step.reason})
        if step.action == "predicted":
            return Call("record_verdict", {"plan_item": step.items[0], "verdict": "predicted", "reason": step.reason})
        if len(step.items) == 1 and (unmeasured := self.unmeasured(method, step.items[0])) is not None:
            return unmeasured
        args: dict[str, Any] = {"plan_items": list(step.items)} if len(step.items) > 1 else {"plan_item": step.items[0]}
        launch = Call("launch_server", {**args, "hypothesis": step.reason})
        return self.audited(last, args, launch)

    def requested_args(self, method: Method, d: Decision, item: m.PlanItem) -> dict[str, Any]:
        """How the user asked for `item` at a pivot: a combined step ("test 05+06 together"), a bounded retry
        ("retry 07 with --max-running-requests 512"), else the item alone."""
        since = next((t for i, t in d.requested if i == item.id), None)
        if since is None:
            return {"plan_item": item.id}
        for p in method.pivots:
            if p.answer is None or (p.answered_at or p.asked_at) != since:
                continue
            text = p.answer.strip()
            numbered = re.fullmatch(r"\d+", text) and p.options and 1 <= int(text) <= len(p.options)
            if numbered and text not in method.plan.item_ids():
                text = p.options[int(text) - 1]
            combined = re.match(r"test (\d{2,3}(?:\+\d{2,3})+) together", text)
            if combined:
                ids = [i for i in combined.group(1).split("+") if i in method.plan.item_ids()]
                if item.id in ids and len(ids) > 1:
                    return {"plan_items": ids}
            retry = re.match(r"retry (\d{2,3}) .*?(--max-running-requests \d+)", text)
            if retry and retry.group(1) == item.id:
                return {"plan_item": item.id, "flags": retry.group(2)}
        return {"plan_item": item.id}

    # ---- working on one item

    def audited(
        self, last: dict[str, tuple[dict[str, Any], Any]], plan_item: str | dict[str, Any] | None, launch: Call
    ) -> Call:
        """Audit before launching: the launch follows an audit of the same command line that would start.
        `plan_item`: the item, or the launch's item arguments (plan_item / plan_items / flags)."""
        key = plan_item if isinstance(plan_item, dict) else ({"plan_item": plan_item} if plan_item else {})
        plan_item = key.get("plan_item") or (key.get("plan_items") or [None])[0]
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
            if plan_item is None:
                return Call(None, text=f"The plan's base flags would not start: {why}. Fix the plan and resume.")
            return Call(
                "record_verdict",
                {"plan_item": plan_item, "verdict": "ruled_out", "reason": f"refused before launch: {why}"},
            )
        return Call("audit_flags", key)

    def work_on(
        self,
        method: Method,
        item: m.PlanItem,
        last: dict[str, tuple[dict[str, Any], Any]],
        d: Decision | None = None,
    ) -> Call:
        workload = item.workload_for(method.plan.workload)
        if item.workload and method.baseline(workload) is None:
            return Call("launch_server", {"baseline": True, "plan_item": item.id})
        if item.kind == "workload" and item.flags is None and not item.remove_flags:
            return Call("launch_server", {"baseline": True, "plan_item": item.id})
        if item.kind == "profile":
            return Call("launch_server", {"plan_item": item.id, "hypothesis": item.hypothesis})
        unmeasured = self.unmeasured(method, item.id)
        if unmeasured is not None:
            return unmeasured
        args = self.requested_args(method, d, item) if d is not None else {"plan_item": item.id}
        return self.audited(last, args, Call("launch_server", args))

    def unmeasured(self, method: Method, item_id: str) -> Call | None:
        """The not_measured verdict of an item the engine cannot measure (a simulated engine that models none of the
        flags it changes): no launch is spent on it. None when the engine can measure it."""
        unmeasurable = unmeasurable_item(self.session, method, item_id)
        if unmeasurable is None:
            return None
        flags = method.unmodelled_change(unmeasurable)[1]
        return Call(
            "record_verdict", {"plan_item": item_id, "verdict": "not_measured", "reason": not_measured_text(flags)}
        )

    def judge(self, method: Method, e: m.Experiment) -> Call | None:
        """The verdict step for a measured experiment (or its rerun)."""
        j = method.judge(e)
        plan = method.plan
        item = plan.item(e.plan_item) if e.plan_item in plan.item_ids() else None
        if j.suggestion == "pending":
            return None
        if e.kind == "baseline":
            if j.suggestion == "baseline":
                if method.run_count(e) < baseline_runs_needed(method):
                    return Call("launch_server", {"experiment_id": e.id})  # a second run measures the noise
                return Call("record_verdict", {"experiment_id": e.id, "verdict": "baseline", "reason": j.text})
            return Call("record_verdict", {"experiment_id": e.id, "verdict": "crashed", "reason": j.text})
        if item is not None and item.kind == "profile" and j.suggestion not in ("crashed", "ruled_out"):
            if not self._profiled(e):
                return Call("launch_server", {"experiment_id": e.id})  # profile needs the server up under load
            shares = self._profile_text(e)
            return Call(
                "record_verdict",
                {
                    "experiment_id": e.id,
                    "verdict": "measured",
                    "reason": f"profile of the best configuration: {shares}",
                },
            )
        if j.suggestion == "rerun":
            return Call("launch_server", {"experiment_id": e.id})
        reason = j.text
        if j.suggestion == "crashed" and e.failure and e.failure not in reason:
            reason += f" ({e.failure})"
        if j.suggestion == "crashed":
            first = [lv for r in method.runs.get(e.id or 0, []) for lv in r.levels if lv.failed > 0]
            if first:  # the first level that failed says why; later ones only find the server gone
                lv = min(first, key=lambda x: x.max_concurrency or 0)
                if lv.errors:
                    reason += f": {max(lv.errors.items(), key=lambda kv: kv[1])[0][:200]}"
        return Call("record_verdict", {"experiment_id": e.id, "verdict": j.suggestion, "reason": reason})

    def _profile_text(self, e: m.Experiment) -> str:
        for f in self.session.store.findings(self.session.id, experiment_id=e.id, kind="evidence"):
            shares = {
                k[len("profile_") : -len("_share_pct")]: v
                for k, v in f.values.items()
                if k.startswith("profile_") and k.endswith("_share_pct")
            }
            if shares:
                parts = sorted(shares.items(), key=lambda kv: -kv[1])
                return ", ".join(f"{k.replace('_', ' ')} {v:.0f}%" for k, v in parts) + f" (experiment {e.id})"
        return f"recorded with experiment {e.id}"

    # ---- pivots

    def _last_pivot_at(self, ledger: reports.Ledger) -> datetime | None:
        return ledger.pivots[-1].asked_at if ledger.pivots else None

    def _since(self, method: Method, at: datetime | None) -> list[m.Experiment]:
        """Experiments judged after `at` (all, without a pivot yet), in order."""
        return [
            e
            for e in method.experiments
            if e.verdict is not None and (at is None or (e.finished_at or e.created_at) > at)
        ]

    def promising(self, method: Method, item: m.PlanItem | None) -> bool:
        if item is None:
            return False
        exp = reports.parse_expectation(item.expected_impact)
        return exp is not None and exp.midpoint_pct >= PROMISING_FACTOR * method.settings.min_gain_pct

    def due(self, method: Method, ledger: reports.Ledger, d: Decision, step: search.Step | None = None) -> str | None:
        """Which pivot is due now, if any: crash, stall, tier, clarify."""
        if d.stopped_at is not None:
            return None
        at = self._last_pivot_at(ledger)
        since = self._since(method, at)
        if d.unclear is not None and not since:
            return "clarify"
        plan = method.plan
        for e in since:
            item = plan.item(e.plan_item) if e.plan_item in plan.item_ids() else None
            if e.verdict == "crashed" and self.promising(method, item):
                return "crash"
        changes = [
            e for e in since if e.kind == "change" and e.verdict in ("adopted", "no_gain", "regressed", "crashed")
        ]
        run = 0
        for e in reversed(changes):
            if e.verdict == "adopted":
                break
            run += 1
        if method.next_item(d) is None and step is None:
            return "tier" if since else None
        if run >= method.settings.stall_after:
            return "stall"
        return None

    def question(self, method: Method, ledger: reports.Ledger, d: Decision, kind: str) -> tuple[str, list[str]]:
        plan = method.plan
        best, base = method.best(), method.baseline()
        jb = method.judge(best) if best is not None else None
        headline = ""
        if best is not None and base is not None and jb is not None and jb.after_tok_s is not None:
            jbase = method.judge(base)
            gain = ""
            if best.id != base.id and jbase.after_tok_s:
                gain = f", {(jb.after_tok_s - jbase.after_tok_s) / jbase.after_tok_s * 100:+.1f}% over the baseline"
            headline = f"Best so far: {jb.after_tok_s:,.0f} output tok/s at concurrency {jb.concurrency} (experiment {best.id}{gain})."
        later = sorted({it.tier for it in plan.items if it.tier not in d.released})
        undone = [it for it in plan.items if it.tier in d.released and not method.done(it)]
        options: list[str] = []
        searched = method.settings.search
        if undone:
            rest = ", ".join(f"{it.id} {it.title}" for it in undone[:4])
            how = self.search_words(method, searched)
            options.append(f"continue: the remaining items of this tier ({rest}); {how}")
        elif later:
            t = later[0]
            items = ", ".join(f"{it.id} {it.title}" for it in plan.tier_items(t))
            code = all(it.kind == "code" for it in plan.tier_items(t))
            note = " (code changes for you: documented, nothing to run; then the final summary)" if code else ""
            if searched and not code:
                nxt = Decision(released={*d.released, t}, requested=[])
                ahead = search.launchable(method, nxt, self._validate)
                note = f"; the search's first step there: {ahead[0][1]}" if ahead else self.nothing_ahead(method)
            options.append(f"continue: Tier {t} ({plan.tiers.get(t, 'next')}): {items}{note}")
        if kind == "crash":
            retry = self.retry_option(method, ledger)
            if retry is not None:
                options.append(retry)
        if searched:
            # the search's next candidates (its ranking: predicted gain, corrected to this campaign)
            opened = Decision(released={*d.released, *later[:1]}, requested=[])
            for head, sentence in search.options(method, opened, self._validate, limit=3):
                if len(options) >= 4:
                    break
                if not any(o.startswith(head) for o in options):
                    options.append(sentence)
        else:
            # the summary's Next steps ranking (by the plan's expected gain), so the options match the summary
            ranked = [
                it
                for it, _ in reports.next_steps(ledger)
                if it.kind != "code" and not method.done(it) and not (undone and it.id == undone[0].id)
            ]
            for it in ranked[:2]:
                options.append(f"{it.id} {it.title}: test it next ({it.expected_impact.strip().rstrip('.')})")
        options.append("stop: write the final summary and end the campaign")
        tiers_done = sorted(t for t in d.released if all(method.done(it) for it in plan.tier_items(t)))
        since = self._since(method, self._last_pivot_at(ledger))
        if kind == "crash":
            e = next(e for e in reversed(since) if e.verdict == "crashed")
            item = plan.item(e.plan_item) if e.plan_item else None
            what = f"{item.id} {item.title}" if item else f"experiment {e.id}"
            expected = item.expected_impact.strip().rstrip(".") if item else "a gain"
            q = (
                f"{what} crashed (experiment {e.id}: {e.reason}) although the plan expected {expected}. "
                f"{headline} How should pivot go on?"
            )
        elif kind == "stall":
            n = method.settings.stall_after
            q = (
                f"The last {n} changes gave no gain beyond the {method.band_pct():.1f}% noise band. {headline} "
                "How should pivot go on?"
            )
        elif kind == "clarify":
            p = d.unclear
            assert p is not None
            how = understood(p.options, plan)
            asked = p.question.split(f"{how} ", 1)[-1]  # asked again: the question itself, not the last clarification
            options = p.options or ["continue: go on with the plan", "stop: write the final summary and end"]
            return (f"{d.why_unclear} {how} {asked}", options)
        elif kind == "baseline":
            base = method.baseline()
            why = (
                (base.failure or "unknown") + (f": {base.failure_detail}" if base and base.failure_detail else "")
                if base
                else "unknown"
            )
            q = (
                f"The baseline {'server refused the benchmark' if 'request-refused' in why else 'did not start'} ({why})"
                ", and nothing compares without it. Fix it (base flags, workload, engine options), then answer 'continue'."
            )
            return " ".join(q.split()), ["continue: try the baseline again", "stop: end the campaign"]
        else:
            names = ", ".join(f"Tier {t} ({plan.tiers.get(t, '')})".replace(" ()", "") for t in tiers_done[-1:])
            q = f"{names or 'The items you opened'} done. {headline} Which way next?"
        return " ".join(q.split()), options

    @staticmethod
    def search_words(method: Method, searched: bool) -> str:
        """How the remaining items of a tier are run, in words: predicted first when the engine has a predictor."""
        if not searched:
            return "one at a time on the best configuration"
        if search.predictor_for(method) is None:
            return f"each measured on the best configuration ({search.no_predictor_text(method)})"
        return "the search predicts each on the best configuration and launches what beats the noise band"

    @staticmethod
    def nothing_ahead(method: Method) -> str:
        """Why the search has no first step in the next tier, in words."""
        if search.predictor_for(method) is None:
            return f"; {search.no_predictor_text(method)} each item there"
        return (
            "; the twin predicts nothing there beyond the noise band: items it can predict are recorded as predicted "
            "without a launch"
        )

    def retry_option(self, method: Method, ledger: reports.Ledger) -> str | None:
        """After a crash under load: the item again with max running requests capped at the last level that held
        (once per item), with what the twin predicts for it."""
        since = self._since(method, self._last_pivot_at(ledger))
        crashed = next((e for e in reversed(since) if e.verdict == "crashed" and e.plan_item), None)
        if crashed is None or crashed.combined or search.launches(method, crashed.plan_item or "") > 1:
            return None
        held = sorted(c for c, runs in method.ok_values(crashed).items() if runs)
        if not held or not method.failed_levels(crashed):
            return None
        cap = held[-1]
        flag = f"--max-running-requests {cap}"
        item = method.plan.item(crashed.plan_item or "")
        pred = ""
        try:
            sur = search.Surrogate(method)
            config = item.apply(method.best_config()).with_flags(m.ServerConfig.parse(flag))
            est = sur.estimate_config((item.id,), config)
            pred = f"; {est.note}" if est.note else ""
        except Exception:
            pred = ""
        return (
            f"retry {item.id} {item.title} with {flag} (capped at concurrency {cap}, the last level that held in "
            f"experiment {crashed.id}): 1 launch, 2 if it gains{pred}"
        )

    def pivot(
        self,
        method: Method,
        ledger: reports.Ledger,
        d: Decision,
        *,
        kind: str,
        last: dict[str, tuple[dict[str, Any], Any]],
    ) -> Call:
        analysis = self.analysis(method, ledger)
        if analysis is not None:
            return analysis
        question, options = self.question(method, ledger, d, kind)
        prev = last.get("write_status_summary")
        if kind == "clarify" or (prev is not None and prev[0].get("question") == question):
            return Call("ask_user", {"question": question, "options": options})
        return Call("write_status_summary", {"question": question, "options": options})

    def analysis(self, method: Method, ledger: reports.Ledger) -> Call | None:
        """Analyse the best configuration before a summary explains it (once per best experiment)."""
        best = method.best()
        if best is None or method.run_count(best) == 0:
            return None
        if any(f.experiment_id == best.id for f in ledger.findings):
            return None
        return Call("analyze", {"experiment_id": best.id})

    def finish(
        self, method: Method, ledger: reports.Ledger, d: Decision, last: dict[str, tuple[dict[str, Any], Any]]
    ) -> Call:
        question = (
            "The campaign is finished. To go on, resume this session with an item to test again or a new direction."
        )
        latest = reports.latest_status_doc(ledger.documents)
        written = "write_status_summary" in last or (
            latest is not None
            and not any(p.summary_path == latest.path for p in ledger.pivots)
            and latest.updated_at
            >= max((e.finished_at or e.created_at for e in method.experiments), default=latest.updated_at)
        )
        if not written:
            return self.analysis(method, ledger) or Call("write_status_summary", {"question": question, "options": []})
        best = method.best()
        j = method.judge(best) if best is not None else None
        line = (
            f"best {j.after_tok_s:,.0f} output tok/s at concurrency {j.concurrency} with experiment {best.id} "
            f"({best.config})"
            if j is not None and j.after_tok_s is not None and best is not None
            else "no result"
        )
        where = latest.path if latest is not None else "docs_out"
        why = "stopped as you asked" if d.stopped_at is not None else "every item of the tiers opened so far is done"
        return Call(None, text=f"Campaign finished ({why}): {line}. Final summary: {where}")

    # ---- the todo list

    def todos(self, method: Method, ledger: reports.Ledger, d: Decision) -> list[m.Todo]:
        plan = method.plan
        base = method.baseline()
        docs = {x.plan_item for x in ledger.documents if x.kind == "improvement"}
        current = method.next_item(d)
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
        if out[0].status != "completed":
            out[0].status = "in_progress"
        elif out[1].status != "completed":
            out[1].status = "in_progress"
        for it in plan.items:
            done = method.done(it)
            if it.kind == "code":
                status: m.TodoStatus = "completed" if it.id in docs else "pending"
                content = f"{it.id} {it.title} (a code change for you: documented)"
            else:
                final = method.final(it)
                status = (
                    "completed"
                    if done
                    else "in_progress"
                    if started and current is not None and current.id == it.id
                    else "pending"
                )
                verdict = f": {reports.VERDICT_WORDS[final[-1].verdict]}" if done and final else ""
                content = f"{it.id} {it.title}{verdict}"
            if d.stopped_at is not None and status == "pending":
                status = "cancelled"
            priority: m.TodoPriority = (
                "high" if it.tier == min(d.released) else "medium" if it.tier in d.released else "low"
            )
            out.append(m.Todo(content=content, status=status, priority=priority, plan_item=it.id))
        return out


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
