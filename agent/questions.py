"""The autopilot's words at a pivot: the question for the pivot the method's moves owe (its kind and facts) and
the options they offer (tools/method/offers.py), with `stop` last. An LLM writes its own; the method only checks
that a question is one the user can answer."""

from __future__ import annotations

from agent import models as m
from tools.method import BENCHMARK_REFUSED, Moves, understood

STOP = "stop: write the final summary and end the campaign"


def headline(moves: Moves) -> str:
    """The best so far in one sentence, with its gain over the baseline."""
    method = moves.method
    best, base = method.best(), method.baseline()
    if best is None or base is None:
        return ""
    jb = method.judge(best)
    if jb.after_tok_s is None:
        return ""
    gain = ""
    jbase = method.judge(base)
    if best.id != base.id and jbase.after_tok_s:
        gain = f", {(jb.after_tok_s - jbase.after_tok_s) / jbase.after_tok_s * 100:+.1f}% over the baseline"
    obj = method.objective
    return f"Best so far: {obj.number(jb.after_tok_s)} {obj.at(jb.concurrency or 0)} (experiment {best.number}{gain})."


def question(moves: Moves) -> tuple[str, list[str]]:
    """(question, options) for the pivot the moves owe."""
    due = moves.pivot
    assert due is not None, "no pivot is owed"
    method, plan, d = moves.method, moves.method.plan, moves.decision
    head = headline(moves)
    options = [sentence for _, sentence in moves.offers]
    if due.kind == "clarify":
        p = d.unclear or next((p for p in reversed(method.pivots) if p.answer is not None), None)
        last_options = p.options if p is not None else []
        how = understood(last_options, plan)
        asked = p.question.split(f"{how} ", 1)[-1] if p is not None else "Which way next?"
        why = d.why_unclear if d.unclear is not None else due.why
        options = last_options or ["continue: go on with the plan", STOP]
        return " ".join(f"{why} {how} {asked}".split()), options
    e = method.experiment(due.experiment_id)
    if due.kind in ("baseline", "benchmark"):
        return _failed(moves, e)
    if due.kind == "objective" and e is not None:
        return _unmet(moves, e)
    if due.kind == "crash" and e is not None:
        item = plan.item(e.plan_item) if e.plan_item in plan.item_ids() else None
        what = f"{item.id} {item.title}" if item else f"experiment {e.number}"
        expected = item.expected_impact.strip().rstrip(".") if item else "a gain"
        q = f"{what} crashed (experiment {e.number}: {e.reason}) although the plan expected {expected}. {head} How should pivot go on?"
    elif due.kind == "stall":
        q = (
            f"The last {method.settings.stall_after} changes gave no gain beyond the {method.band_pct():.1f}% noise "
            f"band. {head} How should pivot go on?"
        )
    elif due.kind == "requested":
        asked = ", ".join(dict.fromkeys(i for i, _ in d.asked()))
        q = f"What you asked for is done ({asked or 'the items you named'}). {head} Which way next?"
    else:
        names = ", ".join(f"Tier {t} ({plan.tiers[t]})" if plan.tiers.get(t) else f"Tier {t}" for t in due.closes[-1:])
        q = f"{names or 'The items you opened'} done. {head} Which way next?"
    if _closing(moves):
        q += _noise_note(moves)
    return " ".join(q.split()), [*options, STOP]


def _closing(moves: Moves) -> bool:
    return moves.pivot is not None and bool(moves.pivot.closes)


def _noise_note(moves: Moves) -> str:
    """What the noise band can tell apart, when it is wide (it is in every summary too)."""
    method = moves.method
    band, floor = method.band_pct(), method.settings.min_gain_pct
    if band <= floor * 1.5:
        return ""
    return f" (The noise band is {band:.1f}%: changes smaller than that cannot be told apart from noise.)"


def _unmet(moves: Moves, e: m.Experiment) -> tuple[str, list[str]]:
    """The question after a baseline that meets the objective nowhere: its value per level, and what to change."""
    from tools.method.words import unmet_words

    method = moves.method
    q = (
        f"The baseline (experiment {e.number}) gives 0 for the objective, {method.objective.at(max(method.ok_values(e)))}"
        f"; {unmet_words(method, e)}. Every change would be judged against zero, and one that keeps it at zero cannot "
        "be told from another. Loosen the SLOs in the plan's [objective] (or give the workload levels that can meet "
        f"them) and resume with `pivot resume {method.record.id} --plan FILE --answer continue`, or answer 'continue' "
        "to judge the changes as they are: a change then counts when it brings requests within the SLOs."
    )
    options = ["continue: judge the changes against this baseline as it is", "stop: end the campaign"]
    return " ".join(q.split()), options


def _failed(moves: Moves, e: m.Experiment | None) -> tuple[str, list[str]]:
    """The question after a baseline that did not run, or a benchmark the server refused."""
    method = moves.method
    why = (
        (e.failure or "unknown") + (f": {e.failure_detail}" if e is not None and e.failure_detail else "")
        if e
        else "unknown"
    )
    if e is not None and e.failure in BENCHMARK_REFUSED:
        w = e.workload
        q = (
            f"The server refused the benchmark's requests (experiment {e.number}, {why}). The workload (input "
            f"{w.random_input_len} / output {w.random_output_len} tokens, {w.dataset_name}) does not fit what the "
            "server accepts: fix the plan's [workload] (or the server's limits in its flags), then resume with "
            f"--plan FILE --answer continue, or answer 'continue' to try it again as it is."
        )
        options = [
            f"continue: run experiment {e.number}'s benchmark again (after `pivot resume {method.record.id} --plan FILE` "
            "with the workload fixed)",
            "stop: end the campaign",
        ]
        return " ".join(q.split()), options
    q = (
        f"The baseline did not start ({why}), and nothing can be compared without it. Fix what stops it "
        "(the plan's base flags, the engine's installation or options), then answer 'continue' to try again."
    )
    return " ".join(q.split()), ["continue: try the baseline again", "stop: end the campaign"]
