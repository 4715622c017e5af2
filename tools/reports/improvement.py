"""Improvement documents: `NN-slug.md`, one per plan item, rebuilt from the ledger."""

from __future__ import annotations

from agent import models as m
from agent.errors import PivotError
from tools.reports.common import CHANGE_FORMULA, IMPROVEMENT_HEADINGS, VERDICT_WORDS, SessionLike
from tools.reports.expectations import Expectation, parse_expectation
from tools.reports.ledger import Ledger, _items
from tools.reports.text import _change, _inline_code, _joules, _ms, _signed, _table, _tok, check_document, slug
from tools.reports.writing import _write


def item_status(ledger: Ledger, item: m.PlanItem) -> tuple[str, list[m.Experiment]]:
    """The item's status in words, and its experiments (oldest first)."""
    exps = ledger.item_experiments(item.id)
    if item.kind == "code":
        return "documented: a code change for you to make", exps
    if not exps:
        return "proposed", exps
    last = exps[-1]
    back = ledger.taken_back(item.id)
    if back is not None and last.verdict == "adopted" and (back.id or 0) > (last.id or 0):
        why = back.revert_why or "a later change made it a brake"
        return f"adopted, then taken back (experiment #{back.number}: {why})", exps
    together = f" (together with {', '.join(i for i in last.plan_items if i != item.id)})" if last.combined else ""
    if last.verdict == "predicted":
        return "not launched: the twin predicts no gain", exps
    if last.verdict == "not_measured":
        return "not measured: the twin does not model it (for a GPU)", exps
    if last.verdict is not None:
        return f"tested{together}: {VERDICT_WORDS[last.verdict]}", exps
    if last.status in ("planned", "running"):
        return "testing", exps
    if last.status == "failed":
        return f"failed: {last.failure or 'see the reason'}", exps
    return "tested: not judged yet", exps


def _expected_comparison(
    exp: Expectation | None, before: dict[int, m.BenchLevel], after: dict[int, m.BenchLevel]
) -> str:
    if exp is None:
        return "The expected impact gives no number to compare with."
    common = sorted(set(before) & set(after))
    if not common:
        return "No level was measured both before and after, so there is nothing to compare."
    if exp.levels is not None:
        chosen = [c for c in common if exp.levels[0] <= c <= exp.levels[1]]
    elif exp.where == "low":
        chosen = common[:1]
    else:
        chosen = common[-1:]
    if not chosen:
        chosen = common[-1:]
    parts, verdicts = [], []
    for c in chosen:
        b, a = getattr(before[c], exp.metric, None), getattr(after[c], exp.metric, None)  # capacity: not a level's
        pct = _change(b, a) if b is not None and a is not None else None
        if pct is None:
            continue
        parts.append(f"{_signed(pct)} at concurrency {c}")
        if pct < exp.low_pct:
            verdicts.append("below")
        elif pct > exp.high_pct:
            verdicts.append("above")
        else:
            verdicts.append("within")
    if not parts:
        return "The change could not be computed (a zero before)."
    words = {"below": "below the expected range", "above": "above the expected range", "within": "within it"}
    summary = words[verdicts[0]] if len(set(verdicts)) == 1 else "partly within it"
    return (
        f"Expected {exp.low_pct:+g}% to {exp.high_pct:+g}% {exp.metric_words}; measured {', '.join(parts)}: {summary}."
    )


