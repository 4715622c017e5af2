"""`pivot plan check` and `pivot plan list`: optimization plans."""

from __future__ import annotations

import click

from agent.cli.base import cli
from agent.console import dump, make_table, out, print_json
from agent.errors import PivotError
from agent.plans import bundled_plans, load_plan


@cli.group()
def plan() -> None:
    """Check and list optimization plans."""


@plan.command("check")
@click.argument("plan_ref", metavar="FILE")
@click.option(
    "-o",
    "--engine-option",
    "option_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="An option of the plan's engine, as `pivot run` takes them, e.g. -o python=/opt/vllm/bin/python: the "
    "interpreter whose vLLM parser audits the flags. Repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the validated plan as JSON on stdout.")
def plan_check(plan_ref: str, option_pairs: tuple[str, ...], as_json: bool) -> None:
    """Validate a plan file (or a shipped plan by name), check everything knowable before a launch, summarize it.

    Checked: where the model and hardware profiles come from (named, shipped, else generated from the model's
    config.json and this host); the base flags and every item's flags through the engine's audit (SGLang's parser or
    catalog; vLLM's installed parser, else its nearest shipped catalog: unknown, removed, ambiguous or invalid: error;
    no-op or deprecated: warning); the plan checks (physics and direction of each item's claims). Exit 1 when there
    is an error.
    """
    from agent.cli.engines import _engine_options
    from tools.preflight import blocks_run, preflight

    p = load_plan(plan_ref)
    problems = preflight(p, _engine_options(option_pairs, None, None))
    errors = [x for x in problems if x.severity == "error"]
    warnings = [x for x in problems if x.severity == "warning"]
    blocking = [x for x in errors if blocks_run(x, p)]
    if as_json:
        print_json({**dump(p), "problems": [{**x.model_dump(), "blocks_run": blocks_run(x, p)} for x in problems]})
        if errors:
            raise SystemExit(1)
        return
    t = p.target
    if errors:
        out.print(f"[red]{len(errors)} error{'s' if len(errors) != 1 else ''}[/] {p.source}", markup=True)
    else:
        out.print(f"[green]ok[/] {p.source}", markup=True)
    out.print(f"[bold]{p.name}[/]: {p.title}", markup=True)
    where = f"{t.gpus}x {t.hardware}" if t.hardware else "this host's hardware"
    out.print(f"target {t.model} on {where}, {t.engine} {t.engine_version or ''}".rstrip())
    out.print(f"base flags: {t.flags or '(none)'}")
    w = p.workload
    out.print(
        f"workload: {w.dataset_name} in {w.random_input_len} / out {w.random_output_len} "
        f"(range ratio {w.random_range_ratio}), concurrency {', '.join(map(str, w.concurrency))}, "
        f"endpoint {w.endpoint}"
    )
    table = make_table("id", "tier", "kind", "title", "change")
    for item in p.items:
        if item.kind == "code":
            what = "(code change)"
        elif item.kind == "workload":
            what = ", ".join(f"{k}={v}" for k, v in (item.workload or {}).items())
        elif item.kind == "profile":
            what = "(measurement)"
        else:
            what = " ".join([str(item.flags or ""), *(f"(drop {f})" for f in item.remove_flags)]).strip()
        tier = f"{item.tier} {p.tiers.get(item.tier, '')}".strip()
        table.add_row(item.id, tier, item.kind, item.title, what)
    out.print(table)
    if p.prior:
        out.print(f"prior results: {len(p.prior)} (" + "; ".join(f"{r.title}: {r.verdict}" for r in p.prior) + ")")
    checks = make_table("severity", "where", "check", "finding")
    for x in problems:
        checks.add_row(x.severity, x.where, x.check, x.message)
    if problems:
        out.print(checks)
    if blocking:
        verdict = ": `pivot run` refuses this plan until the errors of its target are fixed"
    elif errors:
        verdict = (
            ": fix the errors before a launch spends GPU time on them (a campaign rules out an item whose flags the "
            "engine refuses before any launch, and carries an item's plan-check error in its document)"
        )
    else:
        verdict = ""
    out.print(
        f"{len(errors)} error{'s' if len(errors) != 1 else ''}, {len(warnings)} warning{'s' if len(warnings) != 1 else ''}"
        + verdict
    )
    if errors:
        raise SystemExit(1)


@plan.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array on stdout.")
def plan_list(as_json: bool) -> None:
    """List the plans that ship with pivot."""
    rows = []
    for name, path in bundled_plans().items():
        try:
            p = load_plan(path)
            rows.append({"name": name, "title": p.title, "items": len(p.items), "path": str(path), "error": None})
        except PivotError as e:
            rows.append({"name": name, "title": "", "items": 0, "path": str(path), "error": e.message})
    if as_json:
        print_json(rows)
        return
    table = make_table("name", "items", "title")
    for row in rows:
        table.add_row(row["name"], str(row["items"]), row["title"] or f"[red]{row['error']}[/]")
    out.print(table)
