"""The search: the engine's predictor (the SGLang twin) as the campaign's surrogate model, and the steps it ranks.

Before a launch is spent, candidates are predicted for the campaign's target on its workload at the judged level,
and the prediction is corrected by what the campaign has measured (tools/learn.py): the predictor's value of the
session's objective (tools/method/objective.py: output tok/s by default; goodput, tokens per joule or capacity
under SLOs as the plan asks) times the learnt error common to every configuration on this target and the learnt
error about each plan item the configuration holds, each with its uncertainty; the change is taken against the
corrected reading of the best configuration (its measured mean was selected for being high). An item measured at
no effect where the twin said +16% carries that into every later combination that holds it. Candidates are:

- single items on top of the best configuration (undone items of the tiers the user has opened);
- retests: an item that gave no gain (or lost) on an older best, predicted beyond the noise band on the new one
  (at most RETESTS launches of it alone; launches inside combined steps do not count), and the members of a
  combined step that fell short of its prediction, never launched alone;
- combined steps: pairs, and triples grown from the best pairs, of items that interact (at least one of them does
  not pay alone, and each adds at least MEMBER_MIN_PCT given the others), and the bundle of small gains that add up
  (items each predicted to add at least BUNDLE_MIN_PCT, grown one at a time), launched as ONE experiment naming every
  item it combines;
- reverts: an adopted item taken back, when the best configuration rebuilt from its chain of adopted changes
  without it is predicted beyond the noise band (at most probes.REVERTS launches per item);
- leave-one-out probes of a combined step that fell short of its prediction (tools/probes.py);
- the checks of the twin's word alone, when nothing else is left and every tier is open (tools/probes.py): the items
  it recorded `predicted` inside the band, whatever the plan expects of them, launched together once (doubted); then
  the changes judged no gain on one run read with the twin's prediction, once the twin has missed here (leaned); then,
  where the best is a revert of several items measured beyond its prediction, all it took back but the one the
  measurements blame put back once (put_back); then the best configuration's riders, members of an adopted combined
  step never measured alone, taken back together once (riders); once the twin has missed here, last, the move whose
  gain the corrected model's uncertainty most allows, until two measure as the model said (optimistic).

They are ranked by predicted gain; an item whose flags the twin does not model is ranked by the plan's expected
impact instead (and says so). A candidate is launched only when its predicted gain beats the noise band (a probe:
when it would if the member it leaves out is the one the twin has wrong); an item predicted inside the band (or at
a loss) is recorded with the verdict `predicted`: not launched, the prediction in its reason, never called a
measurement. An item whose flags are all no-ops in this engine version is ruled out before any launch. A
configuration already measured is never launched again as a new experiment. Without a predictor (vLLM, a plugin's
engine) nothing is predicted: items are measured in the order of the plan's expected impact, then in plan order.

Nothing here decides tiers, pivots or what is allowed: the search ranks inside the scope the method's moves give it
(tools/method/moves.py), and the moves keep only what they allow.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Literal

from agent import models as m
from agent.contracts import Prediction, Predictor, load_engine
from agent.errors import Interrupted, PivotError
from tools import learn, probes, reports
from tools.audit import audit_steps, item_issues, noop_reason  # noqa: F401 (re-exported)
from tools.method.answers import Decision
from tools.method.moves import promising, revert_text
from tools.method.reading import Method
from tools.method.step import SEARCH_KINDS, Step, searchable  # noqa: F401 (the method's, re-exported)
from tools.probes import checked, launches, missed, own_launches, probes_spent, suspects

MEMBER_MIN_PCT = 1.0  # each item of a combined step adds at least this much (predicted) given the others
TRIPLE_SEEDS = 4  # the best pairs grow into triples
BUNDLE_MIN_PCT = 0.2  # an item joins the bundle of small gains when it adds at least this much (predicted)
RETESTS = 1  # launches an item gets beyond its first, on a newer best
SWAP_SEEDS = 3  # the best candidates are also predicted with each adopted item taken back
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
    return (
        f"no predictions for this target: the {method.record.engine} engine offers no predictor, so each item is "
        "measured"
    )


# ---- the surrogate: the predictor corrected to this campaign


@dataclass
class Estimate:
    """A candidate's predicted effect on top of the best configuration (or on it rebuilt without `reverts`)."""

    items: tuple[str, ...]
    config: m.ServerConfig
    source: Literal["twin", "plan", "none"]
    change_pct: float | None = None  # against the twin's reading of the best (twin) or the plan's expected midpoint
    tok_s: float | None = None  # the corrected prediction of the objective at the level
    crash: bool = False
    level: int | None = None
    note: str = ""  # the prediction in words
    reverts: tuple[str, ...] = ()
    sd_pct: float | None = None  # the corrected change's standard deviation (what the campaign has not pinned down)

    @property
    def known(self) -> bool:
        return self.change_pct is not None