def render_improvement(ledger: Ledger, item: m.PlanItem) -> tuple[str, str, list[int]]:
    """(markdown, status, experiment ids) of one plan item's improvement document."""
    plan = ledger.plan
    status, exps = item_status(ledger, item)
    tier = f"{item.tier} ({plan.tiers[item.tier]})" if item.tier in plan.tiers else str(item.tier)
    ids = [e.id for e in exps if e.id is not None]
    rows = [
        ["Plan", f"{plan.name}, session {ledger.record.id}"],
        ["Tier", tier],
        ["Kind", item.kind],
        ["Status", status],
        ["Experiments", ", ".join(f"#{e.number}" for e in exps if e.id is not None) or "none yet"],
    ]
    out = [f"# {item.id} {item.title}", "", _table(["field", "value"], rows), ""]
    out += ["## Rationale", "", item.hypothesis.strip(), ""]
    out += ["## Expected impact", "", item.expected_impact.strip(), ""]
    out += ["## Implementation", ""]
    tested = exps[-1] if exps else None
    if item.kind == "code":
        out += [
            "A code change for you to make; pivot documents it and does not run or simulate it, so it gets no "
            "measured gain here.",
            "",
            item.change.strip() if item.change else "",
            "",
        ]
    elif item.kind == "profile":
        out += [
            "A measurement of the best configuration, not a change: profile it under load and attribute GPU time.",
            "",
        ]
    elif item.kind == "workload":
        out += [
            "Benchmark workload overrides: " + ", ".join(f"{k} = {v}" for k, v in (item.workload or {}).items()),
            "",
        ]
    if item.flags is not None or item.remove_flags:
        flags = str(item.flags) if item.flags is not None else ""
        removed = " ".join(f"(remove {f})" for f in item.remove_flags)
        out += [
            "Flags set on top of the best configuration so far, as the plan writes them:",
            "",
            "```",
            f"{flags} {removed}".strip(),
            "```",
            "",
        ]
    if tested is not None and item.kind != "code":
        engine = ledger.plan.target.engine
        out += [
            f"Command line of experiment #{tested.number}:",
            "",
            "```",
            tested.config.command_line([engine, "serve"]),
            "```",
            "",
        ]
        argv = ledger.launched.get(tested.id or 0)
        if argv and ledger.record.engine != "sim":  # the twin's own argv is pivot's, not a line for the user
            line = tested.config.model_copy(update={"flags": []}).command_line(argv)
            if line != out[-3]:
                out += ["As pivot launched it:", "", "```", line, "```", ""]
        if tested.audit:
            out += [
                f"Flag audit against {engine} {plan.target.engine_version or ''}".rstrip() + ":",
                "",
                _table(["flag", "status", "what it means"], [[i.flag, i.status, i.message] for i in tested.audit]),
                "",
            ]
    out += ["## Risks", "", item.risks.strip() or "None noted in the plan.", ""]
    claims = [f for f in ledger.findings if f.kind == "claim" and f.plan_item == item.id]
    if claims:
        out += ["## Plan check", ""]
        out += [f"- {f.severity}: {f.text}" for f in claims] + [""]
    out += ["## Status", "", _status_sentence(item, status, tested), ""]
    if tested is not None and item.kind != "code":
        out += _result_section(ledger, item, tested)
    return "\n".join(out).rstrip() + "\n", status, ids


def _status_sentence(item: m.PlanItem, status: str, tested: m.Experiment | None) -> str:
    """The item's status once, with the experiment it rests on; a reason that would repeat the status is left to
    the Result section, which gives it whole."""
    if item.kind == "code":
        return "Documented. This is a change for you to make in the code; pivot will measure it once it is deployed."
    if tested is None:
        return "Proposed: not tested yet."
    text = f"{status[0].upper()}{status[1:]} (experiment #{tested.number})."
    if tested.reason and tested.verdict not in ("predicted", "ruled_out", "not_measured"):
        text += f" {tested.reason}"
    elif tested.verdict in ("predicted", "ruled_out", "not_measured"):
        text += " The Result section says why."
    return text


