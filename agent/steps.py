"""The autopilot's verdict steps, and its steps on an executor (`pivot run --ray ADDRESS --parallel N`): several
experiments at once.

The policy (agent/autopilot.py) asks for one tool call at a time; with an executor a launch is a step of
run_experiments, and with --parallel room in it, the step runs what does not depend on its own outcome at once: the
search's independent candidates on the best configuration (tools/search.py `independent`), each change with the
run that confirms or rejects its gain, and the baseline's runs that measure the noise. The step is judged when it
is in: its reruns first, together; then its largest gain, so the best moves once and a gain it beat on the same
base is superseded. Every call is one of the method's moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent import models as m
from agent.session import Session
from tools import search
from tools.method import Moves, baseline_runs_needed


@dataclass
class Call:
    """The next tool call, or the final text when there is none."""

    tool: str | None
    args: dict[str, Any] = field(default_factory=dict)
    text: str = ""


class Steps:
    """What the autopilot does with verdicts, and differently with an executor (mixed into Autopilot)."""

    session: Session

    def runs_at_once(self, launch: dict[str, Any], moves: Moves) -> int:
        """Runs of one launch that an executor runs at once when --parallel leaves room: the baseline's runs that
        measure the noise, and a change with the run that confirms (or rejects) its gain, which the search asks for
        whenever a change gains. A profile, and a rerun of a change, run once."""
        parallel = self.session.settings.parallel
        if parallel < 2:
            return 1
        method = moves.method
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
        self, moves: Moves, step: search.Step, last: dict[str, tuple[dict[str, Any], Any]], parallel: int
    ) -> Call:
        """The step and the launches beside it that do not depend on its outcome, as one run_experiments (the
        executor runs them at once); the engine audits each member before its launch."""
        method = moves.method
        searched = [s for s in moves.steps if s.candidate is not None or s.action != "launch"]
        together = search.independent(method, searched, parallel) if searched and searched[0] is step else [step]
        members: list[dict[str, Any]] = []
        for st in together:
            if st.action != "launch":
                return self.take_one(moves, st, last)
            members.append({**st.launch_args(), "hypothesis": st.reason, "runs": 1})
        free = parallel - len(members)  # room left: each change's confirming run, in the search's order
        for member in members:
            extra = min(free, self.runs_at_once(member, moves) - 1)
            member["runs"] += extra
            free -= extra
        return Call("run_experiments", {"experiments": members})

    def judge_step(self, moves: Moves) -> Call | None:
        """The next verdict (or rerun) the moves ask for. Several are waiting only after a step of run_experiments:
        its reruns go first, together (one step); then the largest adoptable gain, so the best moves once and a
        gain it beat on the same base is judged superseded; then the rest in order."""
        if moves.phase not in ("baseline", "judge"):
            return None
        method = moves.method
        waiting = [e for e in method.experiments if (e.id or 0) in moves.verdicts or (e.id or 0) in moves.reruns]
        reruns = [e for e in waiting if (e.id or 0) in moves.reruns and (e.id or 0) not in moves.verdicts]
        if moves.phase == "baseline" and moves.baseline:
            return None  # the baseline itself is launched (audited) by the policy
        if self.session.settings.executor is not None and reruns:
            members = [{"experiment_id": e.id} for e in reruns[: self.session.settings.parallel]]
            return Call("run_experiments", {"experiments": members})
        judged = [e for e in waiting if (e.id or 0) in moves.verdicts]
        adopt = [e for e in judged if moves.verdicts[e.id or 0] == ("adopted",)]
        if len(adopt) > 1:
            return self.verdict_call(moves, max(adopt, key=lambda e: moves.judgements[e.id or 0].change_pct or 0.0))
        first = next(iter(waiting), None)
        if first is None:
            return None
        if (first.id or 0) in moves.verdicts:
            return self.verdict_call(moves, first)
        return Call("launch_server", {"experiment_id": first.id})

    # provided by Autopilot
    def verdict_call(self, moves: Moves, e: m.Experiment) -> Call:
        raise NotImplementedError

    def take_one(self, moves: Moves, step: search.Step, last: dict[str, tuple[dict[str, Any], Any]]) -> Call:
        raise NotImplementedError
