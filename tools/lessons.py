"""What a campaign concluded about the twin: the conclusions the status summary and `pivot show --json` state.

From the campaign's learnt model (tools/learn.py, read through the search's surrogate): the twin's error common to
every configuration on this target, and for each plan item the campaign measured, the effect the twin predicts for it
alone on the base configuration against the effect the measurements leave it (the same prediction, corrected), with
its interval and the experiments it rests on. An item whose corrected effect is inside the noise band where the twin
claimed more is "no effect on this target"; one that costs where the twin said neutral "costs N%"; an item whose
effect is still uncertain (measured only inside combined steps that cannot be told apart) is said to be so. Items
that contend (a step that fell short on a best holding an item, and the best without that item gaining beyond the
twin's word: tools/probes.py's contention checks) are stated as such: a sum of per-item terms cannot say it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

from tools import probes, search
from tools.fit import Fit, fit_target
from tools.method.reading import Method

Kind = Literal["no_effect", "costs", "smaller", "larger", "as_predicted", "unresolved"]


@dataclass
class ItemLesson:
    """One item: the twin's predicted effect alone on the base configuration and the corrected one, in %."""

    item: str
    title: str
    predicted_pct: float
    learnt_pct: float
    sd_pct: float
    experiments: list[int]
    kind: Kind

    def text(self) -> str:
        where = ", ".join(f"#{n}" for n in self.experiments)
        head = f"{self.item} {self.title}: predicted {self.predicted_pct:+.1f}%"
        measured = f"measured {self.learnt_pct:+.1f}% ± {2 * self.sd_pct:.1f}% (experiments {where})"
        if self.kind == "no_effect":
            return f"{head}, measured no effect (experiments {where}): no effect on this target"
        if self.kind == "costs":
            return f"{head}, {measured}: costs {-self.learnt_pct:.1f}% on this target"
        if self.kind in ("smaller", "larger"):
            return f"{head}, {measured}: {self.kind} than the twin says on this target"
        if self.kind == "unresolved":
            return (
                f"{head}; measured only together with other items (experiments {where}): not yet told apart, "
                f"{self.learnt_pct:+.1f}% ± {2 * self.sd_pct:.1f}%"
            )
        return f"{head}, {measured}: as predicted"


@dataclass
class Contention:
    """Items that cost together on this target what the twin does not say: a step that fell short on a best holding
    `item`, and the best without `item` gaining beyond the twin's prediction (tools/probes.py: contentions)."""

    step: list[str]
    item: str
    step_measured_pct: float
    step_predicted_pct: float
    without_measured_pct: float
    without_predicted_pct: float
    experiments: list[int]

    def text(self, titles: dict[str, str]) -> str:
        step = " + ".join(f"{i} {titles.get(i, '')}".strip() for i in self.step)
        return (
            f"{step} and {self.item} {titles.get(self.item, '')} contend on this target: {'+'.join(self.step)} measured "
            f"{self.step_measured_pct:+.1f}% against {self.step_predicted_pct:+.1f}% predicted on a best holding "
            f"{self.item}, and the best without {self.item} {self.without_measured_pct:+.1f}% against "
            f"{self.without_predicted_pct:+.1f}% (experiments {', '.join(f'#{n}' for n in self.experiments)}): the twin "
            "does not model what they cost together"
        )


@dataclass
class Lessons:
    """The campaign's conclusions about the twin at the judged level."""

    level: int
    observations: int
    common_pct: float  # the twin's error common to every configuration: measured / predicted - 1, in %
    common_sd_pct: float
    band_pct: float
    items: list[ItemLesson] = field(default_factory=list)
    contentions: list[Contention] = field(default_factory=list)
    titles: dict[str, str] = field(default_factory=dict, repr=False)

    def lines(self) -> list[str]:
        """The conclusions, one line each, for a summary."""
        n = self.observations
        if self.common_pct <= -self.band_pct / 2 or self.common_pct >= self.band_pct / 2:
            over = "over" if self.common_pct < 0 else "under"
            common = (
                f"The twin {over}-predicts this target by {abs(self.common_pct):.1f}% ± {2 * self.common_sd_pct:.1f}% "
                f"at concurrency {self.level} (fitted over {n} measured experiment{'s' if n != 1 else ''})."
            )
        else:
            common = (
                f"The twin's numbers for this target are within {abs(self.common_pct):.1f}% ± "
                f"{2 * self.common_sd_pct:.1f}% of what was measured at concurrency {self.level} ({n} experiment"
                f"{'s' if n != 1 else ''})."
            )
        wrong = [i for i in self.items if i.kind != "as_predicted"]
        right = [i for i in self.items if i.kind == "as_predicted"]
        out = [common, ""]
        tied = {i for c in self.contentions for i in (*c.step, c.item)}
        out += [f"- {i.text()}" + (" (read with the contention below: a per-item term carries part of it)"
                                    if i.item in tied else "") for i in wrong]  # fmt: skip
        out += [f"- {c.text(self.titles)}" for c in self.contentions]
        if right:
            out.append("- As the twin predicts: " + ", ".join(f"{i.item} {i.title}" for i in right) + ".")
        return out

    def as_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "titles"}


