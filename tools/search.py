"""The search: pivot's digital twin as the campaign's surrogate model, and the next step it proposes.

Before a launch is spent, candidates are predicted with the twin for the campaign's target (model profile,
hardware, GPUs) on its workload at the judged level, and the prediction is corrected to this campaign's own
measurements: the twin's output tok/s is multiplied by the mean ratio measured / predicted of the experiments
measured so far at that level (the baseline first, refreshed as experiments land), and the predicted change is
taken against the best configuration's measured mean. Candidates are:

- single items on top of the best configuration (undone items of the tiers the user has opened);
- retests: an item that gave no gain (or lost) on an older best, predicted beyond the noise band on the new one
  (at most RETESTS launches more per item);
- combined steps: pairs, and triples grown from the best pairs, of items that interact (at least one of them does
  not pay alone, and each adds at least MEMBER_MIN_PCT given the others), and the bundle of small gains that add up
  (items each predicted to add at least BUNDLE_MIN_PCT, grown one at a time), launched as ONE experiment naming every
  item it combines.

They are ranked by predicted gain; an item whose flags the twin does not model is ranked by the plan's expected
impact instead (and says so). A candidate is launched only when its predicted gain beats the noise band; an item
the corrected twin predicts inside the band (or at a loss) is recorded with the verdict `predicted`: not launched,
the prediction in its reason, never called a measurement. An item whose flags are all no-ops in this engine
version is ruled out before any launch. Predictions are cached per resolved configuration (two command lines the
twin resolves alike share one simulation), so a campaign predicts each configuration once.

Nothing here decides tiers or pivots: the search only looks at items of the tiers the user has opened
(`Decision.released`), and the autopilot keeps the pivots where the method puts them.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Literal

from agent import models as m
from agent.contracts import Prediction, Predictor, load_engine
from agent.errors import PivotError
from tools import reports
from tools.method import Decision, Method

MEMBER_MIN_PCT = 1.0  # each item of a combined step adds at least this much (predicted) given the others
TRIPLE_SEEDS = 4  # the best pairs grow into triples
BUNDLE_MIN_PCT = 0.2  # an item joins the bundle of small gains when it adds at least this much (predicted)
RETESTS = 1  # launches an item gets beyond its first, on a newer best
SEARCH_KINDS = ("flag", "config")
RETEST_VERDICTS = ("no_gain", "regressed", "predicted", "superseded")


# ---- the engine's predictor (agent/contracts/predictor.py), one per engine, options and target in this process

_PREDICTORS: dict[tuple[str, str, str], Predictor | None] = {}


def predictor_for(method: Method) -> Predictor | None:
    """The predictor the session's engine offers for its target (the SGLang twin for SGLang and the simulated
    engines), or None: the engine has none (vLLM, a plugin's engine), and the search measures instead."""
    key = (
        method.record.engine,
        json.dumps(method.settings.engine_options, sort_keys=True, default=str),
        method.plan.target.model_dump_json(),
    )
    if key not in _PREDICTORS:
        try:
            engine = load_engine(method.record.engine, **method.settings.engine_options)
            _PREDICTORS[key] = engine.predictor(method.plan.target)
        except PivotError:
            _PREDICTORS[key] = None
    return _PREDICTORS[key]


def no_predictor_text(method: Method) -> str:
    """Why there are no predictions for this campaign, in words."""
    return f"no predictor for this target: the {method.record.engine} engine offers none, so the search measures"


# ---- the surrogate: the twin corrected to this campaign


@dataclass
class Estimate:
    """A candidate's predicted effect on top of the best configuration."""

    items: tuple[str, ...]
    config: m.ServerConfig
    source: Literal["twin", "plan", "none"]
    change_pct: float | None = None  # against the best's measured mean (twin) or the plan's expected midpoint
    tok_s: float | None = None  # the corrected twin's output tok/s at the level
    crash: bool = False
    level: int | None = None
    note: str = ""  # the prediction in words

    @property
    def known(self) -> bool:
        return self.change_pct is not None


def _pct(x: float) -> str:
    return f"{x:+.1f}%"


class Surrogate:
    """The twin for one reading of the ledger: the campaign's target and workload, at the judged level."""

    def __init__(self, method: Method, predictor: Predictor | None = None) -> None:
        self.method = method
        plan = method.plan
        self.predictor = predictor if predictor is not None else predictor_for(method)
        self.workload = plan.workload
        self.best = method.best()
        self.best_config = method.best_config()
        jb = method.judge(self.best) if self.best is not None else None
        self.best_tok = jb.after_tok_s if jb is not None else None
        self.level = (jb.concurrency if jb is not None and jb.concurrency else None) or max(self.workload.concurrency)
        self._ratio: tuple[float, int] | None = None
        self._estimates: dict[tuple[str, ...], Estimate] = {}

    def reading(self, config: m.ServerConfig) -> Prediction:
        if self.predictor is None:
            return Prediction(error=no_predictor_text(self.method))
        return self.predictor.predict(config, self.workload, self.level)

    def ratio(self) -> tuple[float, int]:
        """Measured / predicted output tok/s at the level, averaged over the experiments measured there without
        failures on the plan's workload (1.0 before any): the correction of the twin to this campaign."""
        if self._ratio is None:
            key = self.workload.workload_key()
            ratios = []
            for e in self.method.experiments:
                if e.workload.workload_key() != key or e.verdict in ("crashed", "ruled_out", "predicted"):
                    continue
                runs = self.method.ok_values(e).get(self.level)
                if not runs or self.method.failed_levels(e):
                    continue
                r = self.reading(e.config)
                if r.tok_s:
                    ratios.append(sum(runs) / len(runs) / r.tok_s)
            self._ratio = (sum(ratios) / len(ratios), len(ratios)) if ratios else (1.0, 0)
        return self._ratio

    def config_for(self, items: tuple[str, ...]) -> m.ServerConfig:
        config = self.best_config
        for item_id in items:
            config = self.method.plan.item(item_id).apply(config)
        return config

    def estimate_config(self, items: tuple[str, ...], config: m.ServerConfig) -> Estimate:
        """The corrected twin's prediction for an exact config (e.g. an item with an extra flag)."""
        est = self.estimate(items)
        if config == est.config or est.source != "twin":
            return est
        mine, base = self.reading(config), self.reading(self.best_config)
        out = Estimate(items, config, "none", level=self.level)
        if mine.crashed:
            out.source, out.crash = "twin", True
            out.note = f"the twin predicts the server crashes under load at concurrency {self.level}"
        elif mine.tok_s is not None and base.tok_s is not None:
            ratio, _ = self.ratio()
            tok = mine.tok_s * ratio
            ref = self.best_tok or base.tok_s * ratio
            out.source, out.tok_s, out.change_pct = "twin", tok, (tok - ref) / ref * 100
            out.note = f"the twin predicts {tok:,.0f} output tok/s at concurrency {self.level} ({_pct(out.change_pct)})"
        return out

    def estimate(self, items: tuple[str, ...]) -> Estimate:
        """The corrected twin's prediction for `items` (in plan order) on top of the best configuration."""
        items = tuple(sorted(items, key=self.method.plan.item_ids().index))
        if items in self._estimates:
            return self._estimates[items]
        config = self.config_for(items)
        base = self.reading(self.best_config)
        mine = self.reading(config)
        est = Estimate(items, config, "none", level=self.level)
        unmodelled = sorted(set(mine.not_modelled) - set(base.not_modelled))
        if unmodelled:
            exp = (
                reports.parse_expectation(self.method.plan.item(items[0]).expected_impact) if len(items) == 1 else None
            )
            flags = ", ".join("--" + d.replace("_", "-") for d in unmodelled)
            if exp is not None and exp.metric != "mean_tpot_ms":
                est.source, est.change_pct = "plan", exp.midpoint_pct
                est.note = (
                    f"the twin does not model {flags}: ranked by the plan's expected impact "
                    f"({exp.low_pct:+g} to {exp.high_pct:+g}% {exp.metric_words}), not a prediction"
                )
            else:
                est.note = f"the twin does not model {flags} and the plan gives no number: measure it"
        elif mine.crashed:
            est.source, est.crash = "twin", True
            est.note = (
                f"the twin predicts {mine.error}"
                if mine.error
                else f"the twin predicts the server crashes under load at concurrency {self.level}"
            )
        elif mine.error is not None or mine.tok_s is None or base.tok_s is None:
            est.note = f"no prediction: {mine.error or base.error or 'the twin has no reading'}"
        else:
            ratio, n = self.ratio()
            tok = mine.tok_s * ratio
            ref = self.best_tok or base.tok_s * ratio
            est.source, est.tok_s, est.change_pct = "twin", tok, (tok - ref) / ref * 100
            corrected = (
                f"corrected x{ratio:.3f} (measured / predicted over {n} experiment{'s' if n != 1 else ''})"
                if n
                else "uncorrected: nothing measured yet at this level"
            )
            against = (
                f"experiment {self.best.id}'s measured {ref:,.0f}"
                if self.best is not None and self.best_tok
                else f"the twin's {ref:,.0f} for the best configuration"
            )
            est.note = (
                f"the twin predicts {tok:,.0f} output tok/s at concurrency {self.level} "
                f"({_pct(est.change_pct)} against {against}; {corrected})"
            )
        self._estimates[items] = est
        return est


# ---- candidates


@dataclass
class Candidate:
    """One step the search could take: the items it launches together, and why."""

    items: tuple[str, ...]
    estimate: Estimate
    kind: Literal["single", "combined", "retest"]
    alone: dict[str, float | None] = field(default_factory=dict)  # each item's own predicted change
    why: str = ""

    @property
    def gain(self) -> float:
        return self.estimate.change_pct if self.estimate.change_pct is not None else float("-inf")

    def label(self, plan: m.Plan) -> str:
        return " + ".join(f"{i} {plan.item(i).title}" for i in self.items)


def searchable(item: m.PlanItem) -> bool:
    """Items the search ranks: flag and config changes on the plan's workload."""
    return item.kind in SEARCH_KINDS and (item.flags is not None or bool(item.remove_flags)) and not item.workload


def item_issues(method: Method, validate, item: m.PlanItem) -> list[m.FlagIssue]:
    """The audit of the item's own flags on top of the best configuration."""
    config = item.apply(method.best_config())
    names = set(item.flags.names()) if item.flags is not None else set()
    return [i for i in validate(config) if i.flag in names or i.blocking]


def noop_reason(issues: list[m.FlagIssue], item: m.PlanItem) -> str | None:
    """Why the item is not worth a launch when every flag it sets is a no-op in this engine version, else None."""
    names = item.flags.names() if item.flags is not None else []
    noops = [i for i in issues if i.status == "noop"]
    if not names or item.remove_flags or {i.flag for i in noops} != set(names):
        return None
    what = "; ".join(f"{i.flag}: {i.message}" if i.message else i.flag for i in noops)
    return f"no launch: the engine accepts {', '.join(names)} but reads {'it' if len(names) == 1 else 'them'} nowhere (no-op; {what})"


def launches(method: Method, item_id: str) -> int:
    """Experiments that launched (measured or crashed) with the item in them."""
    return sum(
        1
        for e in method.experiments
        if item_id in e.plan_items and e.kind == "change" and (method.run_count(e) > 0 or e.verdict == "crashed")
    )


def pool(method: Method, d: Decision) -> tuple[list[m.PlanItem], list[m.PlanItem]]:
    """(undone items, items worth predicting again) of the opened tiers that the search ranks."""
    best = method.best()
    fresh, again = [], []
    for item in method.plan.items:
        if item.tier not in d.released or not searchable(item):
            continue
        if not method.done(item):
            fresh.append(item)
            continue
        last = method.final(item)[-1]
        if last.verdict == "predicted":  # never launched: it stays a candidate (alone or in a combination)
            again.append(item)
            continue
        if last.verdict not in RETEST_VERDICTS or best is None or last.base_experiment_id == best.id:
            continue
        if launches(method, item.id) > RETESTS:
            continue
        if item.apply(method.best_config()) == method.best_config():
            continue
        again.append(item)
    return fresh, again


def candidates(method: Method, d: Decision, surrogate: Surrogate | None = None) -> list[Candidate]:
    """Every candidate of the opened tiers, best predicted gain first (see the module docstring)."""
    sur = surrogate or Surrogate(method)
    plan = method.plan
    band = method.band_pct()
    fresh, again = pool(method, d)
    items = fresh + again
    retest = {it.id for it in again if launches(method, it.id) > 0}
    alone = {it.id: sur.estimate((it.id,)) for it in items}
    out: list[Candidate] = []
    for it in items:
        est = alone[it.id]
        if est.crash or not est.known:
            continue
        kind: Literal["single", "combined", "retest"] = "retest" if it.id in retest else "single"
        why = est.note
        if kind == "retest":
            last = method.final(it)[-1]
            why = (
                f"retest of {it.id} on the new best (experiment {sur.best.id if sur.best else '?'}): "
                f"{reports.VERDICT_WORDS[last.verdict]} on top of experiment {last.base_experiment_id}; {est.note}"
            )
        out.append(Candidate((it.id,), est, kind, {it.id: est.change_pct}, why))
    modelled = [it.id for it in items if alone[it.id].source == "twin" and not alone[it.id].crash]

    def combo(ids: tuple[str, ...], member_min: float = MEMBER_MIN_PCT) -> Candidate | None:
        est = sur.estimate(ids)
        if est.source != "twin" or est.crash or est.change_pct is None:
            return None
        solo = {i: alone[i].change_pct for i in ids}
        for i in ids:  # no passenger: each item adds its share given the others
            rest = tuple(x for x in ids if x != i)
            without = sur.estimate(rest).change_pct if len(rest) > 1 else alone[rest[0]].change_pct
            if without is None or est.change_pct - without < member_min:
                return None
        parts = ", ".join(f"{i} alone {_pct(v or 0)}" for i, v in solo.items())
        why = f"{' + '.join(ids)} together: {est.note}; {parts}"
        return Candidate(est.items, est, "combined", solo, why)

    pairs = [c for c in (combo(p) for p in itertools.combinations(modelled, 2)) if c is not None]
    triples: dict[tuple[str, ...], Candidate] = {}
    for pair in sorted(pairs, key=lambda c: -c.gain)[:TRIPLE_SEEDS]:
        for other in modelled:
            if other in pair.items:
                continue
            key = tuple(sorted((*pair.items, other), key=plan.item_ids().index))
            if key not in triples:
                c = combo(key)
                if c is not None:
                    triples[key] = c
    # small gains that add up: every item predicted to gain a little, grown one at a time while each adds its share
    small = sorted(
        (i for i in modelled if (alone[i].change_pct or 0) >= BUNDLE_MIN_PCT),
        key=lambda i: -(alone[i].change_pct or 0),
    )
    bundle: tuple[str, ...] = ()
    gain = 0.0
    for i in small:
        grown = tuple(sorted((*bundle, i), key=plan.item_ids().index))
        est = sur.estimate(grown) if len(grown) > 1 else alone[i]
        if est.change_pct is not None and not est.crash and est.change_pct >= gain + BUNDLE_MIN_PCT:
            bundle, gain = grown, est.change_pct
    bundles = []
    if len(bundle) > 1 and gain >= band and bundle not in triples and bundle not in {c.items for c in pairs}:
        c = combo(bundle, BUNDLE_MIN_PCT)
        if c is not None:
            c.why = f"small gains that add up: {c.why}"
            bundles.append(c)
    for c in [*pairs, *triples.values(), *bundles]:
        # a combined step is for items that interact: one of them does not pay alone
        if any(v is None or v < band for v in c.alone.values()):
            out.append(c)
    out.sort(key=lambda c: (-c.gain, len(c.items), c.items))
    return out


# ---- the next step


@dataclass
class Step:
    """What the search proposes next."""

    action: Literal["launch", "predicted", "rule_out"]
    items: tuple[str, ...]
    reason: str
    candidate: Candidate | None = None


def next_step(method: Method, d: Decision, validate) -> Step | None:
    """The search's next step in the opened tiers, or None when it has nothing (the plain path goes on: requested
    items, items on their own workload, profiles, items it cannot predict). `validate` is the engine's audit."""
    if not method.settings.search or d.stopped_at is not None:
        return None
    plan = method.plan
    nxt = method.next_item(d)
    if nxt is not None and any(r == nxt.id for r, _ in d.requested):
        return None  # the user named it at a pivot: it is launched as asked, whatever the twin says
    fresh, _ = pool(method, d)
    for item in fresh:
        issues = item_issues(method, validate, item)
        blocking = [i for i in issues if i.blocking]
        if blocking:
            why = "; ".join(f"{i.flag}: {i.message or i.status}" for i in blocking)
            return Step("rule_out", (item.id,), f"refused before launch: {why}")
        why = noop_reason(issues, item)
        if why is not None:
            return Step("rule_out", (item.id,), why)
    sur = Surrogate(method)
    band = method.band_pct()
    ranked = candidates(method, d, sur)
    for c in ranked:
        if c.gain >= band:
            return Step("launch", c.items, c.why, c)
    for item in fresh:
        est = sur.estimate((item.id,))
        if est.crash and _promising(method, item):
            c = Candidate(
                (item.id,),
                est,
                "single",
                {item.id: None},
                f"{est.note}; the plan expects a large gain: measured anyway",
            )
            return Step("launch", (item.id,), c.why, c)
    for item in fresh:
        est = sur.estimate((item.id,))
        if est.source == "twin" and (est.known or est.crash):
            what = (
                f"{_pct(est.change_pct or 0)}, inside the {band:.1f}% noise band"
                if est.known and (est.change_pct or 0) > -band
                else f"a loss ({_pct(est.change_pct or 0)})"
                if est.known
                else "a crash"
            )
            noops = [i.flag for i in item_issues(method, validate, item) if i.status == "noop"]
            noop = (
                f" ({', '.join(noops)} {'is' if len(noops) == 1 else 'are'} accepted but read nowhere: no-op)"
                if noops
                else ""
            )
            return Step(
                "predicted",
                (item.id,),
                f"not launched: predicted {what}: {est.note}{noop}. A prediction, not a measurement; "
                "name the item at a pivot to measure it",
                Candidate((item.id,), est, "single", {item.id: est.change_pct}),
            )
    for c in ranked:  # items the twin cannot predict, ranked by the plan's expected impact
        if c.estimate.source == "plan" and not method.done(plan.item(c.items[0])):
            return Step("launch", c.items, c.why, c)
    return None


def next_steps(method: Method, d: Decision, validate, limit: int) -> list[Step]:
    """The search's next step and, when it is a launch, up to `limit` launches in all that do not depend on each
    other's outcome: the candidates the twin cannot rank against the first (predicted within the noise band of its
    gain, so only a measurement tells them apart; or, unpredictable, ranked by the plan), on the same best
    configuration, no item in two of them. An executor runs them at once (`--parallel`); the method judges them
    when all are in. A candidate the twin ranks clearly below the first is left for a later step (it would most
    likely be superseded), and a step that is not a launch (a rule-out, a prediction) comes alone."""
    first = next_step(method, d, validate)
    if first is None or first.action != "launch" or limit <= 1 or first.candidate is None:
        return [first] if first is not None else []
    steps = [first]
    used = set(first.items)
    band = method.band_pct()
    source = first.candidate.estimate.source
    for c in candidates(method, d, Surrogate(method)):
        if len(steps) >= limit:
            break
        if used & set(c.items) or c.estimate.source != source or c.estimate.crash:
            continue
        if source == "twin" and (c.gain < band or c.gain < first.candidate.gain - band):
            continue
        if source == "plan" and any(method.done(method.plan.item(i)) for i in c.items):
            continue
        steps.append(Step("launch", c.items, c.why, c))
        used |= set(c.items)
    return steps


def _promising(method: Method, item: m.PlanItem) -> bool:
    exp = reports.parse_expectation(item.expected_impact)
    return exp is not None and exp.midpoint_pct >= 2.0 * method.settings.min_gain_pct


def record_fields(
    method: Method, items: list[str], baseline: bool = False, config: m.ServerConfig | None = None
) -> dict[str, object]:
    """The prediction to record on a new experiment (fields of m.Experiment): empty when there is none."""
    try:
        sur = Surrogate(method)
        if baseline:
            top = max(sur.workload.concurrency)
            r = sur.predictor.predict(method.base_config(), sur.workload, top) if sur.predictor else None
            if r is None or r.tok_s is None:
                return {}
            return {
                "predicted_tok_s": r.tok_s,
                "prediction": f"the twin predicts {r.tok_s:,.0f} output tok/s at concurrency {top} (uncorrected: the "
                "baseline is what corrects it)",
            }
        if not items or not all(i in method.plan.item_ids() for i in items):
            return {}
        est = sur.estimate_config(tuple(items), config) if config is not None else sur.estimate(tuple(items))
    except Exception:
        return {}
    if est.source == "none" and not est.note:
        return {}
    return {
        "predicted_tok_s": est.tok_s,
        "predicted_change_pct": est.change_pct if est.source == "twin" else None,
        "prediction": est.note or None,
    }


def options(method: Method, d: Decision, validate, limit: int = 3) -> list[tuple[str, str]]:
    """The search's next candidates in the opened tiers as pivot options: (answer text, sentence)."""
    if not method.settings.search:
        return []
    try:
        ranked = candidates(method, d)
    except Exception:
        return []
    worth = [c for c in ranked if c.estimate.source == "plan" or c.gain >= 0.1]
    return [option_text(method, c) for c in worth[:limit]]


def launchable(method: Method, d: Decision, validate) -> list[tuple[str, str]]:
    """The options for the candidates the search would launch (predicted beyond the noise band)."""
    band = method.band_pct()
    return [o for o, c in zip(options(method, d, validate, 10), _worth(method, d), strict=False) if c.gain >= band][:1]


def _worth(method: Method, d: Decision) -> list[Candidate]:
    return [c for c in candidates(method, d) if c.estimate.source == "plan" or c.gain >= 0.1]


def option_text(method: Method, c: Candidate) -> tuple[str, str]:
    plan = method.plan
    cost = "1 launch, 2 if it gains (a second run confirms or rejects a gain)"
    if c.kind == "combined":
        head = f"test {'+'.join(c.items)} together"
        what = f"one experiment combining {c.label(plan)}"
    elif c.kind == "retest":
        head = f"{c.items[0]} {plan.item(c.items[0]).title}: retest it on the new best"
        what = "the item again on top of the best configuration"
    else:
        head = f"{c.items[0]} {plan.item(c.items[0]).title}: test it next"
        what = "the item on top of the best configuration"
    pred = (
        f"the twin predicts {_pct(c.estimate.change_pct)}"
        if c.estimate.source == "twin" and c.estimate.change_pct is not None
        else c.estimate.note
    )
    return head, f"{head}: runs {what}; {cost}; {pred}"