def _pct(x: float) -> str:
    return f"{x:+.1f}%"


class Surrogate:
    """The predictor for one reading of the ledger: the campaign's target and workload, at the judged level."""

    def __init__(self, method: Method, predictor: Predictor | None = None) -> None:
        self.method = method
        plan = method.plan
        self.predictor = predictor if predictor is not None else predictor_for(method)
        if predictor is None and method.settings.fit_twin:  # the twin fitted to this target (tools/fit.py)
            from tools.fit import fitted_predictor

            self.predictor = fitted_predictor(method, self.predictor)
        self.objective = method.objective
        self.workload = plan.workload
        self.best = method.best()
        self.best_config = method.best_config()
        jb = method.judge(self.best) if self.best is not None else None
        self.best_tok = jb.after_tok_s if jb is not None else None
        self.level = (jb.concurrency if jb is not None and jb.concurrency else None) or max(self.workload.concurrency)
        self._model: learn.CampaignModel | None = None
        self._estimates: dict[tuple[tuple[str, ...], tuple[str, ...]], Estimate] = {}
        self._readings: dict[str, tuple[Prediction, float | None]] = {}

    def predicted(self, config: m.ServerConfig) -> tuple[Prediction, float | None]:
        """The predictor's reading of `config` at the level and the objective's predicted value there (None when
        it crashed or has no reading; for capacity, the predicted crossing), once per configuration."""
        if self.predictor is None:
            return Prediction(error=no_predictor_text(self.method)), None
        key = config.model_dump_json()
        if key not in self._readings:
            self._readings[key] = self.objective.predict(self.predictor, config, self.workload, self.level)
        return self._readings[key]

    @property
    def model(self) -> learn.CampaignModel:
        """What the campaign's measurements taught the twin (tools/learn.py), for this reading of the ledger."""
        if self._model is None:
            ids = [it.id for it in self.method.plan.items if searchable(it)]
            self._model = learn.CampaignModel(self.method, self.level, lambda c: self.predicted(c)[1], ids,
                                              self.best_config)  # fmt: skip
        return self._model

    def belief(self, suspect: str | None = None) -> learn.Belief:
        return self.model.belief(suspect)

    def held(self, config: m.ServerConfig) -> frozenset[str]:
        return self.model.held(config)

    def corrected(
        self, config: m.ServerConfig, v: float, b: float, suspect: str | None = None
    ) -> tuple[float, float, float, float]:
        return self.model.corrected(config, v, b, suspect)

    def if_guilty(self, est: Estimate, suspect: str) -> float | None:
        """The change `est` would make if `suspect` carried the whole error of a missed combined step (its
        prior left open), else None when the twin has no reading."""
        (_, v), (_, b) = self.predicted(est.config), self.predicted(self.best_config)
        if not v or not b or v <= 0 or b <= 0:
            return None
        return self.corrected(est.config, v, b, suspect)[2]

    def learnt(self, config: m.ServerConfig) -> str:
        return self.model.learnt(config)

    def config_for(self, items: tuple[str, ...], reverts: tuple[str, ...] = ()) -> m.ServerConfig:
        """The best configuration (rebuilt from its chain without `reverts`) with `items` applied in order."""
        config = self.method.rebuild(drop=reverts) if reverts else self.best_config
        for item_id in items:
            config = self.method.plan.item(item_id).apply(config)
        return config

    def estimate_config(self, items: tuple[str, ...], config: m.ServerConfig) -> Estimate:
        """The corrected prediction for an exact config (e.g. an item with an extra flag)."""
        est = self.estimate(items)
        if config == est.config or est.source != "twin":
            return est
        (mine, v), (_, b) = self.predicted(config), self.predicted(self.best_config)
        out = Estimate(items, config, "none", level=self.level)
        if mine.crashed:
            out.source, out.crash = "twin", True
            out.note = f"the twin predicts the server crashes under load at concurrency {self.level}"
        elif v is not None and b is not None and b > 0:
            tok, _, change, sd = self.corrected(config, v, b) if v > 0 else (0.0, b, -100.0, 0.0)
            out.source, out.tok_s, out.change_pct, out.sd_pct = "twin", tok, change, sd
            out.note = (
                f"the twin predicts {self.objective.number(tok)} {self.objective.at(self.level)} ({_pct(change)})"
                + self.learnt(config)
            )
        return out

    def estimate(self, items: tuple[str, ...], reverts: tuple[str, ...] = ()) -> Estimate:
        """The corrected prediction for `items` (in plan order) on top of the best configuration, or on the best
        configuration rebuilt without `reverts`."""
        items = tuple(sorted(items, key=self.method.plan.item_ids().index))
        key = (items, tuple(reverts))
        if key not in self._estimates:
            config = self.config_for(items, tuple(reverts))
            est = Estimate(items, config, "none", level=self.level, reverts=tuple(reverts))
            if self.predictor is None:
                self._unpredicted(est)
            else:
                self._predicted(est)
            self._estimates[key] = est
        return self._estimates[key]

    def _unpredicted(self, est: Estimate) -> None:
        """Without a predictor: a single item is ranked by the plan's expected impact, the rest is measured."""
        exp = (
            reports.parse_expectation(self.method.plan.item(est.items[0]).expected_impact)
            if len(est.items) == 1 and not est.reverts
            else None
        )
        if exp is not None and exp.speaks_for(self.method.plan.objective.kind):
            est.source, est.change_pct = "plan", exp.gain_pct
            est.note = (
                f"{no_predictor_text(self.method)}: ranked by the plan's expected impact ({exp.low_pct:+g} to "
                f"{exp.high_pct:+g}% {exp.metric_words}), not a prediction"
            )
        else:
            est.note = f"{no_predictor_text(self.method)}: measured in plan order"

    def _predicted(self, est: Estimate) -> None:
        base, b = self.predicted(self.best_config)
        mine, v = self.predicted(est.config)
        unmodelled = sorted(set(mine.not_modelled) - set(base.not_modelled))
        if unmodelled:
            exp = (
                reports.parse_expectation(self.method.plan.item(est.items[0]).expected_impact)
                if len(est.items) == 1 and not est.reverts
                else None
            )
            flags = ", ".join("--" + d.replace("_", "-") for d in unmodelled)
            if exp is not None and exp.speaks_for(self.method.plan.objective.kind):
                est.source, est.change_pct = "plan", exp.gain_pct
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
        elif v is None or b is None or b <= 0:
            est.note = f"no prediction: {mine.error or base.error or 'the twin has no reading'}"
        elif v <= 0:  # nothing of the objective at this level (goodput: no request meets the SLOs)
            est.source, est.tok_s, est.change_pct, est.sd_pct = "twin", 0.0, -100.0, 0.0
            est.note = f"the twin predicts {self.objective.number(0.0)} {self.objective.at(self.level)} (-100%)"
        else:
            tok, ref, change, sd = self.corrected(est.config, v, b)
            est.source, est.tok_s, est.change_pct, est.sd_pct = "twin", tok, change, sd
            n = len(self.belief().observations)
            corrected = (
                f"corrected by {n} measured experiment{'s' if n != 1 else ''} at this level{self.learnt(est.config)}"
                if n
                else "uncorrected: nothing measured yet at this level"
            )
            n = self.objective.number
            against = f"the twin's {n(ref)} for the best configuration" + (
                f" (experiment {self.best.number}, measured {n(self.best_tok)})"
                if self.best is not None and self.best_tok
                else ""
            )
            est.note = (
                f"the twin predicts {n(tok)} {self.objective.at(self.level)} "
                f"({_pct(est.change_pct)} against {against}; {corrected})"
            )


