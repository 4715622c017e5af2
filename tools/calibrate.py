"""Fit the twin's GEMM model of a GPU to measured GEMMs (`pivot calibrate --from-json`): the MoE model's expert
GEMMs fitted, the dense model's layers checked.

    pivot calibrate --hardware h200 --from-json scripts/calibration/h200-gemm-*.json --out my-h200.toml
    python scripts/fit_h200_gemm.py            # the shipped H200's fit: the scalars and the tables
    python scripts/fit_h200_gemm.py --write    # ... and write them into tools/profiles/hardware/h200.toml
    python scripts/fit_h200_gemm.py --check    # only the current profile against the measurements

The measurements are data (scripts/calibration/h200-gemm-*.json, written on one H200 by `python -m tools.gemm`,
see scripts/h200_device_run.sh). For each shape and row count the best kernel path measured stands for the engine
(the grouped GEMM for experts, cuBLAS/CUTLASS through torch for dense layers).

What the twin predicts for one call (tools/engines/sim/costmodel.py, the expert and dense GEMM terms):
    t = max(weight bytes / BW_gemm(n), FLOPs / (peak(dtype) x eff(m, n)))
    BW_gemm(n) = bandwidth x [gemm_bandwidth_efficiency] x n / (n + [gemm_bandwidth_n_half])      (memory side)
    eff(m, n)  = [gemm_efficiency_max] x m / (m + [gemm_m_half]) x n / (n + [gemm_n_half])          (compute side)
with n the expert's width on one GPU (expert_ffn / tp) for experts and hidden / tp for every dense part, as the
twin reads them. What the data shows, and why the model has these five scalars:
  - below the knee (~200 rows) a GEMM streams its weights well under a plain copy (4.26 TB/s, 0.89 of the
    H200's 4.8): ~0.70 of 4.8 TB/s for Llama's dense FP8 GEMMs, 0.62 for GLM-5's FP8 experts at TP1 (n = 2048)
    and 0.35 at TP8 (n = 256): a memory-side efficiency with its own width factor, not the serving
    fit's bandwidth_efficiency (0.85), which KV and attention reads keep;
  - above the knee the throughput is flat at ~0.64 of peak (dense), 0.61 (TP1) and 0.40 (TP8): the compute
    side's width factor; the knee is sharp, so m_half comes out small (the old fit bent a soft m/(m + 264) to
    mimic the memory side, 21-32% low at 64-256 rows and 16-25% high at 2048-4096 on the dense layers).
Fitted: all five, on GLM-5's FP8 expert GEMMs only (the rate its NVFP4 experts run at on a GPU without FP4 units),
at both widths (TP1: 2048, TP8: 256) and every row count, in two steps. First a robust fit (soft-L1 of the log
errors of TFLOPS, scale 5%: a point far off the trend pulls no harder than one 5% off); then the points that fit
misses by more than 3 robust standard deviations (1.4826 x the median absolute deviation) are left out and the rest
fitted by least squares of the log errors. The points left out are three (marked in the table): one row per expert
at both widths (eight experts in a call that is too short to stream, +28% at TP1 and +75% at TP8: the twin has no
per-call latency) and TP1 at 256 rows, where both kernel paths dip (grouped 29%, per-expert CUDA graphs 34.5% of
peak against 37% at 128 rows and 54% at 512: +44%). The first step alone lands close by (gemm_m_half 84, the rest
within 9%) and so does a least-absolute-deviations fit of all 26 points (gemm_m_half 67-86); a plain least squares
fit of all of them is pulled by those three (gemm_m_half 100, the dense check 19% low at 256 rows).
The check, on data the fit never saw: the twin's TFLOPS of Llama 3.3 70B's FP8 linear layers at TP1 (one layer's
four GEMMs together, as the twin lumps the dense parts) must be within 15% of the measured at 64 rows and above.
BF16 is printed for information: its kernels stream weights at ~0.83 where FP8's reach ~0.70, and the profile has
one streaming efficiency (fitted on FP8), so the twin reads BF16 GEMMs' weights 15-20% too slowly below the knee.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from tools.engines.sim.costmodel import CostModel, Parallel
from tools.minimize import nelder_mead
from tools.profiles import HardwareProfile, load_hardware, load_model

ROOT = Path(__file__).resolve().parent.parent

PROFILES = Path(__file__).resolve().parent / "profiles"
MEASURED = sorted((ROOT / "scripts/calibration").glob("h200-gemm-*.json"))  # two runs of each model, one H200
FITTED = ("gemm_efficiency_max", "gemm_m_half", "gemm_n_half", "gemm_bandwidth_efficiency", "gemm_bandwidth_n_half")
BOUNDS = {
    "gemm_efficiency_max": (0.05, 1.0),
    "gemm_m_half": (1.0, 4000.0),
    "gemm_n_half": (1.0, 4000.0),
    "gemm_bandwidth_efficiency": (0.05, 1.0),
    "gemm_bandwidth_n_half": (1.0, 4000.0),
}
FIT_MODEL, CHECK_MODEL, FIT_DTYPE = "glm-5-nvfp4", "llama-3.3-70b-fp8", "fp8"
CHECK_MIN_ROWS, TOLERANCE = 64, 0.15
SCALE = 0.05  # of the soft-L1 objective: errors of about the runs' spread and the model's slack count as squares
OUTLIER = 3.0  # robust standard deviations off the median beyond which a point is left out of the final fit
NEUTRAL = {  # the second starting point: a sharp knee, the memory side active
    "gemm_efficiency_max": 0.7,
    "gemm_m_half": 32.0,
    "gemm_n_half": 128.0,
    "gemm_bandwidth_efficiency": 0.7,
    "gemm_bandwidth_n_half": 128.0,
}


def with_values(text: str, calibration: dict[str, float], provenance: dict[str, str] | None = None) -> str:
    """A hardware profile's TOML text with [calibration] values replaced (and its provenance line, when given)."""
    head, sep, tail = text.partition("[calibration]")
    body, rest_sep, rest = tail.partition("\n[")
    for key, value in calibration.items():
        shown = ("{ " + ", ".join(f"{k} = {v:.4g}" for k, v in value.items()) + " }") if isinstance(value, dict) else (
            f"{value:.4g}")  # fmt: skip
        line = f"{key} = {shown}"
        if re.search(rf"(?m)^{key} = ", body):
            body = re.sub(rf"(?m)^{key} = [^\n#]*?(\s*#.*)?$", lambda mm, ln=line: ln + (mm.group(1) or ""), body)
        else:
            body = body.rstrip("\n") + "\n" + line + "\n"
    if provenance is not None:
        table = "provenance = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in provenance.items()) + " }"
        body = re.sub(r"(?m)^provenance = .*$\n?", "", body)
        body = "\n" + table + body if body.startswith("\n") else "\n" + table + "\n" + body
    return head + sep + body + rest_sep + rest


