"""`pivot microbench`: GEMM micro-benchmarks of a model's expert (or dense) shapes on this host's GPU, into the ledger.

The measuring is tools/gemm.py; tools/microbench.py records the rows the analysis reads. Without a GPU it says so
and exits 1 (the analysis keeps using the hardware profile's fit); `--from-json` imports results measured on
another host (`python -m tools.gemm ... --json-out FILE` needs only PyTorch there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from agent import models as m
from agent.console import dump, err, make_table, out, print_json, warn
from agent.errors import PivotError


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise PivotError(f"bad {what} {text!r}", hint=f"write {what} as a list of positive integers, e.g. 1,8")
    return values


def _table(results: list[m.MicrobenchResult]):
    table = make_table("id", "shape", "dtype", "m", "n", "k", "groups", "TFLOPS", "% peak", "% roofline")
    for r in results:
        table.add_row(
            str(r.id or ""),
            r.backend or "",
            r.dtype,
            str(r.m),
            str(r.n),
            str(r.k),
            str(r.groups),
            f"{r.tflops:,.1f}",
            f"{100 * r.share_of_peak:.1f}",
            f"{100 * r.share_of_roofline:.1f}",
        )
    return table


@click.command("microbench")
@click.option("--model-profile", help="Model profile (default: the session's target's, else glm-5-nvfp4).")
@click.option("--hardware", help="Hardware profile the rows are recorded under (default: the one naming this GPU).")
@click.option(
    "--tp", "tp_text", help="TP sizes whose per-GPU widths to measure, e.g. 1,8 (default: 1 and the session's)."
)
@click.option("--rows", "rows_text", help="Rows per expert (rows for dense models), e.g. 1,2,4 (default 1,2,...,4096).")
@click.option("--dtype", "dtype_text", default="bf16,fp8", show_default=True, help="bf16 and/or fp8.")
@click.option("--backend", "backends", multiple=True, help="Only this kernel path, e.g. grouped_mm (repeatable).")
@click.option(
    "--session", "session_ref", help="Record the rows for this session (they feed every analysis either way)."
)
@click.option(
    "--from-json",
    "from_json",
    type=click.Path(exists=True, dir_okay=False),
    help="Import a results file instead of measuring.",
)
@click.option(
    "--json-out", type=click.Path(dir_okay=False), help="Also write the raw results file (importable with --from-json)."
)
@click.option("--shapes", "shapes_only", is_flag=True, help="List the cases that would be measured; needs no GPU.")
@click.option("--no-record", is_flag=True, help="Measure and print, but record nothing in the ledger.")
@click.option("--json", "as_json", is_flag=True, help="Print the recorded rows as JSON on stdout.")
@click.pass_context
def microbench(ctx: click.Context, model_profile: str | None, hardware: str | None, tp_text: str | None,
               rows_text: str | None, dtype_text: str, backends: tuple[str, ...], session_ref: str | None,
               from_json: str | None, json_out: str | None, shapes_only: bool, no_record: bool, as_json: bool) -> None:  # fmt: skip
    """GEMM micro-benchmarks of a model's expert GEMMs (grouped over the hit experts, as engines run them) or of a
    dense model's linear layers, in bf16 and fp8: TFLOPS, share of the GPU's peak and of the roofline bound.

    The rows go to the ledger, where the analysis uses them instead of the hardware profile's GEMM-efficiency
    fit. Example: pivot microbench --model-profile glm-5-nvfp4 --tp 1,8 --rows 1,8,64,512.
    """
    from tools import gemm
    from tools import microbench as mb
    from tools.profiles import load_model

    home = ctx.find_root().obj
    store = home.store
    session_id = store.get_session(session_ref).id if session_ref else None

    if from_json:
        _import(store, from_json, session_id=session_id, hardware=hardware, no_record=no_record, as_json=as_json)
        return

    target = store.get_session(session_ref).plan.target if session_ref else None
    model = (
        load_model(model_profile)
        if model_profile
        else (mb.model_for_target(target) if target else load_model("glm-5-nvfp4"))
    )
    tps = _ints(tp_text, "TP sizes") if tp_text else sorted({1, mb.target_tp(target) if target else 1})
    rows = _ints(rows_text, "rows") if rows_text else list(gemm.DEFAULT_ROWS)
    dtypes = [d.strip() for d in dtype_text.split(",") if d.strip()]
    cases = mb.plan_cases(model, tps, rows, dtypes)
    if shapes_only:
        _print_shapes(cases, as_json)
        return

    run, results = _measure(model, hardware, target, cases, tps=tps, rows=rows, dtypes=dtypes, backends=backends,
                            json_out=json_out, session_id=session_id)  # fmt: skip
    stored = results if no_record else mb.record(store, results)
    _print(stored, as_json, run)


def _import(store: Any, from_json: str, *, session_id: str | None, hardware: str | None, no_record: bool,
            as_json: bool) -> None:  # fmt: skip
    """`--from-json FILE`: a results file measured elsewhere, recorded (unless --no-record) and printed."""
    from tools import microbench as mb

    run, stored, errors = mb.import_run(
        store if not no_record else _NullStore(), from_json, session_id=session_id, hardware=hardware
    )
    for e in errors:
        warn(f"skipped: {e}")
    _print(stored, as_json, run)
    if not as_json:
        what = "parsed (not recorded)" if no_record else f"recorded as {hardware or run.get('hardware')}"
        out.print(f"imported {len(stored)} rows from {from_json} ({run.get('device', {}).get('name', '?')}), {what}")


def _print_shapes(cases: list[Any], as_json: bool) -> None:
    """`--shapes`: the cases that would be measured."""
    table = make_table(
        "shape", "tp", "dtype", "m", "n", "k", "groups", "experts hit", "GEMMs (m, n, k, groups)", "AI FLOP/B"
    )
    for c in cases:
        table.add_row(c.name, str(c.tp), c.dtype, str(c.rows), str(c.n), str(c.k), str(c.groups),
                      "" if c.experts_hit is None else f"{c.experts_hit:.1f}",
                      " + ".join(f"{g.m}x{g.n}x{g.k}x{g.groups}" for g in c.gemms), f"{c.intensity:,.1f}")  # fmt: skip
    if as_json:
        print_json(
            [{**c.__dict__, "gemms": [g.__dict__ for g in c.gemms], "flops": c.flops, "bytes": c.bytes} for c in cases]
        )
    else:
        out.print(table)


def _measure(model: Any, hardware: str | None, target: m.Target | None, cases: list[Any], *, tps: list[int], rows: list[int],
             dtypes: list[str], backends: tuple[str, ...], json_out: str | None,
             session_id: str | None) -> tuple[dict[str, Any], list[m.MicrobenchResult]]:  # fmt: skip
    """Measure the cases on this host's GPU: the raw run and its rows (not yet recorded)."""
    from tools import gemm
    from tools import microbench as mb
    from tools.profiles import load_hardware

    why = mb.unavailable_reason()
    if why is not None:
        hw = load_hardware(hardware or (target.hardware if target and target.hardware else "h200"))
        raise PivotError(
            f"no GPU here: {why}; nothing was measured",
            hint=f"run it on a GPU host (or `python -m tools.gemm --json-out FILE` there, then "
            f"`pivot microbench --from-json FILE` here); until then the analysis uses {mb.fit_note(hw)}",
        )
    _, gpu = gemm.gpu_status()
    hw_name = hardware or mb.hardware_for_gpu(gpu)
    if hw_name is None:
        raise PivotError(f"no hardware profile names this GPU ({gpu})", hint="give --hardware NAME (or a TOML path)")
    hw = load_hardware(hw_name)
    err.print(f"measuring {len(cases)} cases of {model.name} on {gpu} (recorded as {hw.name})")
    run = mb.measure(model, hw, tps=tps, rows=rows, dtypes=dtypes, backends=list(backends) or None,
                     on_case=lambda row: err.print(gemm.format_row(row)))  # fmt: skip
    if json_out:
        Path(json_out).write_text(json.dumps(run, indent=1), encoding="utf-8")
        err.print(f"wrote {json_out}")
    results, errors = mb.results_of_run(run, hw, session_id=session_id)
    for e in errors:
        warn(f"failed: {e}")
    for note in run.get("notes", []):
        warn(note)
    return run, results


class _NullStore:
    """Stands in for the ledger under --no-record: rows are returned as given."""

    def add_microbench(self, result: m.MicrobenchResult) -> m.MicrobenchResult:
        return result


def _print(stored: list[m.MicrobenchResult], as_json: bool, run: dict[str, Any]) -> None:
    if as_json:
        print_json([dump(r) for r in stored])
        return
    out.print(_table(stored))
    if run.get("ceilings"):
        c = run["ceilings"]
        err.print("measured ceilings: " + ", ".join(f"{k} {v:,.0f}" for k, v in c.items()))
