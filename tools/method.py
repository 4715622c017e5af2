"""The method, read from the ledger: the baseline, the best configuration so far, the measured noise, and how a
change is judged against its base.

The tools (run_benchmark's comparison, record_verdict's guard) and the autopilot read the ledger through this
one module, so an LLM and the built-in policy are held to the same rules:

- every comparison is made on the judged level: the highest concurrency both runs completed without failures;
  the judged metric is output tok/s there, averaged over the experiment's runs (a rerun adds a run);
- the noise band is max(min_gain_pct, measured noise), where the measured noise is the spread
  (max - min) / mean of the baseline's runs at its judged level;
- a change is adopted only when its gain beats the band on the mean of at least two runs (a gain beyond the band
  on one run is rerun to confirm it, unless the session's `search` setting is off: the old greedy path); a gain
  inside the band is rerun (up to `reruns` times) and then called no gain; a loss beyond the band is a regression;
  failed requests are a crash;
- a change whose changed flags the engine does not model (a simulated engine: `Experiment.not_modelled`) is not
  measured, whatever numbers the engine gave: its effect is not in them.

At the end of the module, RULES is the method as the model reads it and as MethodGuard (a WrapperToolset around
every toolset of the agent) enforces it, for every model: a call that breaks a rule is refused before its tool
runs, with the reason and the numbers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from agent import models as m
from agent.session import Session
from agent.store import Store
from agent.text import quote

REFUSED_FAILURES = ("unrecognized-argument", "ambiguous-argument", "argument-validation")
Suggestion = Literal[
    "baseline", "adopted", "no_gain", "regressed", "crashed", "ruled_out", "not_measured", "rerun", "pending"
]


class Judgement(BaseModel):
    """An experiment measured against its base, and the verdict the method gives it."""

    experiment_id: int
    base_experiment_id: int | None = None
    suggestion: Suggestion = Field(description="The method's verdict; `rerun` when the gain is inside the noise.")
    concurrency: int | None = Field(default=None, description="The judged level.")
    before_tok_s: float | None = None
    after_tok_s: float | None = Field(default=None, description="Mean output tok/s over this experiment's runs.")
    runs_tok_s: list[float] = Field(default_factory=list, description="Output tok/s of each run at the judged level.")
    change_pct: float | None = None
    noise_pct: float | None = Field(default=None, description="Measured: spread of the baseline's runs.")
    band_pct: float = Field(description="A change must beat this to be adopted: max(floor, measured noise).")
    failed_levels: list[int] = Field(default_factory=list)
    noop_flags: list[str] = Field(default_factory=list, description="Flags the engine accepts but never reads.")
    not_modelled: list[str] = Field(
        default_factory=list, description="Flags this change touches that the engine does not model (simulated)."
    )
    text: str = Field(description="The comparison in one sentence, with its numbers: usable as a verdict's reason.")


# ---- answers at pivots: what the user's words mean, and which tiers and items they release

STOP_WORDS = {
    "the",
    "a",
    "an",
    "of",
    "and",
    "or",
    "to",
    "on",
    "in",
    "for",
    "with",
    "at",
    "by",
    "try",
    "run",
    "test",
    "please",
    "item",
    "do",
    "it",
    "go",
    "next",
    "then",
    "i",
    "want",
    "lets",
    "let's",
    "us",
}
CONTINUE_WORDS = ("continue", "go on", "proceed", "next tier", "yes", "carry on", "keep going")
STOP_ANSWERS = ("stop", "finish", "done", "enough", "end", "quit")


@dataclass
class Decision:
    """What the answers given so far decide: the tiers released, the items asked for, whether to stop."""

    released: set[int]
    requested: list[tuple[str, datetime]] = field(default_factory=list)  # (item id, asked since)
    stopped_at: datetime | None = None
    unclear: m.Pivot | None = None  # the last answer, when it was not understood (or cannot be done)
    why_unclear: str = ""


def interpret(answer: str, options: list[str], plan: m.Plan) -> tuple[str, str | None]:
    """An answer's meaning: ("continue", None), ("stop", None), ("item", id) or ("unclear", None)."""
    text = answer.strip()
    low = text.lower()
    if re.fullmatch(r"\d+", text) and options and 1 <= int(text) <= len(options) and text not in plan.item_ids():
        return interpret(options[int(text) - 1], [], plan)
    if re.fullmatch(r"\d+", text) and text in plan.item_ids():
        return "item", text
    words = re.findall(r"[a-z0-9+.-]+", low)
    if words and words[0] in STOP_ANSWERS:
        return "stop", None
    if any(low.startswith(w) for w in CONTINUE_WORDS):
        return "continue", None
    ids = [w for w in re.findall(r"\b\d{2,3}\b", low) if w in plan.item_ids()]
    if ids:
        return "item", ids[0]
    significant = [w for w in words if w not in STOP_WORDS and len(w) > 1]
    if significant:
        scores = []
        for item in plan.items:
            title = set(re.findall(r"[a-z0-9+.-]+", item.title.lower()))
            hit = sum(w in title for w in significant)
            scores.append((hit, item.id))
        scores.sort(reverse=True)
        best, second = scores[0], scores[1] if len(scores) > 1 else (0, "")
        if best[0] > 0 and best[0] > second[0] and best[0] * 2 >= len(significant):
            return "item", best[1]
    return "unclear", None