# ---- candidates


@dataclass
class Candidate:
    """One step the search could take: the items it launches together (or takes back), and why."""

    items: tuple[str, ...]
    estimate: Estimate
    kind: Literal["single", "combined", "retest", "revert"]
    alone: dict[str, float | None] = field(default_factory=dict)  # each item's own predicted change
    why: str = ""
    reverts: tuple[str, ...] = ()
    probe: float | None = None  # a leave-one-out of a combined step that missed: its gain if the member left out
    # carries the whole miss (launched when that beats the noise band: the measurement tells whether it does)

    @property
    def gain(self) -> float:
        return self.estimate.change_pct if self.estimate.change_pct is not None else float("-inf")

    def label(self, plan: m.Plan) -> str:
        added = [f"{i} {plan.item(i).title}" for i in self.items]
        dropped = [f"without {i} {plan.item(i).title}" for i in self.reverts]
        return " + ".join(added + dropped)


def leave_one_out(method: Method, sur: Surrogate, others: list[str]) -> list[Candidate]:
    """For each combined step that missed its prediction (`missed`), the step without each of its members: on the
    best configuration when the step was not adopted, else the member taken back from the best. Probes: launched
    while the corrected model gives them a credible gain (launchable), so a dead or harmful member is found in at
    most as many launches as the step has members, fewer where the measurements already tell."""
    out: list[Candidate] = []
    held = sur.held(sur.best_config)
    active = method.active_items()
    for e, got, said in missed(method):
        members = [i for i in e.plan_items if i in method.plan.item_ids()]
        if probes_spent(method, e, members):
            continue
        whole = f"{'+'.join(members)} measured {_pct(got)} against {_pct(said)} predicted"
        for i in members:
            if set(members) <= held:  # adopted and still in the best: take the member back
                if i not in active or not probes.may_take_back(method, i):
                    continue
                items, reverts = (), (i,)
            else:
                items, reverts = tuple(x for x in members if x != i and x not in held), ()
                if not items:
                    continue
            est = sur.estimate(items, reverts)
            if est.source != "twin" or est.crash or est.change_pct is None:
                continue
            guilty = sur.if_guilty(est, i)
            if guilty is None:
                continue
            # grown, as the best step would be if the member left out is the one the twin has wrong: the open items
            # that add at least BUNDLE_MIN_PCT to it then (a probe is a launch: it may as well be the best one)
            for x in others:
                if x in members or x in held or x in items:
                    continue
                grown = sur.estimate(tuple((*items, x)), reverts)
                gain = sur.if_guilty(grown, i) if grown.source == "twin" and not grown.crash else None
                if gain is not None and gain >= guilty + BUNDLE_MIN_PCT:
                    est, items, guilty = grown, grown.items, gain
            kind: Literal["single", "combined", "retest", "revert"] = (
                "revert" if reverts else "combined" if len(items) > 1 else "single"
            )
            added = [x for x in items if x not in members]
            also = f" (and with {'+'.join(added)}, which then add to it)" if added else ""
            why = (
                f"leave-one-out of experiment {e.number} ({whole}): without {i}{also}: {est.note}; "
                f"{_pct(guilty)} if {i} is what the twin has wrong"
            )
            out.append(Candidate(items, est, kind, {}, why, reverts=reverts, probe=guilty))
    return out


