"""Status summaries: `status-NNN.md` (Best results, What was tried, Ruled out, Root cause, Next steps, Question),
each section from its own function."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent import models as m
from agent.errors import PivotError
from agent.servers import fault_point
from tools.reports.common import (
    CHANGE_FORMULA,
    FINISHED_QUESTION,
    SET_ASIDE,
    STATUS_HEADINGS,
    VERDICT_WORDS,
    SessionLike,
)
from tools.reports.expectations import Expectation, next_steps
from tools.reports.html import write_status_html
from tools.reports.ledger import Ledger, _items, config_text, plan_warnings
from tools.reports.text import _change, _joules, _ms, _signed, _table, _tok, check_document
from tools.reports.writing import _write, latest_status_doc

# The "Best results" table: one row per concurrency level.
BEST_HEADER = ["concurrency", "output tok/s", "total tok/s", "peak output tok/s", "mean TTFT ms", "mean TPOT ms",
               "W per GPU", "J per output token", "experiment", "config", "source"]  # fmt: skip
BEST_ALIGN = ["r"] * 8 + ["l"] * 3


@dataclass
class Summary:
    """A rendered status summary: its markdown, its charts' data and what it rests on."""

    number: int
    markdown: str
    experiment_ids: list[int]
    question: str
    options: list[str]
    series: dict[str, Any] = field(default_factory=dict)


def summary_question(
    ledger: Ledger, number: int, steps: list[tuple[m.PlanItem, Expectation | None]]
) -> tuple[str, list[str]]:
    """The question a rebuilt summary ends on, from the ledger: the pivot that went with this summary (open or
    answered: what was asked is what the file says), else the open pivot, else a finished campaign's own words,
    else a question built from the next steps that pivot can run (a code item is the user's to make)."""
    name = f"status-{number:03d}.md"
    asked = [p for p in ledger.pivots if p.summary_path and p.summary_path.rsplit("/", 1)[-1] == name]
    if asked:
        return asked[-1].question, asked[-1].options
    open_ = [p for p in ledger.pivots if p.open]
    if open_:
        return open_[-1].question, open_[-1].options
    if ledger.record.status == "finished":
        return FINISHED_QUESTION, []
    options = [f"{item.id} {item.title}" for item, _ in steps if item.kind != "code"][:3]
    options.append("Something else (say what)")
    return "Which of these should pivot pursue next, or do you have a different direction in mind?", options


def prediction_text(e: m.Experiment, plan: m.Plan | None = None) -> str:
    """What the search predicted before the launch, as a clause (empty when nothing was predicted); the predicted
    value is the plan's objective (output tok/s by default)."""
    if e.predicted_change_pct is not None:
        return f"predicted {e.predicted_change_pct:+.1f}%"
    if e.predicted_tok_s is not None:
        if plan is not None and plan.objective.kind != "throughput":
            return f"predicted {plan.objective.number(e.predicted_tok_s)} {plan.objective.unit}"
        return f"predicted {_tok(e.predicted_tok_s)} output tok/s"
    return ""


def objective_values(ledger: Ledger, e: m.Experiment) -> dict[int, float]:
    """The plan's objective per level of an experiment (the mean of its runs; capacity: the mean of its runs'
    capacities, at the workload's highest concurrency)."""
    objective = ledger.plan.objective
    if objective.kind == "capacity":
        caps = ledger.capacity.get(e.id or 0, [])
        if not caps:
            return {}
        return {max(e.workload.concurrency): sum(c.capacity or 0.0 for c in caps) / len(caps)}
    return {c: v for c, lv in sorted(ledger.ok_levels(e).items()) if (v := objective.value(lv)) is not None}