def understood(options: list[str], plan: m.Plan) -> str:
    ids = plan.item_ids()
    span = f"{ids[0]}-{ids[-1]}" if ids else "none"
    nums = f"an option's number (1-{len(options)}), " if options else ""
    return (
        f"I understand {nums}a plan item's id ({span}) or words of its title to test that item next, "
        "'continue' to go on, or 'stop' to write the final summary and end."
    )


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _names(flags: list[str]) -> str:
    return ", ".join(flags[:-1]) + f" and {flags[-1]}" if len(flags) > 1 else (flags[0] if flags else "")


def not_measured_text(flags: list[str]) -> str:
    """Why a change is not measured, and what would measure it."""
    return (
        f"not measured: the twin does not model {_names(flags)}, so its numbers cannot show what this change does; "
        "measure it on a GPU (--engine sglang)"
    )


@dataclass
class Method:
    """One reading of a session's ledger by the method's rules."""

    store: Store
    record: m.Session
    experiments: list[m.Experiment]
    runs: dict[int, list[m.BenchResult]]
    pivots: list[m.Pivot] = field(default_factory=list)

    @classmethod
    def read(cls, store: Store, session_id: str) -> Method:
        record = store.get_session(session_id)
        experiments = store.experiments(session_id)
        runs = {e.id or 0: store.bench_results(e.id or 0) for e in experiments}
        return cls(store, record, experiments, runs, store.pivots(session_id))

    @property
    def settings(self) -> m.SessionSettings:
        return self.record.settings

    @property
    def plan(self) -> m.Plan:
        return self.record.plan

    def experiment(self, experiment_id: int | None) -> m.Experiment | None:
        return next((e for e in self.experiments if e.id == experiment_id), None)

    # ---- levels

    def ok_values(self, e: m.Experiment) -> dict[int, list[float]]:
        """Output tok/s per concurrency and run, for levels that completed with no failed request."""
        out: dict[int, list[float]] = {}
        for result in self.runs.get(e.id or 0, []):
            for lv in result.levels:
                if lv.max_concurrency is not None and lv.completed > 0 and lv.failed == 0:
                    out.setdefault(lv.max_concurrency, []).append(lv.output_throughput)
        return out

    def failed_levels(self, e: m.Experiment) -> list[int]:
        return sorted(
            {
                lv.max_concurrency
                for r in self.runs.get(e.id or 0, [])
                for lv in r.levels
                if lv.failed > 0 and lv.max_concurrency is not None
            }
        )

    def run_count(self, e: m.Experiment) -> int:
        return len(self.runs.get(e.id or 0, []))

    # ---- baseline, noise, best

    def baseline(self, workload: m.BenchSpec | None = None) -> m.Experiment | None:
        """The baseline on `workload` (default: the plan's): the first baseline experiment measured on it, else the
        latest one tried (which may have failed to start)."""
        key = (workload or self.plan.workload).workload_key()
        tried = [e for e in self.experiments if e.kind == "baseline" and e.workload.workload_key() == key]
        measured = [e for e in tried if self.run_count(e) > 0]
        return measured[0] if measured else (tried[-1] if tried else None)

    def noise_pct(self, workload: m.BenchSpec | None = None) -> float | None:
        """The measured noise: (max - min) / mean of the baseline's runs at its top level; None before two runs."""
        base = self.baseline(workload)
        if base is None:
            return None
        values = self.ok_values(base)
        if not values:
            return None
        runs = values[max(values)]
        if len(runs) < 2:
            return None
        mean = sum(runs) / len(runs)
        return (max(runs) - min(runs)) / mean * 100 if mean > 0 else None

    def band_pct(self, workload: m.BenchSpec | None = None) -> float:
        noise = self.noise_pct(workload)
        return max(self.settings.min_gain_pct, noise or 0.0)

    def best(self, workload: m.BenchSpec | None = None) -> m.Experiment | None:
        """The best configuration so far on `workload`: the last adopted change, else the baseline."""
        key = (workload or self.plan.workload).workload_key()
        adopted = [e for e in self.experiments if e.verdict == "adopted" and e.workload.workload_key() == key]
        return adopted[-1] if adopted else self.baseline(workload)

    def best_config(self) -> m.ServerConfig:
        best = self.best()
        return best.config if best is not None else self.plan.target.base_config()

    # ---- tiers, answers and items

    def decision(self) -> Decision:
        """What the answers at the pivots decide, read in order: the tiers released, the items asked for, a stop."""
        plan = self.plan
        tiers = sorted({it.tier for it in plan.items})
        d = Decision(released={tiers[0]} if tiers else set(), requested=[])
        for p in self.pivots:
            if p.answer is None:
                continue
            meaning, item_id = interpret(p.answer, p.options, plan)
            d.unclear = None
            if meaning == "stop":
                d.stopped_at = p.answered_at or p.asked_at
                continue  # read on: an item asked for after a stop reopens the campaign for that item
            if meaning == "continue" and d.stopped_at is not None:
                d.stopped_at = None  # going on after a stop: the campaign is open again
            if meaning == "item" and item_id is not None and plan.item(item_id).kind == "code":
                d.unclear = p
                d.why_unclear = (
                    f"Item {item_id} is a code change for you to make (its improvement document says what); "
                    "pivot has nothing to run for it."
                )
            elif meaning == "item" and item_id is not None:
                d.requested.append((item_id, p.answered_at or p.asked_at))
            elif meaning == "continue":
                if not any(not self.done(it, before=p.asked_at) for it in plan.items if it.tier in d.released):
                    later = [t for t in tiers if t not in d.released]
                    if later:
                        d.released.add(later[0])
            else:
                d.unclear = p
                d.why_unclear = f"I did not understand {quote(p.answer or '')}."
        return d

    def final(
        self, item: m.PlanItem, since: datetime | None = None, before: datetime | None = None
    ) -> list[m.Experiment]:
        """The item's experiments with a verdict (a baseline of its own workload does not settle it)."""
        out = []
        for e in self.experiments:  # an item tested inside a combined experiment counts as tested
            if item.id not in e.plan_items or e.verdict is None or e.kind == "baseline":
                continue
            if since is not None and e.created_at <= since:
                continue
            if before is not None and (e.finished_at or e.created_at) > before:
                continue
            out.append(e)
        return out

    def done(self, item: m.PlanItem, since: datetime | None = None, before: datetime | None = None) -> bool:
        """Whether the item needs no more work: a verdict recorded (after `since`, before `before`), a code item
        (documented for the user), or a workload item whose baseline is judged."""
        if item.kind == "code":
            return True  # documented for the user: there is nothing to run
        if item.kind == "workload" and item.flags is None and not item.remove_flags:
            base = self.baseline(item.workload_for(self.plan.workload))
            return base is not None and base.verdict is not None
        return bool(self.final(item, since, before))

    def next_item(self, d: Decision | None = None) -> m.PlanItem | None:
        """The next item to work on: one the user asked for, else the first undone item of a released tier."""
        d = d or self.decision()
        plan = self.plan
        for item_id, since in d.requested:
            if d.stopped_at is not None and since <= d.stopped_at:
                continue  # asked for before the stop
            item = plan.item(item_id)
            if item.kind != "code" and not self.done(item, since=since):
                return item
        if d.stopped_at is not None:
            return None  # stopped: only items asked for after the stop are tested
        for item in plan.items:
            if item.tier in d.released and not self.done(item):
                return item
        return None

    def finished(self) -> bool:
        """Whether the campaign has nothing left to do by the method: a stop was answered, or every item of the
        released tiers is done. The same reading for every model."""
        return self.next_item(self.decision()) is None

    # ---- judging

    def changed_flags(self, e: m.Experiment) -> list[str]:
        """The flags `e` changes against its base (else the plan's base flags), as typed."""
        base = self.experiment(e.base_experiment_id)
        base_config = base.config if base is not None else self.plan.target.base_config()
        return [c.name for c in e.config.diff(base_config).flags]

    def unmodelled_change(self, e: m.Experiment) -> tuple[list[str], list[str]]:
        """(changed flags, those of them the engine does not model) for a change; both empty for a baseline."""
        if e.kind == "baseline":
            return [], []
        changed = self.changed_flags(e)
        base = self.experiment(e.base_experiment_id)
        unmodelled = set(e.not_modelled) | set(base.not_modelled if base is not None else [])
        return changed, [f for f in changed if f in unmodelled]

    def judge(self, e: m.Experiment) -> Judgement:
        """`e` against its base, by the rules in the module docstring."""
        eid = e.id or 0
        band = self.band_pct(e.workload)
        noise = self.noise_pct(e.workload)
        noops = [i.flag for i in e.audit if i.status == "noop"]
        failed = self.failed_levels(e)
        common = {
            "experiment_id": eid,
            "base_experiment_id": e.base_experiment_id,
            "band_pct": band,
            "noise_pct": noise,
            "noop_flags": noops,
            "failed_levels": failed,
        }
        if e.failure in REFUSED_FAILURES and self.run_count(e) == 0:
            return Judgement(suggestion="ruled_out", text=f"the engine refused the flags ({e.failure})", **common)
        if failed:
            why = f" ({e.failure})" if e.failure else ""
            return Judgement(
                suggestion="crashed",
                text=f"requests failed at concurrency {', '.join(map(str, failed))}{why}",
                **common,
            )
        if e.status == "failed" and self.run_count(e) == 0:
            detail = f": {e.failure_detail}" if e.failure_detail else ""
            return Judgement(suggestion="crashed", text=f"did not start ({e.failure or 'failed'}){detail}", **common)
        changed, unmodelled = self.unmodelled_change(e)
        common["not_modelled"] = unmodelled
        if changed and len(unmodelled) == len(changed):
            return Judgement(suggestion="not_measured", text=not_measured_text(unmodelled), **common)
        after = self.ok_values(e)
        if not after:
            return Judgement(suggestion="pending", text="not measured yet", **common)
        if e.kind == "baseline":
            top = max(after)
            runs = after[top]
            mean = sum(runs) / len(runs)
            text = f"{_n(mean)} output tok/s at concurrency {top}"
            if len(runs) > 1:
                text += f" (mean of {len(runs)} runs: {', '.join(_n(v) for v in runs)}; spread {noise or 0:.1f}%)"
            return Judgement(
                suggestion="baseline", concurrency=top, after_tok_s=mean, runs_tok_s=runs, text=text, **common
            )
        base = self.experiment(e.base_experiment_id)
        before = self.ok_values(base) if base is not None else {}
        shared = sorted(set(before) & set(after))
        if not shared:
            return Judgement(suggestion="pending", text="no level to compare with its base", **common)
        c = shared[-1]
        b = sum(before[c]) / len(before[c])
        runs = after[c]
        a = sum(runs) / len(runs)
        change = (a - b) / b * 100 if b > 0 else 0.0
        confirm = self.settings.search and len(runs) < 2
        if change >= band and change > 0 and confirm:
            suggestion: Suggestion = "rerun"  # one lucky run never becomes the bar: a second run confirms it
        elif change >= band and change > 0:
            suggestion = "adopted"
        elif change <= -band:
            suggestion = "regressed"
        elif change > 0 and len(runs) < 1 + self.settings.reruns:
            suggestion = "rerun"
        else:
            suggestion = "no_gain"
        measured = (
            f"{_n(a)}" if len(runs) == 1 else f"{_n(a)}, mean of {len(runs)} runs: {', '.join(_n(v) for v in runs)}"
        )
        text = (
            f"{change:+.1f}% output tok/s at concurrency {c} ({_n(b)} -> {measured}; experiment {e.base_experiment_id} "
            f"-> {eid})"
        )
        floor = self.settings.min_gain_pct
        why_band = f"measured noise {noise:.1f}%, floor {floor:g}%" if noise is not None else f"floor {floor:g}%"
        if suggestion == "rerun" and change >= band:
            text += (
                f", beyond the {band:.1f}% noise band on one run ({why_band}): a second run confirms it before it "
                "becomes the bar (the band applies to the mean)"
            )
        elif suggestion in ("no_gain", "rerun"):
            text += f", inside the {band:.1f}% noise band ({why_band})"
        elif suggestion == "adopted":
            text += f", beyond the {band:.1f}% noise band ({why_band})"
        if noops:
            text += f"; {', '.join(noops)} {'is' if len(noops) == 1 else 'are'} accepted but read nowhere (no-op)"
        if unmodelled:
            text += (
                f"; the twin does not model {_names(unmodelled)}, also changed: its effect is not in these numbers "
                "(measure it on a GPU)"
            )
        return Judgement(
            suggestion=suggestion,
            concurrency=c,
            before_tok_s=b,
            after_tok_s=a,
            runs_tok_s=runs,
            change_pct=change,
            text=text,
            **common,
        )