def launchable(c: Candidate, band: float) -> bool:
    """Whether a twin-ranked candidate is worth a launch: its corrected gain beats the noise band, or it is a
    probe that would beat it if the member it leaves out is the one the twin has wrong."""
    if c.estimate.source != "twin" or c.estimate.crash:
        return False
    return c.gain >= band or (c.probe is not None and c.probe >= band)


def measured(method: Method, config: m.ServerConfig, workload: m.BenchSpec | None = None) -> m.Experiment | None:
    """An experiment that already ran `config` on `workload` (Method.ran)."""
    return method.ran(config, workload)


def pool(method: Method, d: Decision) -> tuple[list[m.PlanItem], list[m.PlanItem]]:
    """(undone items, items worth predicting again) of the opened tiers that the search ranks."""
    best = method.best()
    fresh, again = [], []
    unresolved = suspects(method) if method.settings.search else set()
    for item in method.plan.items:
        if item.tier not in d.released or not searchable(item):
            continue
        if not method.done(item):
            fresh.append(item)
            continue
        last = method.final(item)[-1]
        if last.verdict == "predicted" or (last.verdict == "no_gain" and checked(method, last)):
            again.append(item)  # never launched, or measured as the twin said: a candidate in combinations
            continue
        if last.verdict not in RETEST_VERDICTS or best is None:
            continue
        if last.base_experiment_id == best.id and item.id not in unresolved:
            continue
        if own_launches(method, item.id) > RETESTS:  # retests by evidence: launches inside bundles do not count
            continue
        if not probes.item_changes(method, item):
            continue
        again.append(item)
    return fresh, again