def _objective_effect(ledger: Ledger, e: m.Experiment, base: m.Experiment | None) -> str:
    """The experiment's effect on an objective other than throughput, in its words ("" for throughput)."""
    objective = ledger.plan.objective
    if objective.kind == "throughput":
        return ""
    mine = objective_values(ledger, e)
    if not mine:
        return ""
    if base is None or e.kind == "baseline" or e.verdict == "baseline":
        top = max(mine)
        return f"{objective.number(mine[top])} {objective.at(top)}"
    before = objective_values(ledger, base)
    common = sorted(set(before) & set(mine))
    if not common:
        return ""
    c = common[-1]
    return objective.change_words(before[c], mine[c]) + ("" if objective.kind == "capacity" else f" at concurrency {c}")


def _effect(ledger: Ledger, e: m.Experiment) -> str:
    if e.verdict == "predicted":
        return f"not launched; {prediction_text(e, ledger.plan) or 'predicted'} (the twin, not a measurement)"
    text = _effect_text(ledger, e)
    if (objective := _objective_effect(ledger, e, ledger.base_of(e))) and e.verdict != "not_measured":
        text = f"{objective}; {text}"
    pred = prediction_text(e, ledger.plan)
    if pred and (ledger.runs.get(e.id or 0, 0) > 0):
        text += f" [{pred}]"
    if e.workload.workload_key() != ledger.workload_key():
        text += " (on a different workload: not compared)"
    return text


def _effect_text(ledger: Ledger, e: m.Experiment) -> str:
    if e.verdict == "not_measured":
        return "not measured: " + ledger.not_measured_text(e)
    levels = ledger.levels.get(e.id or 0, {})
    if e.status == "failed" and not levels:  # up, then its first requests failed (a CUDA OOM), or it never came up
        up = (e.failure_detail or "").startswith("warmup")
        return f"{'started, failed every first request' if up else 'did not start'} ({e.failure or 'failed'})"
    failed = sorted(c for c, lv in levels.items() if lv.failed > 0)
    refused = sorted(c for c, lv in levels.items() if lv.refused and lv.failed == 0)
    late = f"; not a measurement at {', '.join(map(str, refused))} (this host fell behind the twin's clock)"
    return _effect_parts(ledger, e, ledger.ok_levels(e), failed) + (late if refused else "")


def _effect_parts(ledger: Ledger, e: m.Experiment, ok: dict[int, m.BenchLevel], failed: list[int]) -> str:
    base = ledger.base_of(e)
    if e.kind == "baseline" or e.verdict == "baseline" or base is None:
        if not ok:
            return "no level completed"
        top = max(ok)
        text = f"{_tok(ok[top].output_throughput)} output tok/s at {top}" + _runs_note(ledger, e)
        return text + (f"; requests failed at {', '.join(map(str, failed))}" if failed else "")
    before = ledger.ok_levels(base)
    common = sorted(set(before) & set(ok))
    parts = []
    if common:
        c = common[-1]
        pct = _change(before[c].output_throughput, ok[c].output_throughput)
        parts.append(
            f"{_signed(pct)} output tok/s at {c} ({_tok(before[c].output_throughput)} -> {_tok(ok[c].output_throughput)})"
            + _runs_note(ledger, e)
        )
    if failed:
        parts.append(f"requests failed at {', '.join(map(str, failed))}")
    return "; ".join(parts) or "nothing comparable measured"


def _runs_note(ledger: Ledger, e: m.Experiment) -> str:
    n = ledger.runs.get(e.id or 0, 0)
    return f", mean of {n} runs" if n > 1 else ""


def render_status(ledger: Ledger, number: int, question: str | None, options: Sequence[str] | None,
                  learnt: Sequence[str] | None = None) -> Summary:  # fmt: skip
    """The markdown of status summary `number` (and the data of its charts); `learnt`: see write_status_summary."""
    used: set[int] = set()
    tried = [e for e in ledger.experiments if e.kind != "prior"]
    out = [f"# Status {number:03d}: {ledger.plan.title}", ""]
    out += _intro(ledger)
    out += ["## Best results", "", *_best_results(ledger, used)]
    out += ["## What was tried", "", *_what_was_tried(ledger, tried, used)]
    out += ["**What the measurements taught the twin.**", "", *learnt, ""] if learnt else []
    out += ["## Ruled out", "", *_ruled_out(ledger, tried)]
    out += ["## Root cause", "", *_root_cause(ledger, used)]
    if ledger.investigations:
        out += ["## Investigations", "", *_investigations(ledger)]
    steps = next_steps(ledger)
    out += ["## Next steps", "", *_next_steps(ledger, steps, tried)]
    if question is None:
        question, options = summary_question(ledger, number, steps)
    options = list(options or [])
    out += ["## Question", "", *_question(ledger, question, options)]
    text = "\n".join(out).rstrip() + "\n"
    return Summary(number, text, sorted(used), question, options)


