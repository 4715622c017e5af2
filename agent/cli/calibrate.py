"""`pivot calibrate`: a hardware profile fitted to measurements brought from a GPU host (tools/calibrate.py)."""

from __future__ import annotations

from pathlib import Path

import click

from agent.console import err, out, print_json
from agent.errors import PivotError


@click.command("calibrate")
@click.option("--hardware", required=True, help="The hardware profile to start from (a shipped name, e.g. h200; for "
              "decode steps also a profile file).")  # fmt: skip
@click.option("--from-json", "files", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False,
              path_type=Path), help="GEMM results written on the GPU by `python -m tools.gemm`, or whole decode "
              "steps by `python -m tools.stepbench` (repeatable).")  # fmt: skip
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the fitted profile here (default: print what would change).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the values, provenance and residuals as JSON.")
@click.argument("more", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def calibrate_cmd(hardware: str, files: tuple[Path, ...], out_path: Path | None, as_json: bool,
                  more: tuple[Path, ...]) -> None:  # fmt: skip
    """Fit the twin's GEMM scalars (efficiency, its knees, weight streaming) of HARDWARE to measured GEMMs, or its
    per-dtype weight streaming, per-layer time and power to measured decode steps, each with its provenance (the
    files, the device, the date) and the fit's residuals; write the profile with --out.

    \b
    Examples:
      pivot calibrate --hardware h200 --from-json scripts/calibration/h200-gemm-*.json --out my-h200.toml
      pivot calibrate --hardware h100-sxm --from-json scripts/calibration/h100-step-*.json --out my-h100.toml
      pivot plan check my-plan.toml     # a plan naming hardware = "my-h200.toml" says what was fitted
    """
    from tools.calibrate import calibrate

    try:
        result = calibrate([*files, *more], hardware)  # --from-json a*.json: the shell's other matches follow
    except (ValueError, KeyError) as e:
        raise PivotError(f"cannot calibrate {hardware} from these files: {e}",
                         hint="give results of `python -m tools.gemm` (scripts/calibration/h200-gemm-*.json) or of "
                              "`python -m tools.stepbench` (scripts/calibration/h100-step-*.json), not both") from e  # fmt: skip
    text = result.pop("profile_text")
    if out_path is not None:
        if text is None:
            raise PivotError(f"{hardware} is not a shipped profile: no profile text to write the values into")
        name = result["hardware"]
        out_path.write_text(text.replace(f'name = "{name}"', f'name = "{out_path.stem}"', 1))
        err.print(f"wrote {out_path}", highlight=False)
    if as_json:
        print_json(result)
        return
    res = result["residuals"]
    shown = {k: ", ".join(f"{d} x{f:.3g}" for d, f in v.items()) if isinstance(v, dict) else f"{v:g}"
             for k, v in result["values"].items()}  # fmt: skip
    out.print(f"{result['hardware']}: " + ", ".join(f"{k} = {v}" for k, v in shown.items()), highlight=False)
    if result.get("kind") == "steps":
        was = res["before"]
        out.print(f"fitted on {res['steps']} decode steps: GPU time within 10% on {res['gpu_within_10pct']} (was "
                  f"{was['gpu_within_10pct']}), median |error| {100 * res['median_abs_gpu_error']:.1f}% (was "
                  f"{100 * was['median_abs_gpu_error']:.1f}%); power within 15% on {res['power_within_15pct']} of "
                  f"{res['power_rows']} rows at batch 1, 64, 256 (was {was['power_within_15pct']})", highlight=False)  # fmt: skip
        return
    out.print(f"fitted on {res['fitted_cases']} GEMMs: median |error| {100 * res['median_abs_error']:.1f}%, "
              f"{res['within_15pct']} within 15%; the dense check "
              f"{'passes' if res['dense_check_passes'] else 'FAILS'} "
              f"({', '.join(f'm={k}: {100 * v:+.1f}%' for k, v in res['dense_check'].items())})", highlight=False)  # fmt: skip
