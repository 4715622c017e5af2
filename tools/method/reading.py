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

In tools/method/guard.py, RULES is the method as the model reads it and as MethodGuard (a WrapperToolset around
every toolset of the agent) enforces it, for every model: a call that breaks a rule is refused before its tool
runs, with the reason and the numbers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from agent import models as m
from agent.contracts import load_engine
from agent.errors import PivotError
from agent.store import Store
from agent.text import quote

REFUSED_FAILURES = ("unrecognized-argument", "ambiguous-argument", "argument-validation")
Suggestion = Literal[
    "baseline",
    "adopted",
    "no_gain",
    "regressed",
    "crashed",
    "ruled_out",
    "not_measured",
    "rerun",
    "pending",
    "superseded",
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

    @functools.cached_property
    def model_flags(self) -> Sequence[str]:
        """The flags that name the model in the session's engine's spelling (Engine.model_flags)."""
        try:
            return load_engine(self.record.engine, **self.settings.engine_options).model_flags
        except PivotError:  # the engine is not installed here (a ledger read elsewhere): SGLang's spelling
            return m.DEFAULT_MODEL_FLAGS

    def base_config(self) -> m.ServerConfig:
        """The plan's base flags with the model named in the engine's spelling (Target.base_config)."""
        return self.plan.target.base_config(self.model_flags)

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
        return best.config if best is not None else self.base_config()

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
        base_config = base.config if base is not None else self.base_config()
        return [c.name for c in e.config.diff(base_config).flags]

    def unmodelled_change(self, e: m.Experiment) -> tuple[list[str], list[str]]:
        """(changed flags, those of them the engine does not model) for a change; both empty for a baseline."""
        if e.kind == "baseline":
            return [], []
        changed = self.changed_flags(e)
        base = self.experiment(e.base_experiment_id)
        unmodelled = set(e.not_modelled) | set(base.not_modelled if base is not None else [])
        return changed, [f for f in changed if f in unmodelled]

    def _suggest(self, change: float, band: float, runs: int, moved: bool) -> Suggestion:
        """The verdict a change of `change` % on `runs` runs suggests, by the rules in the module docstring."""
        if change >= band and change > 0 and moved:
            return "superseded"  # a change tested beside it gained more and became the best
        if change >= band and change > 0 and self.settings.search and runs < 2:
            return "rerun"  # one lucky run never becomes the bar: a second run confirms it
        if change >= band and change > 0:
            return "adopted"
        if change <= -band:
            return "regressed"
        if change > 0 and runs < 1 + self.settings.reruns:
            return "rerun"
        return "no_gain"

    def _band_clause(self, suggestion: Suggestion, change: float, band: float, noise: float | None) -> str:
        """How the change stands against the noise band, in words, for the judgement's text."""
        floor = self.settings.min_gain_pct
        why_band = f"measured noise {noise:.1f}%, floor {floor:g}%" if noise is not None else f"floor {floor:g}%"
        if suggestion == "rerun" and change >= band:
            return (
                f", beyond the {band:.1f}% noise band on one run ({why_band}): a second run confirms it before it "
                "becomes the bar (the band applies to the mean)"
            )
        if suggestion in ("no_gain", "rerun"):
            return f", inside the {band:.1f}% noise band ({why_band})"
        if suggestion in ("adopted", "superseded"):
            return f", beyond the {band:.1f}% noise band ({why_band})"
        return ""

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
            what = "the server refused the benchmark's requests" if e.failure == "request-refused" else "did not start"
            return Judgement(suggestion="crashed", text=f"{what} ({e.failure or 'failed'}){detail}", **common)
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
        best = self.best(e.workload)
        moved = (  # another change was adopted since e was launched on its base (an executor ran them side by side)
            best is not None and e.base_experiment_id is not None and best.id not in (e.id, e.base_experiment_id)
        )
        suggestion = self._suggest(change, band, len(runs), moved)
        measured = (
            f"{_n(a)}" if len(runs) == 1 else f"{_n(a)}, mean of {len(runs)} runs: {', '.join(_n(v) for v in runs)}"
        )
        text = (
            f"{change:+.1f}% output tok/s at concurrency {c} ({_n(b)} -> {measured}; experiment {e.base_experiment_id} "
            f"-> {eid})"
        ) + self._band_clause(suggestion, change, band, noise)
        if suggestion == "superseded" and best is not None:
            bv = self.ok_values(best).get(c) or []
            at = f" with {_n(sum(bv) / len(bv))} output tok/s at concurrency {c}" if bv else ""
            text += (
                f", but experiment {best.id}, run beside it, became the best{at}: not adopted (the search weighs it "
                "again on the new best)"
            )
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