def _workload(ledger: Ledger) -> m.BenchSpec:
    base = ledger.baseline()
    return base.workload if base else ledger.plan.workload


def _intro(ledger: Ledger) -> list[str]:
    """The session, target and workload in one paragraph, and where the numbers come from."""
    plan, record = ledger.plan, ledger.record
    t = plan.target
    w = _workload(ledger)
    intro = (
        f"Session {record.id} ({record.name}), plan {plan.name}: {t.model} on {record.hardware_text}, "
        f"{t.engine} {t.engine_version or ''}".rstrip()
        + f". {len(ledger.experiments)} experiment{'s' if len(ledger.experiments) != 1 else ''}. Workload: {w.dataset_name}, input {w.random_input_len} / output "
        f"{w.random_output_len} tokens (range ratio {w.random_range_ratio:g})."
    )
    out = [intro, ""]
    placed = [e.placement for e in ledger.experiments if e.placement is not None and e.placement.executor != "local"]
    if placed:  # where a cluster ran them
        hosts = sorted({p.host for p in placed})
        at_once = record.settings.parallel
        out += [
            f"{len(placed)} experiment{'s' if len(placed) != 1 else ''} ran as {placed[0].executor.capitalize()} tasks on "
            f"{', '.join(hosts)}, up to {at_once} run{'s' if at_once != 1 else ''} at once (`pivot show` gives each "
            "one's host and GPUs).",
            "",
        ]
    out += _noise(ledger)
    if any(ledger.sources.get(e.id or 0) == "simulated" for e in ledger.experiments):
        out += [
            "Numbers from experiments marked simulated come from pivot's digital twin of SGLang, not from GPUs.",
            "",
        ]
    return out


def _noise(ledger: Ledger) -> list[str]:
    """How wide the noise band is, and what it can and cannot tell apart among the plan's expected effects."""
    from tools.reports.expectations import parse_expectation

    base = ledger.baseline()
    ok = ledger.ok_levels(base) if base is not None else {}
    noise = ledger.spread_pct.get(base.id or 0, {}).get(max(ok)) if base is not None and ok else None
    if noise is None:
        return []
    floor = ledger.record.settings.min_gain_pct
    band = ledger.band_pct()
    runs = ledger.runs.get(base.id or 0, 0)
    text = (
        f"Noise band: {band:.1f}%, the larger of the floor ({floor:g}%) and the measured noise ({noise:.1f}%: twice "
        f"the standard error of the baseline's mean over {runs} runs at concurrency {max(ok)}; more runs narrow it)."
    )
    above, below = [], []
    for it in ledger.plan.items:
        exp = parse_expectation(it.expected_impact) if it.kind in ("flag", "config", "power") else None
        if exp is not None and exp.speaks_for(ledger.plan.objective.kind):
            (above if exp.best_gain_pct >= band else below).append(it.id)
    if above:
        text += f" It can tell apart the changes the plan expects to reach it ({', '.join(above)})"
        text += f"; not those expected below it ({', '.join(below)}): they read as no gain." if below else "."
    elif below:
        text += (
            f" No item of the plan expects a change that large ({', '.join(below)}): a measured gain inside the band "
            "reads as no gain."
        )
    return [text, ""]