def lessons(method: Method) -> Lessons | None:
    """The campaign's conclusions about the twin (None without a twin, or before anything was measured)."""
    sur = search.Surrogate(method)
    if sur.predictor is None:
        return None
    belief = sur.belief()
    if not belief.observations:
        return None
    band = method.band_pct()
    base = method.base_config()
    _, b = sur.predicted(base)
    common, common_sd = belief.common
    out = Lessons(
        sur.level,
        len(belief.observations),
        (math.exp(common) - 1) * 100,
        math.exp(common) * common_sd * 100,
        band,
    )
    out.titles = {it.id: it.title for it in method.plan.items}
    for e, x, item_id in probes.contentions(method, band):
        got, without = method.judge(e).change_pct, method.judge(x).change_pct
        out.contentions.append(Contention(list(e.plan_items), item_id, got or 0.0, e.predicted_change_pct or 0.0,
                                          without or 0.0, x.predicted_change_pct or 0.0, [e.number, x.number]))  # fmt: skip
    if not b:
        return out
    for item in method.plan.items:
        held = belief.measured_items(item.id)
        if not held or not search.searchable(item):
            continue
        _, v = sur.predicted(item.apply(base))
        if not v:
            continue
        mean, sd = belief.item(item.id)
        twin = (v / b - 1) * 100
        learnt = (v / b * math.exp(mean) - 1) * 100
        sd_pct = v / b * math.exp(mean) * sd * 100
        alone = any(o.items == frozenset({item.id}) for o in held)
        kind: Kind
        if 2 * sd_pct >= band and not alone:
            kind = "unresolved"
        elif abs(learnt) < band and abs(twin) >= band:
            kind = "no_effect"
        elif learnt <= -band and twin > -band:
            kind = "costs"
        elif abs(learnt - twin) >= band:
            kind = "smaller" if learnt < twin else "larger"
        else:
            kind = "as_predicted"
        out.items.append(ItemLesson(item.id, item.title, twin, learnt, sd_pct, sorted(o.number for o in held), kind))
    return out


def fitted(method: Method) -> Fit | None:
    """The twin's per-target parameters fitted to the campaign's measured levels (tools/fit.py), for an engine
    whose predictor is the SGLang twin; None otherwise or before any measurement. Some seconds: every observed
    level is simulated (parameters + 1) x fit.ITERATIONS times."""
    from tools.engines.sim.predictor import TwinPredictor

    predictor = search.predictor_for(method)
    if not isinstance(predictor, TwinPredictor) or predictor.truth:
        return None
    return fit_target(method, predictor.model_profile, predictor.hardware, predictor.gpus)


def learnt_lines(session, fit: bool = False) -> list[str] | None:
    """What the campaign concluded about the twin, in lines for a status summary (write_status_summary's
    `learnt`), with the target's fitted parameters when `fit` or the session ranks by the fitted twin (`--fit-twin`;
    tools/fit.py: seconds of simulation); None without a twin, before any measurement, or when it cannot be worked
    out: the summary is then written without it (it never fails on what it adds; the rest rests on the ledger)."""
    from agent.errors import Interrupted

    try:
        method = Method.read(session.store, session.id)
        found = lessons(method)
        target = fitted(method) if (fit or method.settings.fit_twin) and found is not None else None
    except Interrupted:
        raise
    except Exception:
        return None
    if found is None:
        return None
    return found.lines() + (["", *target.lines()] if target is not None else [])