# ---- the guard: the method's rules, enforced for every model in one place
#
# RULES is the method as the model reads it (agent/loop.py builds its METHOD text from these) and as MethodGuard
# enforces it: a rule with a `check` refuses a tool call that breaks it before the tool runs (so a refused call
# leaves no experiment, no server and no verdict behind), with the reason and the numbers as a retry for the
# model. A rule `enforced_by` a tool is checked inside that tool (record_verdict judges the numbers itself).

Args = dict[str, Any]
Check = Callable[["Method", Session, str, Args], "str | None"]

MIN_QUESTION_CHARS = 12
MIN_OPTIONS = 1


@dataclass(frozen=True)
class Rule:
    """One rule of the method: its text for the model, and how it is enforced (a check here, a tool, or not)."""

    key: str
    text: str
    check: Check | None = None
    enforced_by: str | None = None

    @property
    def enforced(self) -> bool:
        return self.check is not None or self.enforced_by is not None


def baseline_runs_needed(method: Method) -> int:
    """Runs of a baseline before any change is measured against it: two at least (their spread is the noise)."""
    return max(2, 1 + method.settings.reruns)


def _launch_items(method: Method, args: Args) -> list[str]:
    items = [str(x) for x in (args.get("plan_items") or [])]
    if not items and args.get("plan_item") is not None:
        items = [str(args["plan_item"])]
    return [i for i in items if i in method.plan.item_ids()]