def _best_results(ledger: Ledger, used: set[int]) -> list[str]:
    best = ledger.best_by_level()
    if not best:
        rows = [[c, "", "", "", "", "", "", "", "none yet", "", ""] for c in _workload(ledger).concurrency]
        return [
            _table(BEST_HEADER, rows, BEST_ALIGN),
            "",
            "No level has completed requests yet; the levels are the plan's.",
            "",
        ]
    rows = []
    judged = any(lv.slo_attainment is not None for _, lv in best.values())
    header = [*BEST_HEADER[:8], "SLO attainment", *BEST_HEADER[8:]] if judged else BEST_HEADER
    align = [*BEST_ALIGN[:8], "r", *BEST_ALIGN[8:]] if judged else BEST_ALIGN
    for c, (e, lv) in best.items():
        used.add(e.id or 0)
        watts, joules = ledger.energy(e, c)
        attainment = [_pct(lv.slo_attainment)] if judged else []
        rows.append(
            [
                c,
                _tok(lv.output_throughput),
                _tok(lv.total_throughput),
                _tok(lv.max_output_tokens_per_s),
                _ms(lv.mean_ttft_ms),
                _ms(lv.mean_tpot_ms),
                _tok(watts),
                _joules(joules),
                *attainment,
                f"#{e.number}",
                config_text(e.config) or "(no flags)",
                ledger.sources.get(e.id or 0, ""),
            ]
        )
    out = [
        _table(header, rows, align),
        "",
        "Per level, the highest output tok/s among the configurations that stand (the baseline, adopted "
        "changes and imported runs); a level with failed requests does not count. W per GPU is the mean power "
        "of each GPU over the level; J per output token counts every GPU of the server"
        + (f"; SLO attainment is the share of requests sent that met {_slo_words(best)}" if judged else "")
        + ".",
        "",
    ]
    return out + _capacity(ledger, used)


def _slo_words(best: dict[int, tuple[m.Experiment, m.BenchLevel]]) -> str:
    slos = next((lv.goodput_slos_ms for _, lv in best.values() if lv.goodput_slos_ms), None)
    return m.slo_text(slos) if slos else "the SLOs"


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v * 100:.1f}%"


def _capacity(ledger: Ledger, used: set[int]) -> list[str]:
    """Each experiment's capacity bracket, when the objective asked for it (a capacity search ran)."""
    found = [(e, cap) for e in ledger.experiments if (cap := ledger.capacity_of(e)) is not None]
    if not found:
        return []
    unit = "concurrent requests" if found[0][1].axis == "concurrency" else "req/s"
    rows = []
    for e, cap in found:
        used.add(e.id or 0)
        measured = ", ".join(f"{p.load:g}: {p.attainment * 100:.0f}%" for p in sorted(cap.points, key=lambda p: p.load))
        predicted = "" if cap.predicted_capacity is None else f"{cap.predicted_capacity:g}"
        rows.append([f"#{e.number}", _items(e) or e.kind, "" if cap.capacity is None else f"{cap.capacity:g}",
                     cap.bracket_text, predicted, measured])  # fmt: skip
    slos = m.slo_text(found[0][1].slos_ms)
    header = ["experiment", "item", "capacity", "bracket", "twin's prediction", "attainment by load"]
    return [
        f"Capacity at {slos} ({found[0][1].target * 100:g}% of requests), in {unit}:",
        "",
        _table(header, rows, ["l", "l", "r", "l", "r", "l"]),
        "",
        "Capacity is the highest load measured whose SLO attainment met the target; the workload's levels count, and "
        "the twin's prediction placed the first level of the search between them.",
        "",
    ]