def write(hardware: str, calibration: dict[str, float]) -> Path:
    """The fitted values written into a shipped hardware profile."""
    path = PROFILES / "hardware" / f"{hardware}.toml"
    path.write_text(with_values(path.read_text(), calibration))
    load_hardware.cache_clear()
    return path


def load_cases(paths: list[Path] | None = None) -> list[dict[str, Any]]:
    """The timed cases of the measurement files, their seconds averaged over the runs, and of the kernel paths
    measured for a (model, shape, tp, dtype, rows) the fastest one."""
    runs: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for path in paths or MEASURED:
        for case in json.loads(path.read_text())["cases"]:
            if not case.get("error") and case.get("seconds"):
                runs[(case["model"], case["name"], case["tp"], case["dtype"], case["backend"], case["rows"])].append(
                    case
                )
    best: dict[tuple, dict[str, Any]] = {}
    for key, cases in runs.items():
        case = {**cases[0], "seconds": sum(c["seconds"] for c in cases) / len(cases), "runs": len(cases)}
        shape = key[:4] + key[5:]
        if shape not in best or case["seconds"] < best[shape]["seconds"]:
            best[shape] = case
    return list(best.values())


def with_calibration(hw: HardwareProfile, values: dict[str, float]) -> HardwareProfile:
    return hw.model_copy(update={"calibration": hw.calibration.model_copy(update=values)})