def _is_rerun(args: Args) -> bool:
    return args.get("experiment_id") is not None


def _new_experiment(tool: str, args: Args) -> bool:
    """Whether the call records a new experiment: a launch that is not a rerun, or an item ruled out by id."""
    if tool == "launch_server":
        return not _is_rerun(args)
    return tool == "record_verdict" and args.get("experiment_id") is None and args.get("plan_item") is not None


def _check_documents(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if not _new_experiment(tool, args):
        return None
    written = {d.plan_item for d in session.store.documents(session.id) if d.kind == "improvement"}
    missing = [i for i in method.plan.item_ids() if i not in written]
    if not missing:
        return None
    return (
        f"write the improvement documents before the first experiment: {len(missing)} of "
        f"{len(method.plan.items)} missing ({', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''}); "
        "call write_improvement_doc for each"
    )


def _check_baseline_rerun(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if tool != "launch_server" or _is_rerun(args) or args.get("baseline"):
        return None
    items = _launch_items(method, args)
    workload = method.plan.item(items[0]).workload_for(method.plan.workload) if items else method.plan.workload
    base = method.baseline(workload)
    need = baseline_runs_needed(method)
    if base is None or method.run_count(base) == 0:
        how = f"baseline=True and plan_item={items[0]!r}" if items and method.plan.item(items[0]).workload else ""
        return (
            "measure the baseline first (launch_server with "
            + (how or "baseline=True")
            + ", run_benchmark), then rerun it (launch_server with its experiment_id, run_benchmark)"
        )
    runs = method.run_count(base)
    if runs < need:
        return (
            f"the baseline (experiment {base.id}) has {runs} run of the {need} that measure the noise: rerun it "
            f"first (launch_server experiment_id={base.id}, run_benchmark), then record_verdict verdict=baseline"
        )
    return None


def _allowed_items(method: Method, d: Decision) -> tuple[set[str], str]:
    """The items a step may name now, and why those."""
    plan = method.plan
    asked = {i for i, since in d.requested if d.stopped_at is None or since > d.stopped_at}
    if d.stopped_at is not None:
        return asked, "the user answered stop" + (f"; asked for since: {', '.join(sorted(asked))}" if asked else "")
    released = {it.id for it in plan.items if it.tier in d.released}
    tiers = ", ".join(str(t) for t in sorted(d.released))
    return released | asked, f"released tiers: {tiers}" + (f"; asked for: {', '.join(sorted(asked))}" if asked else "")


def _check_released(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if tool not in ("launch_server", "record_verdict") or not _new_experiment(tool, args):
        return None
    if tool == "launch_server" and args.get("baseline") and not _launch_items(method, args):
        return None  # the plan's own baseline
    items = _launch_items(method, args) if tool == "launch_server" else [str(args.get("plan_item"))]
    d = method.decision()
    allowed, why = _allowed_items(method, d)
    blocked = [i for i in items if i not in allowed]
    if not blocked:
        return None
    tiers = ", ".join(f"{i} (tier {method.plan.item(i).tier})" for i in blocked if i in method.plan.item_ids())
    return (
        f"item {tiers or ', '.join(blocked)} is not released: {why}. Only the user's answer at a pivot releases "
        "the next tier or asks for an item (write_status_summary, then ask_user)"
    )


def _parse_retry_flags(flags: str) -> int | None:
    found = re.fullmatch(r"\s*--max-running-requests(?:\s+|=)(\d+)\s*", flags or "")
    return int(found.group(1)) if found else None


def _check_one_change(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if tool != "launch_server" or _is_rerun(args):
        return None
    flags, remove = args.get("flags"), args.get("remove_flags")
    if args.get("baseline"):
        if flags or remove:
            return "a baseline runs the plan's base flags as they are: launch_server baseline=True without flags"
        return None
    items = _launch_items(method, args)
    named = [str(x) for x in (args.get("plan_items") or [])] or (
        [str(args["plan_item"])] if args.get("plan_item") else []
    )
    unknown = [i for i in named if i not in method.plan.item_ids()]
    if unknown:
        return f"no plan item {', '.join(unknown)}; items: {', '.join(method.plan.item_ids())}"
    if not items:
        return (
            "a change is a plan item on top of the best configuration: name it (plan_item, or plan_items for a "
            "combined step); extra flags alone are not a step of the plan"
        )
    code = [i for i in items if method.plan.item(i).kind == "code"]
    if code:
        return f"item {', '.join(code)} is a code change for the user: its document says what; there is nothing to run"
    if remove:
        return (
            f"launch the best configuration plus item {', '.join(items)} as the plan writes it: remove_flags "
            f"{remove} is a change of its own"
        )
    if not flags:
        return None
    n = _parse_retry_flags(flags)
    last = next((e for e in reversed(method.experiments) if e.plan_items == items and e.kind == "change"), None)
    failed = method.failed_levels(last) if last is not None else []
    if n is None or last is None or not failed:
        return (
            f"one change at a time: the step is the best configuration ({method.best_config()}) plus item "
            f"{', '.join(items)}; extra flags {flags!r} are refused. The one exception: after the item crashed "
            "under load, flags='--max-running-requests N' below the first level that failed"
        )
    if not 1 <= n < min(failed):
        return (
            f"the bounded retry of item {', '.join(items)} caps --max-running-requests below {min(failed)}, the "
            f"first level that failed in experiment {last.id} (failed at {', '.join(map(str, failed))}); got {n}"
        )
    return None


def _tier_finished_at(method: Method, tier: int) -> datetime | None:
    """When the tier's last item was settled, if every item of it is done (None otherwise, or with nothing run)."""
    items = method.plan.tier_items(tier)
    if not items or not all(method.done(it) for it in items):
        return None
    times = [e.finished_at or e.created_at for it in items for e in method.final(it)]
    return max(times) if times else None


def _check_pivot_after_tier(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if not _new_experiment(tool, args):
        return None
    if tool == "launch_server" and args.get("baseline") and not _launch_items(method, args):
        return None
    items = _launch_items(method, args) if tool == "launch_server" else [str(args.get("plan_item"))]
    tiers_of_step = {method.plan.item(i).tier for i in items if i in method.plan.item_ids()}
    last_pivot = max((p.asked_at for p in method.pivots), default=None)
    d = method.decision()
    for tier in sorted(d.released):
        at = _tier_finished_at(method, tier)
        if at is None or (last_pivot is not None and at <= last_pivot) or tiers_of_step <= {tier}:
            continue  # not finished, or asked about since, or a retest within the tier itself
        name = method.plan.tiers.get(tier, "")
        return (
            f"Tier {tier}{f' ({name})' if name else ''} is finished: stop at a pivot before an item of another "
            f"tier ({', '.join(items)}): write_status_summary with a question and options, then ask_user with the "
            "same"
        )
    return None


def _check_question(method: Method, session: Session, tool: str, args: Args) -> str | None:
    if tool not in ("ask_user", "write_status_summary"):
        return None
    question = str(args.get("question") or "").strip()
    options = [str(o).strip() for o in (args.get("options") or []) if str(o).strip()]
    if len(question) < MIN_QUESTION_CHARS or len(question.split()) < 3:
        return (
            f"{question!r} is not a question the user can answer: say what was found (the numbers) and what to "
            f"decide, in at least three words and {MIN_QUESTION_CHARS} characters"
        )
    distinct = len({o.lower() for o in options}) == len(options)
    if tool == "ask_user" and (len(options) < MIN_OPTIONS or not distinct):
        return f"a pivot offers distinct options (what each would run, and 'stop'); got {options}"
    return None


RULES: list[Rule] = [
    Rule("todo", "Keep a todo list (todo_write) that follows the plan: read the plan with plan_read."),
    Rule(
        "documents",
        "Write the improvement document of every plan item (write_improvement_doc) before the first experiment.",
        _check_documents,
    ),
    Rule(
        "baseline",
        "Measure a baseline first (launch_server baseline=True, without flags; run_benchmark), then rerun it "
        "(launch_server with its experiment_id, run_benchmark): the spread between the runs is the measured noise; "
        "record_verdict verdict=baseline. No change is launched before the rerun. An item that changes the "
        "workload gets its own baseline on it (baseline=True with that plan_item).",
        _check_baseline_rerun,
    ),
    Rule(
        "released",
        "Work only on items of the released tiers (the first tier at the start; the next one when the user "
        "answers 'continue' after a finished tier) and on items the user asked for at a pivot; after 'stop', "
        "only items asked for since.",
        _check_released,
    ),
    Rule(
        "one_change",
        "One change at a time, on top of the best configuration so far: launch_server with plan_item (or "
        "plan_items for a combined step of several items), without extra flags; rerun an experiment with its "
        "experiment_id. The one exception: after an item crashed under load, retry it once capped, "
        "flags='--max-running-requests N' below the first level that failed. audit_flags first; if the engine "
        "would refuse the flags, record_verdict with plan_item and verdict ruled_out, without launching. If the "
        "engine is simulated and does not model the flags the item changes, record_verdict with plan_item and "
        "verdict not_measured, without launching (its numbers could not show the change: it needs a GPU). A code "
        "item is documented for the user; there is nothing to run.",
        _check_one_change,
    ),
    Rule(
        "verdict",
        "Record each verdict by the numbers run_benchmark returns: adopted only beyond the noise band, a gain "
        "inside it rerun before it is called no_gain, regressed beyond the band the other way, crashed with the "
        "classified reason; name no-op flags in the reason. stop_server after each.",
        enforced_by="record_verdict",
    ),
    Rule(
        "profile",
        "A profile item: launch_server with that plan_item (the best configuration), run_benchmark, profile, "
        "stop_server, record_verdict measured.",
    ),
    Rule("docs_after", "After each verdict bring the item's document up to date (write_improvement_doc)."),
    Rule(
        "pivot_after_tier",
        "When a tier is finished, stop at a pivot before an item of another tier: write_status_summary with a question "
        "and numbered options, then ask_user with the same. Stop at a pivot too after several changes in a row "
        "without gain and after a promising item crashed. Do what the answer says.",
        _check_pivot_after_tier,
    ),
    Rule(
        "question",
        "A pivot's question says what was found and what to decide (three words at least); ask_user offers "
        "distinct numbered options, each saying what pivot would do (and 'stop').",
        _check_question,
    ),
    Rule(
        "finish",
        "When every released item is done or the user said stop, write a final status summary and end with a "
        "short message; the method decides from the ledger whether the campaign is finished.",
    ),
]


GUARDED_TOOLS = frozenset({"launch_server", "record_verdict", "ask_user", "write_status_summary"})


def method_text() -> str:
    """The method as numbered rules, for the model's instructions (enforced ones marked)."""
    lines = []
    for i, rule in enumerate(RULES, start=1):
        mark = " [enforced]" if rule.enforced else ""
        lines.append(f"{i}. {rule.text}{mark}")
    return "\n".join(lines)


def refusal(session: Session, tool: str, args: Args) -> str | None:
    """Why the method refuses this call, or None when it may run. Reads the ledger afresh."""
    if tool not in GUARDED_TOOLS:
        return None  # reads and measurements of a running server change nothing the method rules on
    checks = [r for r in RULES if r.check is not None]
    method = Method.read(session.store, session.id)
    for rule in checks:
        assert rule.check is not None
        why = rule.check(method, session, tool, args)
        if why is not None:
            return f"refused by the method ({rule.key}): {why}"
    return None


@dataclass
class MethodGuard(WrapperToolset[Session]):
    """Wraps a toolset: every call goes through the method's rules first; a call that breaks one is refused as a
    retry with the reason and the numbers, and the tool never runs."""

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Session], tool: ToolsetTool[Session]
    ) -> Any:
        why = refusal(ctx.deps, name, tool_args)
        if why is not None:
            ctx.deps.emit("warning", f"{name}: {why}")
            raise ModelRetry(why)
        return await super().call_tool(name, tool_args, ctx, tool)