def _what_was_tried(ledger: Ledger, tried: list[m.Experiment], used: set[int]) -> list[str]:
    if not tried:
        return ["Nothing yet.", ""]
    rows = []
    for e in tried:
        used.add(e.id or 0)
        rows.append([f"#{e.number}", _items(e), ledger.change_text(e), _effect(ledger, e), VERDICT_WORDS[e.verdict]])
    out = [_table(["experiment", "item", "change", "effect", "verdict"], rows), ""]
    out += [
        f"Effects compare each experiment with the one it changed, at the highest level both measured ({CHANGE_FORMULA}).",
        "",
    ]
    if any(e.combined for e in tried):
        out += ["An item column like 05+06 is one experiment that combined those items as one step.", ""]
    reverts = [e for e in tried if e.reverts]
    if reverts:
        out += [
            'An item column like "-01" is a revert: the best configuration rebuilt from its chain of adopted changes '
            "without item 01.",
            "",
            *[f"- {_revert_line(ledger, e)}" for e in reverts],
            "",
        ]
    if any(e.predicted_change_pct is not None or e.predicted_tok_s is not None for e in tried):
        out += [
            "In brackets: the twin's prediction made before the launch, corrected to this campaign's measurements "
            '(a prediction, not a measurement); "not launched" rows were never run.',
            "",
        ]
    return out


def _revert_line(ledger: Ledger, e: m.Experiment) -> str:
    """One revert in words: "05 FP8 KV made 01 Cap a brake: dropped, +5.2% (experiment #7)"."""
    why = e.revert_why or f"{', '.join(e.reverts)} taken back"
    base = ledger.base_of(e)
    before, after = (ledger.ok_levels(base) if base else {}), ledger.ok_levels(e)
    common = sorted(set(before) & set(after))
    pct = _change(before[common[-1]].output_throughput, after[common[-1]].output_throughput) if common else None
    result = {
        "adopted": f"dropped, {_signed(pct)}" if pct is not None else "dropped",
        None: "not judged yet",
    }.get(e.verdict, f"kept ({VERDICT_WORDS[e.verdict]}" + (f", {_signed(pct)})" if pct is not None else ")"))
    return f"{why}: {result} (experiment #{e.number})"


def _ruled_out(ledger: Ledger, tried: list[m.Experiment]) -> list[str]:
    lines = []
    for e in tried:
        if e.verdict in SET_ASIDE:
            label = f"items {_items(e)} together, " if e.combined else f"item {e.plan_item}, " if e.plan_item else ""
            title = e.title or ledger.change_text(e)
            why = e.reason or e.failure or "no reason recorded"
            lines.append(f"- **{title}** ({label}experiment #{e.number}, {VERDICT_WORDS[e.verdict]}): {why}")
    for p in ledger.plan.prior:
        if p.verdict in ("adopted", "baseline"):
            continue
        how = f" (`{p.flags}`)" if p.flags else f" ({p.change})" if p.change else ""
        lines.append(f"- **{p.title}**{how}, before this plan, {VERDICT_WORDS[p.verdict]}: {p.finding}")
    return (lines or ["Nothing yet."]) + [""]


def _next_steps(
    ledger: Ledger, steps: list[tuple[m.PlanItem, Expectation | None]], tried: list[m.Experiment]
) -> list[str]:
    """The untested items ranked, what the twin could not measure, and the items the plan checks say to correct."""
    plan = ledger.plan
    out: list[str] = []
    warnings = plan_warnings(ledger)
    if steps:
        for i, (item, _) in enumerate(steps, start=1):
            tier = plan.tiers.get(item.tier, f"tier {item.tier}")
            who = "a code change for you to make" if item.kind == "code" else item.kind
            line = f"{i}. **{item.id} {item.title}** ({tier}; {who}). Expected: {item.expected_impact.strip()}"
            errors = [w for w in warnings.get(item.id, []) if w.startswith("error")]
            if errors:
                line += f" Plan check {errors[0]}"
            predicted = [e for e in ledger.item_experiments(item.id) if e.verdict == "predicted"]
            if predicted and prediction_text(predicted[-1], plan):
                line += _predicted_note(ledger, predicted[-1])
            out.append(line)
        out += [
            "",
            "Ranked by the midpoint of each item's expected range, as the plan states it; items without a number last.",
            "",
        ]
    else:
        out += ["Every item of the plan has been tried.", ""]
    unmeasured = [e for e in tried if e.verdict == "not_measured"]
    if unmeasured:
        out += ["To measure on a GPU (the twin does not model what they change, so it did not measure them):", ""]
        out += [
            f"- **{e.plan_item or ''} {e.title}**".replace("** ", "**", 1) + f": {ledger.not_measured_text(e)}."
            for e in unmeasured
        ] + [""]
    corrections = [f for f in ledger.findings if f.kind == "claim" and f.severity == "error"]
    if corrections:
        out += [
            "Plan items with a physics or direction error (see Root cause) should be corrected before they are run again: "
            + ", ".join(sorted({f.plan_item or "" for f in corrections if f.plan_item}))
            + ".",
            "",
        ]
    return out