def twin_seconds(case: dict[str, Any], hw: HardwareProfile) -> float:
    """The twin's time for one measured call: its roofline with the profile's GEMM efficiency and weight streaming."""
    model = load_model(case["model"])
    cost = CostModel(model, hw, Parallel(tp=case["tp"]))
    n = case["n"] if case["kind"] == "experts" else model.hidden_size / case["tp"]
    eff = cost.efficiency(case["rows"], n)
    peak = hw.peak_tflops(case["dtype"]) * 1e12
    return max(case["weight_bytes"] / cost.gemm_bw(n, case["dtype"]), case["flops"] / (peak * eff))


def fit_rows(cases: list[dict[str, Any]], hw: HardwareProfile) -> list[tuple[dict[str, Any], float, float]]:
    """(case, measured TFLOPS, twin TFLOPS) for the fitted set."""
    rows = [c for c in cases if c["model"] == FIT_MODEL and c["dtype"] == FIT_DTYPE]
    return [(c, c["flops"] / c["seconds"] / 1e12, c["flops"] / twin_seconds(c, hw) / 1e12) for c in rows]


def dense_check(
    cases: list[dict[str, Any]], hw: HardwareProfile, dtype: str = FIT_DTYPE
) -> list[tuple[int, float, float, float]]:
    """(rows, measured TFLOPS, twin TFLOPS, relative error) of one dense layer's GEMMs together, per row count."""
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for c in cases:
        if c["model"] == CHECK_MODEL and c["dtype"] == dtype and c["tp"] == 1:
            groups[c["rows"]].append(c)
    out = []
    for rows in sorted(groups):
        layer = groups[rows]
        flops = sum(c["flops"] for c in layer)
        measured = flops / sum(c["seconds"] for c in layer) / 1e12
        twin = flops / sum(twin_seconds(c, hw) for c in layer) / 1e12
        out.append((rows, measured, twin, twin / measured - 1))
    return out


def _key(case: dict[str, Any]) -> tuple[int, int]:
    return case["tp"], case["rows"]


def log_errors(cases: list[dict[str, Any]], hw: HardwareProfile) -> list[tuple[dict[str, Any], float]]:
    """(case, ln(twin / measured TFLOPS)) over the fitted set."""
    return [(c, math.log(t / m)) for c, m, t in fit_rows(cases, hw)]


def loss(cases: list[dict[str, Any]], hw: HardwareProfile) -> float:
    """The robust objective over the whole fitted set: the mean soft-L1 of the log errors, e^2 below SCALE and
    growing like |e| above it, so that a few points far off the trend pull no harder than a point SCALE off."""
    e = np.array([x for _, x in log_errors(cases, hw)])
    return float(np.mean(SCALE**2 * (np.sqrt(1 + (e / SCALE) ** 2) - 1)))


def squared_loss(cases: list[dict[str, Any]], hw: HardwareProfile, leave_out: set[tuple[int, int]]) -> float:
    """Mean squared log error over the fitted set but the points left out."""
    return float(np.mean([x**2 for c, x in log_errors(cases, hw) if _key(c) not in leave_out]))


def outliers(cases: list[dict[str, Any]], hw: HardwareProfile) -> set[tuple[int, int]]:
    """(tp, rows) of the points more than OUTLIER robust standard deviations (1.4826 x the median absolute
    deviation of the log errors) off the median log error."""
    errors = log_errors(cases, hw)
    e = np.array([x for _, x in errors])
    sigma = 1.4826 * float(np.median(np.abs(e - np.median(e))))
    return {_key(c) for c, x in errors if abs(x - np.median(e)) > OUTLIER * sigma}


def start(hw: HardwareProfile) -> dict[str, float]:
    """The profile's scalars as a starting point, the unset streaming ones at their defaults (no width factor
    starts at 100)."""
    cal = hw.calibration
    out = {k: getattr(cal, k) for k in FITTED}
    if out["gemm_bandwidth_efficiency"] is None:
        out["gemm_bandwidth_efficiency"] = cal.bandwidth_efficiency
    if not out["gemm_bandwidth_n_half"]:
        out["gemm_bandwidth_n_half"] = 100.0
    return out


def _unpack(x: np.ndarray) -> dict[str, float]:  # fitted in log space, inside the bounds
    return {k: float(min(max(math.exp(v), BOUNDS[k][0]), BOUNDS[k][1])) for k, v in zip(FITTED, x, strict=True)}


