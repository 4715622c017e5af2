"""What a pivot can offer besides `stop`: going on (the rest of the tier, or the next tier), the bounded retry of an
item that crashed under load, and the search's next candidates with what they cost and what the twin predicts.

A pivot with nothing here to offer is not asked at the end of the last tier: the campaign is finished instead.
"""

from __future__ import annotations

from agent import models as m
from agent.errors import PivotError
from agent.session import Session
from tools import reports, search
from tools.method.answers import Decision
from tools.method.reading import Method


def offers(
    session: Session, method: Method, d: Decision, closes: tuple[int, ...], crashed: m.Experiment | None = None
) -> list[tuple[str, str]]:
    """(answer text, sentence) for each option a pivot asked now would offer besides stop."""
    plan = method.plan
    out: list[tuple[str, str]] = []
    tiers = sorted({it.tier for it in plan.items})
    later = [t for t in tiers if t not in d.released]
    going_on = d.open - set(closes)
    undone = [it for it in plan.items if it.tier in going_on and not method.done(it) and it.kind != "code"]
    searched = method.settings.search
    predictor = search.predictor_for(method) if searched else None
    if undone:
        rest = ", ".join(f"{it.id} {it.title}" for it in undone[:4])
        how = (
            "the search predicts each on the best configuration and launches what beats the noise band"
            if predictor is not None
            else "one at a time on the best configuration"
        )
        out.append(("continue", f"continue: the remaining items of this tier ({rest}); {how}"))
    elif later and (not going_on or max(d.released) in closes):
        t = later[0]
        items = ", ".join(f"{it.id} {it.title}" for it in plan.tier_items(t))
        code = all(it.kind == "code" for it in plan.tier_items(t))
        note = " (code changes for you: documented, nothing to run; then the final summary)" if code else ""
        if searched and not code and predictor is None:
            note = f"; {search.no_predictor_text(method)}"
        elif searched and not code:
            ahead = launchable(method, Decision(released={*d.released, t}))
            note = (
                f"; the search's first step there: {ahead[0][1]}"
                if ahead
                else "; the twin predicts none of them beyond the noise band alone or combined: what it predicts is "
                "recorded as predicted, the rest is measured"
            )
        out.append(("continue", f"continue: Tier {t} ({plan.tiers.get(t, 'next')}): {items}{note}"))
    if crashed is not None and (retry := retry_offer(method, crashed)) is not None:
        out.append(retry)
    if searched:
        opened = Decision(released={*d.released, *later[:1]})
        for head, sentence in search_options(method, opened, limit=3):
            if len(out) >= 4:
                break
            if not any(o[1].startswith(head) for o in out):
                out.append((head, sentence))
    else:
        ranked = sorted(
            (it for it in plan.items if it.kind != "code" and not method.done(it) and it not in undone[:1]),
            key=lambda it: -abs(e.midpoint_pct) if (e := reports.parse_expectation(it.expected_impact)) else 0.0,
        )
        for it in ranked[:2]:
            head = f"{it.id} {it.title}: test it next"
            out.append((head, f"{head} ({it.expected_impact.strip().rstrip('.')})"))
    return out


def retry_offer(method: Method, crashed: m.Experiment) -> tuple[str, str] | None:
    """After a crash under load: the item again with max running requests capped at the last level that held
    (once per item), with what the twin predicts for it."""
    if crashed.combined or crashed.plan_item is None or search.launches(method, crashed.plan_item) > 1:
        return None
    held = sorted(c for c, runs in method.ok_values(crashed).items() if runs)
    if not held or not method.failed_levels(crashed):
        return None
    cap = held[-1]
    flag = f"--max-running-requests {cap}"
    item = method.plan.item(crashed.plan_item)
    pred = ""
    try:
        sur = search.Surrogate(method)
        config = item.apply(method.best_config()).with_flags(m.ServerConfig.parse(flag))
        est = sur.estimate_config((item.id,), config)
        pred = f"; {est.note}" if est.note else ""
    except Exception:
        pred = ""
    head = f"retry {item.id} {item.title} with {flag}"
    return head, (
        f"{head} (capped at concurrency {cap}, the last level that held in experiment {crashed.number}): 1 launch, 2 if it "
        f"gains{pred}"
    )


# ---- the search's candidates as options


def search_options(method: Method, d: Decision, limit: int = 3) -> list[tuple[str, str]]:
    """The search's next candidates in the opened tiers as pivot options: (answer text, sentence)."""
    if not method.settings.search:
        return []
    return [option_text(method, c) for c in _worth(method, d)[:limit]]


def launchable(method: Method, d: Decision) -> list[tuple[str, str]]:
    """The option for the first candidate the search would launch (predicted beyond the noise band), if any."""
    band = method.band_pct()
    worth = [c for c in _worth(method, d) if c.gain >= band or c.estimate.source == "plan"]
    return [option_text(method, c) for c in worth[:1]]


def _worth(method: Method, d: Decision) -> list[search.Candidate]:
    try:
        ranked = search.candidates(method, d)
    except PivotError:
        return []
    return [c for c in ranked if c.estimate.source == "plan" or c.gain >= 0.1]


def option_text(method: Method, c: search.Candidate) -> tuple[str, str]:
    plan = method.plan
    cost = "1 launch, 2 if it gains (a second run confirms or rejects a gain)"
    if c.kind == "revert" and c.items:
        item = c.reverts[0]
        head = f"test {'+'.join(c.items)} and drop {item}"
        what = f"{c.label(plan)}: the best configuration rebuilt without {item}, with the items on top"
    elif c.kind == "revert":
        item = c.reverts[0]
        head = f"drop {item} {plan.item(item).title}: take it back"
        what = "the best configuration rebuilt from its adopted changes without it"
    elif c.kind == "combined":
        head = f"test {'+'.join(c.items)} together"
        what = f"one experiment combining {c.label(plan)}"
    elif c.kind == "retest":
        head = f"{c.items[0]} {plan.item(c.items[0]).title}: retest it on the new best"
        what = "the item again on top of the best configuration"
    else:
        head = f"{c.items[0]} {plan.item(c.items[0]).title}: test it next"
        what = "the item on top of the best configuration"
    best = method.best()
    on = f" on the best now (experiment {best.number})" if best is not None else ""
    pred = (
        f"the twin predicts {f'{c.estimate.change_pct:+.1f}%'}{on}"
        if c.estimate.source == "twin" and c.estimate.change_pct is not None
        else c.estimate.note
    )
    return head, f"{head}: runs {what}; {cost}; {pred}"