def _predicted_note(ledger: Ledger, p: m.Experiment) -> str:
    """An item not launched: the prediction, the best it was made against, and whether that is still the best."""
    against = ledger.number(p.base_experiment_id)
    note = (
        f" Not launched: when experiment #{p.number} was recorded, the twin {prediction_text(p, ledger.plan)} against experiment "
        f"#{against}, corrected to what was measured then"
    )
    best = ledger.best()
    if best is not None and best.id != p.base_experiment_id:
        note += f" (experiment #{best.number} is the best now)"
    return note + "; a prediction in the question below is the current one."


def _question(ledger: Ledger, question: str, options: list[str]) -> list[str]:
    out = [question, ""]
    if options:
        out += [f"{i}. {o}" for i, o in enumerate(options, start=1)] + [""]
    elif billed := [u for u in ledger.usage if u.model != "autopilot"]:  # the final summary: the model's use
        out += [usage_text(billed), ""]  # (the built-in autopilot costs nothing; its tokens are estimates)
    return out


def usage_text(usage: Sequence[m.ModelUsage]) -> str:
    """The model's use over a session's runs in one sentence: requests, tokens and cost (where it is known)."""
    requests = sum(u.requests for u in usage)
    tokens_in = sum(u.input_tokens for u in usage)
    tokens_out = sum(u.output_tokens for u in usage)
    models = ", ".join(dict.fromkeys(u.model for u in usage))
    priced = [u.cost_usd for u in usage if u.cost_usd is not None]
    if priced and len(priced) == len(usage):
        cost = f"cost ${sum(priced):,.2f} (genai-prices)"
    elif priced:
        cost = f"cost ${sum(priced):,.2f} for the runs with a known price"
    else:
        cost = "no price known for this model"
    runs = len(usage)
    return (
        f"Model use ({models}): {runs} run{'s' if runs != 1 else ''}, {requests:,} requests, {tokens_in:,} input "
        f"and {tokens_out:,} output tokens; {cost}."
    )