def _reverts(method: Method, sur: Surrogate) -> list[Candidate]:
    """Adopted items the corrected twin predicts the best configuration is better without (beyond nothing yet: the
    caller keeps those beyond the band)."""
    out = []
    for item_id in method.active_items():
        if item_id not in method.plan.item_ids() or not probes.may_take_back(method, item_id):
            continue
        est = sur.estimate((), (item_id,))
        if est.source != "twin" or est.crash or est.change_pct is None:
            continue
        why = f"{revert_text(method, item_id)}: without it {est.note}"
        out.append(Candidate((), est, "revert", {}, why, reverts=(item_id,)))
    return out


def _swaps(method: Method, sur: Surrogate, ranked: list[Candidate]) -> list[Candidate]:
    """The best candidates launched with an adopted item taken back, where the twin predicts that item becomes a
    brake with them (the candidate gains at least MEMBER_MIN_PCT more without it): one launch instead of two."""
    active = [i for i in method.active_items() if i in method.plan.item_ids() and probes.may_take_back(method, i)]
    out = []
    top = [c for c in ranked if c.estimate.source == "twin" and not c.reverts and c.kind != "revert"][:SWAP_SEEDS]
    for c in top:
        for item_id in active:
            if item_id in c.items:
                continue
            est = sur.estimate(c.items, (item_id,))
            if est.source != "twin" or est.crash or est.change_pct is None or est.change_pct < c.gain + MEMBER_MIN_PCT:
                continue
            why = f"{revert_text(method, item_id, c.items)}: {c.label(method.plan)} without it: {est.note}"
            out.append(Candidate(c.items, est, "revert", dict(c.alone), why, reverts=(item_id,)))
    return out


