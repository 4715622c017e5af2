"""The autopilot's steps on an executor (`pivot run --ray ADDRESS --parallel N`): several experiments at once.

The policy (agent/autopilot.py) asks for one tool call at a time; with an executor a launch is a step of
run_experiments, and with --parallel room in it, the step runs what does not depend on its own outcome at once: the
search's independent candidates on the best configuration (tools/search.py `next_steps`), each change with the
run that confirms or rejects its gain, and the baseline's runs that measure the noise. The step is judged when it
is in: its reruns first, together; then its largest gain, so the best moves once and a gain it beat on the same
base is superseded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent import models as m
from agent.session import Session
from tools import search
from tools.method import Method, baseline_runs_needed


@dataclass
class Call:
    """The next tool call, or the final text when there is none."""

    tool: str | None
    args: dict[str, Any] = field(default_factory=dict)
    text: str = ""


class Steps:
    """What the autopilot does differently with an executor (mixed into Autopilot)."""

    session: Session

    def runs_at_once(self, launch: dict[str, Any], method: Method | None = None) -> int:
        """Runs of one launch that an executor runs at once when --parallel leaves room: the baseline's runs that
        measure the noise, and a change with the run that confirms (or rejects) its gain, which the search asks for
        whenever a change gains. A profile, and a rerun of a change, run once."""
        parallel = self.session.settings.parallel
        if parallel < 2:
            return 1
        method = method or Method.read(self.session.store, self.session.id)
        if launch.get("experiment_id") is not None:
            e = method.experiment(int(launch["experiment_id"]))
            if e is None or e.kind != "baseline":
                return 1
            return max(1, min(parallel, baseline_runs_needed(method) - method.run_count(e)))
        if launch.get("baseline"):
            return min(parallel, baseline_runs_needed(method))
        items = launch.get("plan_items") or [launch.get("plan_item")]
        if any(i in method.plan.item_ids() and method.plan.item(i).kind == "profile" for i in items):
            return 1
        return min(parallel, 2) if method.settings.search else 1

    def take_many(
        self, method: Method, step: search.Step, last: dict[str, tuple[dict[str, Any], Any]], parallel: int
    ) -> Call:
        """The search's step and the launches beside it that do not depend on its outcome, as one run_experiments
        (the executor runs them at once); the engine audits each member before its launch."""
        members: list[dict[str, Any]] = []
        for st in search.next_steps(method, method.decision(), self._validate, parallel):
            if len(st.items) == 1 and (unmeasured := self.unmeasured(method, st.items[0])) is not None:
                if not members and st.items == step.items:
                    return unmeasured  # the step itself cannot be measured here: its verdict, no launch
                continue
            args = {"plan_items": list(st.items)} if len(st.items) > 1 else {"plan_item": st.items[0]}
            members.append({**args, "hypothesis": st.reason, "runs": 1})
        if not members:
            return self.take_one(method, step, last)
        free = parallel - len(members)  # room left: each change's confirming run, in the search's order
        for member in members:
            extra = min(free, self.runs_at_once(member, method) - 1)
            member["runs"] += extra
            free -= extra
        return Call("run_experiments", {"experiments": members})

    def judge_step(self, method: Method) -> Call | None:
        """The next verdict (or rerun) of the experiments measured but not judged. Several are waiting only after a
        step of run_experiments: its reruns go first, together (one step); then the largest adoptable gain, so the
        best moves once and a gain it beat on the same base is judged superseded; then the rest in order."""
        calls = []
        for e in method.experiments:
            measured = e.status in ("finished", "failed") or (e.status == "interrupted" and method.run_count(e) > 0)
            if e.verdict is None and measured and (call := self.judge(method, e)) is not None:
                calls.append((e, call))
        if not calls:
            return None
        reruns = [c for _, c in calls if c.tool == "launch_server"]
        if self.session.settings.executor is not None and reruns:
            return Call("run_experiments", {"experiments": [c.args for c in reruns[: self.session.settings.parallel]]})
        adopt = [(e, c) for e, c in calls if c.args.get("verdict") == "adopted"]
        if len(adopt) > 1:
            return max(adopt, key=lambda ec: method.judge(ec[0]).change_pct or 0.0)[1]
        return calls[0][1]

    # provided by Autopilot
    def judge(self, method: Method, e: m.Experiment) -> Call | None:
        raise NotImplementedError

    def take_one(self, method: Method, step: search.Step, last: dict[str, tuple[dict[str, Any], Any]]) -> Call:
        raise NotImplementedError

    def unmeasured(self, method: Method, item_id: str) -> Call | None:
        raise NotImplementedError

    def _validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        raise NotImplementedError