def _result_section(ledger: Ledger, item: m.PlanItem, e: m.Experiment) -> list[str]:
    out = ["## Result", ""]
    base = ledger.base_of(e)
    after = ledger.ok_levels(e)
    every = ledger.levels.get(e.id or 0, {})
    source = ledger.sources.get(e.id or 0)
    if e.combined:
        others = ", ".join(f"{i} {ledger.plan.item(i).title}" for i in e.plan_items if i != item.id)
        out += [
            f"Experiment #{e.number} tested this item together with {others} as one step ({_items(e)}): the result "
            "below is the combination's, not this item's alone.",
            "",
        ]
    out += _predictions(ledger, item, e)
    if e.verdict in ("predicted", "ruled_out") and not every and e.status != "failed":
        why = (e.reason or VERDICT_WORDS[e.verdict]).removeprefix("not launched: ")
        out += [f"Experiment #{e.number} was not launched: {why}", ""]
        return out
    if e.status == "failed" and not every:
        out += [f"Experiment #{e.number} did not run: {e.failure or 'failed'}. {e.reason or ''}".strip()]
        if e.log_path:
            out += ["", f"Server log: {_inline_code(e.log_path)}"]
        return [*out, ""]
    if e.verdict == "not_measured":
        ran = (
            f" The twin ran experiment #{e.number}, but its numbers leave this change out, so they are not a result."
            if every
            else " No launch was spent on it."
        )
        out += [f"Verdict: **{VERDICT_WORDS[e.verdict]}**. Not measured: {ledger.not_measured_text(e)}.{ran}", ""]
        return out
    if item.kind == "profile":
        lines = [f for f in ledger.findings if f.experiment_id == e.id and "profile" in f.text.lower()]
        out += [f"- {f.text}" for f in lines] or ["No profile was recorded for this experiment."]
        return [*out, ""]
    before = ledger.ok_levels(base) if base else {}
    levels = sorted(set(every) | set(before))
    if not levels:  # launched, but nothing measured yet (cut short, or still running)
        return [*out, f"Experiment #{e.number} has no measured level yet ({e.status}).", ""]
    rows = []
    for c in levels:
        b, a = before.get(c), every.get(c)
        failed = a is not None and (a.failed > 0 or a.completed == 0)
        rows.append(
            [
                c,
                _tok(b.output_throughput) if b else "",
                _tok(a.output_throughput) if a and not failed else f"{a.failed} failed" if a else "",
                _signed(_change(b.output_throughput, a.output_throughput)) if a and b and not failed else "",
                _ms(b.mean_tpot_ms) if b else "",
                _ms(a.mean_tpot_ms) if a and not failed else "",
                _signed(_change(b.mean_tpot_ms, a.mean_tpot_ms)) if a and b and not failed else "",
                _joules(ledger.energy(base, c)[1]) if b and base else "",
                _joules(ledger.energy(e, c)[1]) if a and not failed else "",
            ]
        )
    b_id = f"#{base.number}" if base else "none"
    header = [
        "concurrency",
        f"output tok/s before ({b_id})",
        f"after (#{e.number})",
        "change",
        f"mean TPOT ms before ({b_id})",
        f"after (#{e.number})",
        "change",
        f"J per output token before ({b_id})",
        f"after (#{e.number})",
    ]
    if source == "simulated":
        out += ["Simulated by pivot's digital twin of SGLang, not measured on GPUs.", ""]
    out += [_table(header, rows, ["r"] * 9), "", f"Formula: {CHANGE_FORMULA}.", ""]
    out += [f"Verdict: **{VERDICT_WORDS[e.verdict]}**" + (f". {e.reason}" if e.reason else "."), ""]
    if base is not None and e.combined:  # one item's expected range says nothing of a combination's change
        out += [
            f"Not compared with this item's expected impact ({item.expected_impact.strip().rstrip('.')}): the change "
            f"above is the combination's ({_items(e)}), not this item's alone.",
            "",
        ]
    elif base is not None:
        out += [_expected_comparison(parse_expectation(item.expected_impact), before, after), ""]
    crashed = [c for c, lv in every.items() if lv.failed > 0]
    if crashed:
        errors = sorted({err for c in crashed for err in every[c].errors})
        out += [f"Failed requests at concurrency {', '.join(map(str, sorted(crashed)))}: {'; '.join(errors[:3])}.", ""]
    return out


def _predictions(ledger: Ledger, item: m.PlanItem, e: m.Experiment) -> list[str]:
    """The search's prediction for `e`, saying what it was made against; and, when the item was predicted before on
    another best, that earlier prediction named as an earlier one (so two numbers on a page never compete)."""
    out: list[str] = []
    if e.prediction and e.verdict != "predicted":  # a predicted experiment's reason gives its prediction whole
        out += [f"Before the launch of experiment #{e.number}, the search's prediction: {e.prediction}.", ""]
    earlier = [x for x in ledger.item_experiments(item.id) if x.id != e.id and x.predicted_change_pct is not None]
    for x in earlier:
        against = ledger.number(x.base_experiment_id)
        out += [
            f"Earlier, on experiment #{against} (the best then), experiment #{x.number} had the prediction "
            f"{x.predicted_change_pct:+.1f}%; the one above (experiment #{e.number}, on experiment "
            f"#{ledger.number(e.base_experiment_id)}) is the current one.",
            "",
        ]
    return out


def write_improvement_docs(session: SessionLike) -> list[m.Document]:
    """Write (or rebuild) the improvement document of every plan item; returns their ledger records."""
    ledger = Ledger.read(session.store, session.id)
    known = {d.path: d for d in ledger.documents}
    out = []
    for item in ledger.plan.items:
        out.append(_write_improvement(session, ledger, item, known))
    return out


def write_improvement_doc(session: SessionLike, item_id: str) -> m.Document:
    """Write (or rebuild) one plan item's improvement document."""
    ledger = Ledger.read(session.store, session.id)
    return _write_improvement(session, ledger, ledger.plan.item(item_id), {d.path: d for d in ledger.documents})


def _write_improvement(
    session: SessionLike, ledger: Ledger, item: m.PlanItem, known: dict[str, m.Document]
) -> m.Document:
    text, status, ids = render_improvement(ledger, item)
    problems = check_document(text, IMPROVEMENT_HEADINGS + (("Result",) if "## Result" in text else ()))
    if problems:
        raise PivotError(f"improvement document {item.id} is malformed: {'; '.join(problems)}")
    path = session.paths.docs_dir(session.id) / f"{item.id}-{slug(item.title)}.md"
    doc = m.Document(
        session_id=session.id,
        kind="improvement",
        plan_item=item.id,
        title=f"{item.id} {item.title}",
        path="",
        status=status,
        sha256="",
        experiment_ids=ids,
    )
    return _write(session, path, text, doc, known)
