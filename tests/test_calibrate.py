"""`pivot calibrate --from-json`: the recorded H200 GEMMs fitted into a profile file with provenance (tools/calibrate.py)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from agent.cli import cli
from tools.profiles import load_hardware

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted(str(p) for p in (ROOT / "scripts" / "calibration").glob("h200-gemm-*.json"))


def test_the_recorded_h200_gemms_give_a_profile_with_provenance_that_reproduces_them(tmp_path):
    out = tmp_path / "my-h200.toml"
    result = CliRunner().invoke(cli, ["calibrate", "--hardware", "h200", "--from-json", *FIXTURES, "--out", str(out),
                                      "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["residuals"]["dense_check_passes"] and data["residuals"]["median_abs_error"] < 0.05
    fitted = load_hardware(str(out))
    shipped = load_hardware("h200")
    assert fitted.name == "my-h200" and fitted.calibration is not None
    for key in data["values"]:  # the shipped H200's GEMM scalars are this fit's (scripts/fit_h200_gemm.py)
        assert abs(getattr(fitted.calibration, key) / getattr(shipped.calibration, key) - 1) < 0.02, key
        assert fitted.calibration.provenance[key].startswith("fitted: h200-gemm-glm5-run1.json")
    assert fitted.calibration.provenance["host_ms_per_step"].startswith("engine:")  # what was not fitted says so


def test_files_with_nothing_to_fit_are_one_line(tmp_path):
    empty = tmp_path / "x.json"
    empty.write_text(json.dumps({"format": "pivot-microbench/1", "cases": []}))
    result = CliRunner().invoke(cli, ["calibrate", "--hardware", "h200", "--from-json", str(empty)])
    assert result.exit_code == 1 and "nothing to fit" in result.stderr and "Traceback" not in result.output