def candidates(method: Method, d: Decision, surrogate: Surrogate | None = None) -> list[Candidate]:
    """Every candidate of the opened tiers, best predicted gain first (see the module docstring); none whose
    configuration was already measured."""
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
        kind: Literal["single", "combined", "retest", "revert"] = "retest" if it.id in retest else "single"
        why = est.note
        if kind == "retest":
            last = method.final(it)[-1]
            why = (
                f"retest of {it.id} on the new best (experiment {sur.best.number if sur.best else '?'}): "
                f"{reports.VERDICT_WORDS[last.verdict]} on top of experiment {method.number(last.base_experiment_id)}; "
                f"{est.note}"
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
    out += _reverts(method, sur)
    out += _swaps(method, sur, sorted(out, key=lambda c: -c.gain))
    by_gain = sorted(modelled, key=lambda i: -(alone[i].change_pct or 0))
    contend = [Candidate(add, sur.estimate(add, (i,)), "revert", {}, why, reverts=(i,), probe=back)
               for add, i, back, why in probes.contention(method, sur.estimate, band)]  # fmt: skip
    for probe in [*leave_one_out(method, sur, by_gain), *contend]:
        same = next((c for c in out if (c.items, c.reverts) == (probe.items, probe.reverts)), None)
        if same is None:
            out.append(probe)
        else:
            same.probe, same.why = probe.probe, probe.why
    out = [c for c in out if measured(method, c.estimate.config) is None]
    out.sort(key=lambda c: (-c.gain, len(c.items) + len(c.reverts), c.items, c.reverts))
    return out


# ---- the steps


def ranked_steps(method: Method, d: Decision, validate) -> list[Step]:
    """The search's steps in the opened tiers, in the order it would take them: items the engine refuses or ignores
    ruled out; candidates predicted beyond the noise band; items the twin says crash but the plan expects much of;
    items predicted inside the band (recorded as predicted); items ranked by the plan's expected impact; with nothing
    else left, the check of the twin's unmeasured claims. `validate` is the engine's audit. Empty with the search
    off."""
    if not method.settings.search:
        return []

    fresh, again = pool(method, d)
    out = audit_steps(method, fresh, validate)
    settled = {s.items[0] for s in out}
    fresh = [it for it in fresh if it.id not in settled]
    sur = Surrogate(method)
    band = method.band_pct()
    ranked = candidates(method, d, sur)
    out += [Step("launch", c.items, c.why, c, c.reverts) for c in ranked if launchable(c, band)]
    for item in fresh:
        est = sur.estimate((item.id,))
        if est.crash and promising(method, item) and measured(method, est.config) is None:
            c = Candidate(
                (item.id,),
                est,
                "single",
                {item.id: None},
                f"{est.note}; the plan expects a large gain: measured anyway",
            )
            out.append(Step("launch", (item.id,), c.why, c))
    launching = {i for s in out if s.action == "launch" for i in s.items}
    for item in fresh:
        est = sur.estimate((item.id,))
        if est.source != "twin" or not (est.known or est.crash) or item.id in launching:
            continue
        out.append(Step("predicted", (item.id,), _predicted_reason(method, validate, item, est, band), Candidate(
            (item.id,), est, "single", {item.id: est.change_pct})))  # fmt: skip
    out += [
        Step("launch", c.items, c.why, c)
        for c in ranked
        if c.estimate.source == "plan" and not method.done(method.plan.item(c.items[0]))
    ]
    last_tier = {it.tier for it in method.plan.items} <= d.released  # the combinations across tiers were tried first
    return out or (_end_checks(method, sur, again, band) if last_tier else [])


def _end_checks(method: Method, sur: Surrogate, again: list[m.PlanItem], band: float) -> list[Step]:
    """With nothing else left, one launch checks the twin's word alone (tools/probes.py: end_check)."""

    def blame(i: str) -> tuple[float, float]:  # the corrected change of putting a reverted item back alone
        est = sur.estimate((i,))
        return est.change_pct if est.change_pct is not None else float("inf"), est.sd_pct or 0.0

    check = probes.end_check(method, sur.estimate, blame, again, band)
    if check is None:
        return []
    items, reverts, why = check
    est = sur.estimate(items, reverts)
    kind: Literal["single", "combined", "retest", "revert"] = (
        "revert" if reverts else "combined" if len(items) > 1 else "single"
    )
    return [Step("launch", items, why, Candidate(items, est, kind, {}, why, reverts=reverts), reverts)]


def _predicted_reason(method: Method, validate, item: m.PlanItem, est: Estimate, band: float) -> str:
    what = (
        f"{_pct(est.change_pct or 0)}, inside the {band:.1f}% noise band"
        if est.known and (est.change_pct or 0) > -band
        else f"a loss ({_pct(est.change_pct or 0)})"
        if est.known
        else "a crash"
    )
    noops = [i.flag for i in item_issues(method, validate, item) if i.status == "noop"]
    noop = (
        f" ({', '.join(noops)} {'is' if len(noops) == 1 else 'are'} accepted but read nowhere: no-op)" if noops else ""
    )
    return (
        f"not launched: predicted {what}: {est.note}{noop}. A prediction, not a measurement; name the item at a "
        "pivot to measure it"
    )


def next_step(method: Method, d: Decision, validate) -> Step | None:
    """The search's first step (None when it has nothing)."""
    steps = ranked_steps(method, d, validate)
    return steps[0] if steps else None


def independent(method: Method, steps: list[Step], limit: int) -> list[Step]:
    """The first step and, when it is a launch, up to `limit` launches in all that do not depend on each other's
    outcome: the candidates the twin cannot rank against the first (predicted within the noise band of its gain, so
    only a measurement tells them apart; or, unpredictable, ranked by the plan), on the same best configuration, no
    item in two of them. An executor runs them at once (`--parallel`); the method judges them when all are in. A
    candidate the twin ranks clearly below the first is left for a later step (it would most likely be superseded),
    a revert goes alone, and a step that is not a launch (a rule-out, a prediction) comes alone."""
    if not steps:
        return []
    first = steps[0]
    if first.action != "launch" or limit <= 1 or first.candidate is None or first.reverts:
        return [first]
    out = [first]
    used = set(first.items)
    band = method.band_pct()
    source = first.candidate.estimate.source
    for st in steps[1:]:
        c = st.candidate
        if len(out) >= limit:
            break
        if st.action != "launch" or c is None or st.reverts or used & set(st.items) or c.estimate.source != source:
            continue
        if c.estimate.crash or (source == "twin" and (c.gain < band or c.gain < first.candidate.gain - band)):
            continue
        out.append(st)
        used |= set(st.items)
    return out


def next_steps(method: Method, d: Decision, validate, limit: int) -> list[Step]:
    """The search's next step and the launches beside it that do not depend on its outcome (see `independent`)."""
    return independent(method, ranked_steps(method, d, validate), limit)


def record_fields(
    method: Method,
    items: list[str],
    baseline: bool = False,
    config: m.ServerConfig | None = None,
    reverts: list[str] | None = None,
) -> dict[str, object]:
    """The prediction to record on a new experiment (fields of m.Experiment): empty when there is none."""
    try:
        sur = Surrogate(method)
        if baseline:
            top = max(sur.workload.concurrency)
            if sur.predictor is None:
                return {}
            _, v = sur.objective.predict(sur.predictor, method.base_config(), sur.workload, top)
            if v is None:
                return {}
            return {
                "predicted_tok_s": v,
                "prediction": f"the twin predicts {sur.objective.number(v)} {sur.objective.at(top)} (uncorrected: "
                "the baseline is what corrects it)",
            }
        if not all(i in method.plan.item_ids() for i in [*items, *(reverts or [])]) or not (items or reverts):
            return {}
        if reverts:
            est = sur.estimate(tuple(items), tuple(reverts))
        else:
            est = sur.estimate_config(tuple(items), config) if config is not None else sur.estimate(tuple(items))
    except Interrupted:  # pivot got a signal (the twin's prediction stopped): the step is not recorded without it
        raise
    except Exception:
        return {}
    if est.source == "none" and not est.note:
        return {}
    return {
        "predicted_tok_s": est.tok_s,
        "predicted_change_pct": est.change_pct if est.source == "twin" else None,
        "prediction": est.note or None,
    }
