"""`pivot calibrate`: a hardware profile fitted to measurements brought from a GPU host (tools/calibrate.py)."""

from __future__ import annotations

from pathlib import Path

import click

from agent.console import err, out, print_json
from agent.errors import PivotError


@click.command("calibrate")
@click.option("--hardware", required=True, help="The hardware profile to start from (a shipped name, e.g. h200).")
@click.option("--from-json", "files", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False,
              path_type=Path), help="GEMM results written on the GPU by `python -m tools.gemm` (repeatable).")  # fmt: skip
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the fitted profile here (default: print what would change).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the values, provenance and residuals as JSON.")
@click.argument("more", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def calibrate_cmd(hardware: str, files: tuple[Path, ...], out_path: Path | None, as_json: bool,
                  more: tuple[Path, ...]) -> None:  # fmt: skip
    """Fit the twin's GEMM scalars (efficiency, its knees, weight streaming) of HARDWARE to measured GEMMs, each with
    its provenance (the files, the device, the date) and the fit's residuals; write the profile with --out.

    \b
    Example:
      pivot calibrate --hardware h200 --from-json scripts/calibration/h200-gemm-*.json --out my-h200.toml
      pivot plan check my-plan.toml     # a plan naming hardware = "my-h200.toml" says what was fitted
    """
    from tools.calibrate import calibrate

    try:
        result = calibrate([*files, *more], hardware)  # --from-json a*.json: the shell's other matches follow
    except (ValueError, KeyError) as e:
        raise PivotError(f"cannot calibrate {hardware} from these files: {e}",
                         hint="give results of `python -m tools.gemm` (scripts/calibration/h200-gemm-*.json)") from e  # fmt: skip
    text = result.pop("profile_text")
    if out_path is not None:
        if text is None:
            raise PivotError(f"{hardware} is not a shipped profile: no profile text to write the values into")
        out_path.write_text(text.replace(f'name = "{hardware}"', f'name = "{out_path.stem}"', 1))
        err.print(f"wrote {out_path}", highlight=False)
    if as_json:
        print_json(result)
        return
    res = result["residuals"]
    out.print(f"{result['hardware']}: " + ", ".join(f"{k} = {v:g}" for k, v in result["values"].items()),
              highlight=False)  # fmt: skip
    out.print(f"fitted on {res['fitted_cases']} GEMMs: median |error| {100 * res['median_abs_error']:.1f}%, "
              f"{res['within_15pct']} within 15%; the dense check "
              f"{'passes' if res['dense_check_passes'] else 'FAILS'} "
              f"({', '.join(f'm={k}: {100 * v:+.1f}%' for k, v in res['dense_check'].items())})", highlight=False)  # fmt: skip