def _minimize(objective, x0: np.ndarray) -> np.ndarray:
    """Nelder-Mead, restarted from its last optimum until a restart no longer improves it."""
    best = objective(x0)
    for _ in range(20):
        x = nelder_mead(objective, x0, np.full(len(FITTED), 0.3), iters=1500, tol=1e-12)
        value = objective(x)
        x0, done, best = x, best - value < 1e-12, min(best, value)
        if done:
            break
    return x0


def fit(cases: list[dict[str, Any]], hw: HardwareProfile) -> dict[str, float]:
    """Two steps: the robust objective from the profile's scalars and from NEUTRAL (the best of the two wins: from
    a large gemm_m_half the compute side hides the memory side and Nelder-Mead stalls), then least squares on the
    points that fit leaves within OUTLIER robust standard deviations."""

    def robust(x: np.ndarray) -> float:
        return loss(cases, with_calibration(hw, _unpack(x)))

    starts = [np.array([math.log(v) for v in s.values()]) for s in (start(hw), NEUTRAL)]
    x = min((_minimize(robust, x0) for x0 in starts), key=robust)
    leave_out = outliers(cases, with_calibration(hw, _unpack(x)))
    x = _minimize(lambda x: squared_loss(cases, with_calibration(hw, _unpack(x)), leave_out), x)
    return {k: float(f"{v:.3g}") for k, v in _unpack(x).items()}


def report(cases: list[dict[str, Any]], hw: HardwareProfile) -> bool:
    cal = hw.calibration
    print(
        f"h200: gemm_efficiency_max {cal.gemm_efficiency_max:g}, gemm_m_half {cal.gemm_m_half:g}, "
        f"gemm_n_half {cal.gemm_n_half:g}, gemm_bandwidth_efficiency {start(hw)['gemm_bandwidth_efficiency']:g}, "
        f"gemm_bandwidth_n_half {cal.gemm_bandwidth_n_half:g} (KV reads: bandwidth_efficiency "
        f"{cal.bandwidth_efficiency:g})"
    )
    rows = fit_rows(cases, hw)
    errors = sorted(abs(t / m - 1) for _, m, t in rows)
    print(
        f"\nfitted on {FIT_MODEL} {FIT_DTYPE} experts (best path measured): rows, width, measured, twin TFLOPS; "
        f"median |error| {100 * errors[len(errors) // 2]:.1f}%, {sum(e <= TOLERANCE for e in errors)} of "
        f"{len(errors)} within {100 * TOLERANCE:.0f}%"
    )
    left_out = outliers(cases, hw)
    for c, m, t in sorted(rows, key=lambda r: (r[0]["tp"], r[0]["rows"])):
        note = "  left out" if _key(c) in left_out else ""
        print(
            f"  tp{c['tp']} n={c['n']:<5} m={c['rows']:<5} {m:8.1f} {t:8.1f}  {100 * (t / m - 1):+6.1f}%  "
            f"({c['backend']}){note}"
        )
    ok = True
    for dtype in ("fp8", "bf16"):
        what = "the check" if dtype == FIT_DTYPE else "for information"
        print(f"\n{CHECK_MODEL} {dtype} at TP1, one layer's GEMMs together ({what}): rows, measured, twin TFLOPS")
        for rows, m, t, e in dense_check(cases, hw, dtype):
            flag = ""
            if dtype == FIT_DTYPE and rows >= CHECK_MIN_ROWS:
                flag = "ok" if abs(e) <= TOLERANCE else "OFF"
                ok = ok and abs(e) <= TOLERANCE
            print(f"  m={rows:<5} {m:8.1f} {t:8.1f}  {100 * e:+6.1f}%  {flag}")
    print(
        f"\ncheck ({CHECK_MODEL} {FIT_DTYPE}, >= {CHECK_MIN_ROWS} rows, within {100 * TOLERANCE:.0f}%):",
        "passes" if ok else "FAILS",
    )
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="write the fitted scalars into the h200 profile")
    ap.add_argument("--check", action="store_true", help="only compare the current profile with the measurements")
    args = ap.parse_args()
    cases = load_cases()
    hw = load_hardware("h200")
    if not args.check:
        best = fit(cases, hw)
        print("fitted:", ", ".join(f"{k} = {v:g}" for k, v in best.items()))
        hw = with_calibration(hw, best)
        if args.write:
            print("wrote", write("h200", best))
    sys.exit(0 if report(cases, hw) else 1)


if __name__ == "__main__":
    main()