def _root_cause(ledger: Ledger, used: set[int]) -> list[str]:
    eid = ledger.analysed_experiment()
    claims = [f for f in ledger.findings if f.kind == "claim" and f.severity in ("warning", "error")]
    out: list[str] = []
    if eid is None:
        out += ["No analysis is recorded yet (`pivot summary` runs it on the best experiment first).", ""]
    else:
        used.add(eid)
        fs = [f for f in ledger.findings if f.experiment_id == eid]
        verdict = next(f for f in fs if f.kind == "bottleneck")
        if verdict.category is None:  # no roofline for this hardware, or the profiles contradicted: measurements only
            out += [
                f"**No bottleneck named**, from the analysis of experiment #{ledger.number(eid)}. {verdict.text}",
                "",
            ]
            out += _measured_levels(fs)
            if claims:
                out += ["Plan checks (physics and direction):", ""]
                out += [f"- {f.severity}: {f.text}" for f in claims] + [""]
            return out
        title = m.BOTTLENECK_TITLES.get(verdict.category or "", verdict.category or "")
        out += [
            f"**{title[0].upper()}{title[1:]}**, from the analysis of experiment #{ledger.number(eid)}. {verdict.text}",
            "",
        ]
        evidence = [f for f in fs if f.kind == "evidence" and f.category == verdict.category]
        out += [f"- {f.text}" for f in evidence] + [""]
        scaling = [f for f in fs if f.kind == "scaling"]
        notes = [f for f in fs if f.kind == "note"]
        also = [f for f in fs if f.kind == "evidence" and f.category != verdict.category]
        if also or scaling or notes:
            out += ["Also measured:", ""]
            out += [f"- {f.text}" for f in [*notes, *scaling, *also]] + [""]
        levels = [f for f in fs if f.kind == "level"]
        if levels:
            moe = any("rows_per_expert" in f.values for f in levels)
            header = [
                "concurrency",
                "running requests",
                "rows per expert" if moe else "GEMM rows (M)",
                "FLOP/byte",
                "bound",
                "GEMM TFLOP per step",
                "GEMM ms",
                "TFLOPS",
                "% of peak",
                "GB per step",
                "bandwidth floor ms",
                "TPOT ms",
                "TPOT / floor",
                "W per GPU",
                "% of power limit",
                "KV used %",
            ]
            rows = []
            for f in levels:
                v = f.values
                rows_pe = v["rows_per_expert"] if moe else round(v["gemm_m"])
                gemm_ms = v.get("estimate_expert_gemm_ms" if moe else "estimate_dense_gemm_ms")
                rows.append(
                    [
                        int(v["max_concurrency"]),
                        _tok(v.get("running_decodes")),
                        _rows(rows_pe),
                        f"{v['arithmetic_intensity_flop_per_byte']:,.0f}",
                        "memory" if v.get("memory_bound") else "compute",
                        f"{v['gemm_tflop']:.4g}" if "gemm_tflop" in v else "",
                        _ms(gemm_ms),
                        f"{v['achieved_tflops']:,.1f}",
                        f"{v['share_of_peak_pct']:.1f}",
                        f"{v['step_bytes_gb']:.2f}",
                        _ms(v["bandwidth_floor_ms"]),
                        _ms(v.get("mean_tpot_ms")),
                        f"{v['tpot_over_floor']:.1f}",
                        _tok(v.get("power_w_mean")),
                        _tok(v.get("power_share_pct")),
                        _tok(v.get("kv_usage_pct")),
                    ]
                )
            out += [_table(header, rows, ["r"] * len(header)), ""]
            v = levels[-1].values
            per_expert = (
                f"rows per expert = running requests x {v['experts_per_token']:.0f} / {v['experts']:.0f}; "
                if moe and "experts" in v
                else ""
            )
            out += [
                f"Each row is one set of numbers, at the requests that actually decode (running requests, from "
                f"Little's law): {per_expert}TFLOPS = GEMM TFLOP per step / GEMM ms (the decode-step estimate); "
                f"% of peak = TFLOPS / {v['peak_tflops']:,.0f}; bandwidth floor = GB per step / "
                f"{v.get('bandwidth_gbs', 0):,.0f} GB/s; TPOT / floor = TPOT ms / bandwidth floor ms.",
                "",
            ]
        formulas = sorted({f.formula for f in fs if f.formula})
        if formulas:
            out += ["How the numbers were derived:", ""] + [f"- {x}" for x in formulas] + [""]
    if claims:
        out += ["Plan checks (physics and direction):", ""]
        out += [f"- {f.severity}: {f.text}" for f in claims] + [""]
    return out


def _investigations(ledger: Ledger) -> list[str]:
    """Each sub-agent investigation: its question, what it read, its model's use and its report (quoted)."""
    out: list[str] = []
    for number, inv in enumerate(ledger.investigations, 1):  # numbered in the session, not across the ledger
        about = f", experiment #{ledger.number(inv.experiment_id)}" if inv.experiment_id is not None else ""
        tools = ", ".join(dict.fromkeys(inv.tools_used)) or "no tools"
        tokens = inv.input_tokens + inv.output_tokens
        out += [
            f"**Investigation {number}** ({inv.kind.replace('_', ' ')}{about}; {inv.status}): {inv.question}",
            "",
            f"Read with {tools}; model {inv.model}, {inv.requests} request{'s' if inv.requests != 1 else ''}, "
            f"{tokens:,} tokens. Its report:",
            "",
            *[f"> {line}" if line.strip() else ">" for line in (inv.report or "(no report)").splitlines()],
            "",
        ]
    return out