def _device(device: Any) -> str:
    """A results file's device in words: 'NVIDIA H200, torch 2.11.0+cu130, CUDA 13.0'."""
    if isinstance(device, dict):
        parts = [str(device.get("name") or "?")]
        parts += [f"{k} {device[k]}" for k in ("torch", "cuda", "driver") if device.get(k)]
        return ", ".join(parts)
    return str(device or "?")


def calibrate(paths: list[Path], hardware: str) -> dict[str, Any]:
    """`pivot calibrate --from-json`: the GEMM scalars fitted to `paths` (tools.gemm results) from `hardware`'s
    profile; returns the values, their provenance, the profile's TOML text with them, and the fit's residuals (the
    fitted set's and the dense check's)."""
    from datetime import UTC, datetime

    from tools import stepfit

    if paths and all(stepfit.is_step_file(p) for p in paths):
        return calibrate_steps(paths, hardware)
    cases = load_cases(paths)
    fitted_cases = [c for c in cases if c["model"] == FIT_MODEL and c["dtype"] == FIT_DTYPE]
    if not fitted_cases:
        raise ValueError(f"no {FIT_MODEL} {FIT_DTYPE} expert GEMMs in the files: nothing to fit")
    hw = load_hardware(hardware)
    values = fit(cases, hw)
    fitted_hw = with_calibration(hw, values)
    runs = [json.loads(Path(p).read_text()) for p in paths]
    devices = sorted({_device(r.get("device")) for r in runs})
    when = sorted({str(r.get("measured_at") or "?")[:10] for r in runs})
    source = f"fitted: {', '.join(Path(p).name for p in paths)} ({'; '.join(devices)}; measured {', '.join(when)})"
    provenance = {**hw.calibration.provenance, **dict.fromkeys(values, source)}
    errors = [t / m - 1 for _, m, t in fit_rows(cases, fitted_hw)]
    check = [(rows, e) for rows, _, _, e in dense_check(cases, fitted_hw) if rows >= CHECK_MIN_ROWS]
    text = (
        (PROFILES / "hardware" / f"{hw.name}.toml").read_text()
        if (PROFILES / "hardware" / f"{hw.name}.toml").exists()
        else None
    )
    return {
        "hardware": hw.name,
        "values": values,
        "provenance": provenance,
        "residuals": {
            "fitted_cases": len(errors),
            "median_abs_error": sorted(abs(e) for e in errors)[len(errors) // 2],
            "within_15pct": sum(abs(e) <= TOLERANCE for e in errors),
            "dense_check": {str(rows): round(e, 4) for rows, e in check},
            "dense_check_passes": all(abs(e) <= TOLERANCE for _, e in check),
        },
        "fitted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "profile_text": with_values(text, values, provenance) if text is not None else None,
    }


def calibrate_steps(paths: list[Path], hardware: str) -> dict[str, Any]:
    """`pivot calibrate --from-json` given tools.stepbench's files: the per-dtype GEMM streaming, the per-layer
    time and the power activity fitted to whole measured steps (tools/stepfit.py), with their provenance, the
    profile's text with them, and the residuals before and after."""
    from datetime import UTC, datetime

    from tools import stepfit

    hw = load_hardware(hardware)
    rows = stepfit.load_steps(paths)
    values = stepfit.fit_steps(rows, hw)
    devices = sorted({str(r.get("device") or "?") for r in rows})
    when = sorted({str(r.get("date") or "?")[:10] for r in rows})
    source = f"fitted: {', '.join(Path(p).name for p in paths)} ({'; '.join(devices)}; measured {', '.join(when)})"
    provenance = {**hw.calibration.provenance, **dict.fromkeys(values, source)}
    path = Path(hardware) if hardware.endswith(".toml") and Path(hardware).is_file() else (
        PROFILES / "hardware" / f"{hw.name}.toml")  # fmt: skip
    text = path.read_text() if path.exists() else None
    after = stepfit.residuals(rows, stepfit.with_values(hw, values))
    before = {k: v for k, v in stepfit.residuals(rows, hw).items() if k != "rows"}
    return {
        "hardware": hw.name,
        "kind": "steps",
        "values": values,
        "provenance": provenance,
        "residuals": {**after, "before": before},
        "fitted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "profile_text": with_values(text, values, provenance) if text is not None else None,
    }