def _measured_levels(fs: list[m.Finding]) -> list[str]:
    """The notes (what is not known, what the profiles contradict) and each level as measured, as a table."""
    out: list[str] = []
    notes = [f for f in fs if f.kind in ("note", "scaling")]
    if notes:
        out += [f"- {f.text}" for f in notes] + [""]
    levels = [f for f in fs if f.kind == "level"]
    if levels:
        header = ["concurrency", "running requests", "output tok/s", "TTFT ms", "TPOT ms", "KV used %", "W per GPU"]
        rows = [
            [
                int(f.values["max_concurrency"]),
                _tok(f.values.get("running_decodes")),
                _tok(f.values.get("output_throughput")),
                _ms(f.values.get("mean_ttft_ms")),
                _ms(f.values.get("mean_tpot_ms")),
                _tok(f.values.get("kv_usage_pct")),
                _tok(f.values.get("power_w_mean")),
            ]
            for f in levels
        ]
        out += [_table(header, rows, ["r"] * len(header)), ""]
    return out


def _rows(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:,.{2 if value < 1 else 1 if value < 10 else 0}f}"


def _latest_status(ledger: Ledger) -> int:
    numbers = [d.number or 0 for d in ledger.documents if d.kind == "status"]
    return max(numbers, default=0)


def write_status_summary(
    session: SessionLike,
    question: str | None = None,
    options: Sequence[str] | None = None,
    *,
    new: bool = False,
    html: bool = False,
    learnt: Sequence[str] | None = None,
) -> m.Document:
    """Write status summary `status-NNN.md`: with `new`, the next number (a pivot point), else the latest is
    rebuilt (001 when there is none). The question defaults to the open pivot's, else one built from the next
    steps. With `html`, also `status-NNN.html` and its charts. `learnt`: what the campaign concluded about the twin
    (tools/lessons.py: learnt_lines), in lines. Returns the markdown's ledger record."""
    ledger = Ledger.read(session.store, session.id)
    latest = _latest_status(ledger)
    number = latest + 1 if (new or latest == 0) else latest
    summary = render_status(ledger, number, question, options, learnt)
    problems = check_document(summary.markdown, STATUS_HEADINGS)
    if problems:
        raise PivotError(f"status summary {number:03d} is malformed: {'; '.join(problems)}")
    known = {d.path: d for d in ledger.documents}
    folder = session.paths.docs_dir(session.id)
    doc = m.Document(
        session_id=session.id,
        kind="status",
        number=number,
        title=f"Status {number:03d}",
        path="",
        status="latest",
        sha256="",
        experiment_ids=summary.experiment_ids,
    )
    saved = _write(session, folder / f"status-{number:03d}.md", summary.markdown, doc, known)
    fault_point("status-markdown-written")
    if new:
        for d in ledger.documents:
            if d.kind == "status" and (d.number or 0) < number and not d.status.startswith(("superseded", "edited")):
                session.store.upsert_document(d.model_copy(update={"status": f"superseded by status-{number:03d}"}))
    if html:
        write_status_html(session, number, ledger=ledger, markdown_text=summary.markdown, known=known)
    return saved


def complete_status(session: SessionLike) -> m.Document | None:
    """After a step that was writing a status summary was cut short: write the latest summary's HTML and charts
    when they are missing or older than its markdown. Returns the HTML's record when it wrote one."""
    latest = latest_status_doc(session.store.documents(session.id))
    if latest is None or latest.number is None:
        return None
    folder = session.paths.docs_dir(session.id)
    md_path, html_path = folder / f"status-{latest.number:03d}.md", folder / f"status-{latest.number:03d}.html"
    if not md_path.exists():
        return None
    if html_path.exists() and html_path.stat().st_mtime >= md_path.stat().st_mtime:
        return None
    return write_status_html(session, latest.number)
