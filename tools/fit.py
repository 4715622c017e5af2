"""The target fitted: a few of the twin's per-target parameters, fitted to every level the campaign measured.

Where tools/learn.py corrects the twin's *numbers* (per item, at the judged level), this corrects its *physics*:
four multipliers on the hardware profile the twin runs with, each a figure a real target is known to differ in
(see [silicon]: on a real H200 the host overhead, the dtype's GEMM efficiency and the power were off):

- host: host work per engine step (`calibration.host_ms_per_step` and `host_us_per_request`);
- compute: the tensor cores' throughput as the GEMMs reach it (every `dense_tflops`: a GEMM efficiency scale);
- bandwidth: the memory bandwidth the weights and the KV cache are read at (`memory_bandwidth_gbs`);
- power: power above idle per unit of activity (`calibration.power_activity`).

Every measured level of the baseline and the latest experiments (at most MAX_EXPERIMENTS configurations) gives up to
four observations: output tok/s, mean TPOT, mean TTFT and mean power per GPU, each as log(measured / twin). The fit
is a Gauss-Newton maximum a posteriori in log(multiplier) with a prior N(0, PRIOR_SD^2) per parameter (the profile
is the prior mean), the Jacobian by finite differences; the posterior covariance gives each multiplier's interval.
A parameter the measurements do not move (host work hidden under the GPU's step by the overlap scheduler, power
without a power reading) keeps its prior's width and is reported as not identified. The twin is run noise-free;
each fit costs (parameters + 1) x ITERATIONS simulations of every observed level.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from agent import models as m
from tools.engines.sim.truth import HardwareTruth, Truth
from tools.method.reading import Method
from tools.profiles import HardwareProfile, load_hardware

PARAMS: dict[str, tuple[str, ...]] = {
    "host": ("calibration.host_ms_per_step", "calibration.host_us_per_request"),
    "compute": ("dense_tflops.*",),
    "bandwidth": ("memory_bandwidth_gbs",),
    "power": ("calibration.power_activity",),
}
WORDS = {
    "host": "host overhead per step",
    "compute": "GEMM efficiency (compute) scale",
    "bandwidth": "memory/KV bandwidth scale",
    "power": "power activity",
}
METRICS = {"output_throughput": 0.03, "mean_tpot_ms": 0.03, "mean_ttft_ms": 0.10, "mean_gpu_power_w": 0.05}
PRIOR_SD = 0.7  # log(multiplier): the profile is off by up to about 2x either way
STEP = 0.1  # the finite difference, in log(multiplier)
ITERATIONS = 3
MAX_EXPERIMENTS = 4  # configurations fitted: the baseline and the latest measured experiments


@dataclass
class Parameter:
    name: str
    words: str
    value: float  # the multiplier on the profile's figure
    low: float  # its ~95% interval
    high: float
    base: float | None  # the profile's own figure (the first one named), for the record
    identified: bool  # the measurements narrowed it below half of its prior width

    def text(self) -> str:
        if not self.identified:
            return f"{self.words}: not identified by these measurements (kept at the profile's)"
        figure = f" ({self.base * self.value:.3g} against the profile's {self.base:.3g})" if self.base else ""
        return f"{self.words}: x{self.value:.2f} ({self.low:.2f}-{self.high:.2f}){figure}"


@dataclass
class Fit:
    """The fitted multipliers, their intervals and the residuals before and after."""

    hardware: str
    parameters: list[Parameter] = field(default_factory=list)
    observations: int = 0
    experiments: list[int] = field(default_factory=list)
    rms_before_pct: dict[str, float] = field(default_factory=dict)  # per metric
    rms_after_pct: dict[str, float] = field(default_factory=dict)

    def scale(self) -> dict[str, float]:
        """The fitted multipliers as a truth's hardware scale (identified parameters only)."""
        return {
            path: p.value
            for p in self.parameters
            if p.identified and abs(p.value - 1) > 1e-3
            for path in PARAMS[p.name]
        }

    def as_json(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        resid = ", ".join(
            f"{k.replace('mean_', '').replace('_ms', '').replace('_', ' ')} {self.rms_before_pct[k]:.1f}% -> "
            f"{self.rms_after_pct.get(k, 0):.1f}%"
            for k in self.rms_before_pct
        )
        head = (
            f"The twin fitted to this target ({self.observations} measured numbers of experiments "
            f"{', '.join(f'#{n}' for n in self.experiments)}; rms error before -> after: {resid}):"
        )
        return [head, "", *[f"- {p.text()}" for p in self.parameters]]


def scaled(hw: HardwareProfile, multipliers: dict[str, float]) -> HardwareProfile:
    """The profile with each parameter's figures multiplied (power activity held at most 1)."""
    scale: dict[str, float] = {}
    for name, value in multipliers.items():
        for path in PARAMS[name]:
            if path == "dense_tflops.*":
                scale |= {f"dense_tflops.{k}": value for k in hw.dense_tflops}
            elif path == "calibration.power_activity" and hw.calibration is not None:
                scale[path] = min(value, 1.0 / hw.calibration.power_activity)
            else:
                scale[path] = value
    return Truth(name="fit", hardware=HardwareTruth(scale=scale)).hardware_for(hw)


def _observed(method: Method) -> list[tuple[m.Experiment, int, dict[str, float]]]:
    """(experiment, level, metric -> measured mean) for the baseline and the latest measured experiments."""
    store = method.store
    key = method.plan.workload.workload_key()
    measured = [
        e
        for e in method.experiments
        if e.workload.workload_key() == key and method.run_count(e) > 0 and not method.failed_levels(e)
        and e.verdict not in ("crashed", "ruled_out")
    ]  # fmt: skip
    chosen = measured[:1] + measured[1:][-(MAX_EXPERIMENTS - 1) :]
    out = []
    for e in chosen:
        levels: dict[int, list[m.BenchLevel]] = {}
        for result in store.bench_results(e.id or 0):
            for lv in result.levels:
                if lv.max_concurrency is not None and lv.completed:
                    levels.setdefault(lv.max_concurrency, []).append(lv)
        power = {
            t.max_concurrency: sum(g.power_w_mean or 0 for g in t.gpus) / len(t.gpus)
            for t in store.telemetry(e.id or 0)
            if t.max_concurrency is not None and t.gpus and all(g.power_w_mean for g in t.gpus)
        }
        for c, lvs in sorted(levels.items()):
            mean = m.BenchLevel.mean(lvs)
            values = {k: getattr(mean, k) for k in METRICS if k != "mean_gpu_power_w" and getattr(mean, k, None)}
            watts = mean.mean_gpu_power_w or power.get(c)
            if watts:
                values["mean_gpu_power_w"] = watts
            out.append((e, c, values))
    return out


def fit_target(method: Method, model_profile: str, hardware: str, gpus: int) -> Fit | None:
    """The multipliers of the module docstring fitted to the campaign's measured levels (None before any)."""
    from tools.engines.sim.twin import Twin, TwinStartupError

    observed = _observed(method)
    if not observed:
        return None
    hw = load_hardware(hardware)
    names = list(PARAMS)
    cache: dict[tuple, dict[str, float] | None] = {}

    def predict(theta: np.ndarray) -> np.ndarray:
        profile = scaled(hw, dict(zip(names, np.exp(theta).tolist(), strict=True)))
        out = []
        for e, c, values in observed:
            key = (profile.name, str(e.config), c)
            if key not in cache:
                try:
                    twin = Twin.build(model_profile, profile, gpus, e.config)
                    sim = twin.simulate(method.plan.workload, c)
                    lv = twin.level(method.plan.workload, sim, c)
                    cache[key] = {k: float(getattr(lv, k) or 0) for k in METRICS}
                except TwinStartupError:
                    cache[key] = None
            got = cache[key] or {}
            out += [math.log(max(got.get(k, 0.0), 1e-9)) for k in values]
        return np.array(out)

    y = np.array([math.log(v) for _, _, values in observed for v in values.values()])
    sd = np.array([METRICS[k] for _, _, values in observed for k in values])
    w = 1 / sd**2
    prior = np.full(len(names), 1 / PRIOR_SD**2)
    theta = np.zeros(len(names))
    before = predict(theta)
    cov = np.diag(1 / prior)
    for _ in range(ITERATIONS):
        f0 = predict(theta)
        jac = np.column_stack([(predict(theta + STEP * np.eye(len(names))[k]) - f0) / STEP for k in range(len(names))])
        precision = (jac.T * w) @ jac + np.diag(prior)
        cov = np.linalg.inv(precision)
        theta = theta + cov @ ((jac.T * w) @ (y - f0) - prior * theta)
        theta = np.clip(theta, -2.0, 2.0)
    after = predict(theta)
    result = Fit(hardware=hw.name, observations=len(y), experiments=sorted({e.number or 0 for e, _, _ in observed}))
    metrics = [k for _, _, values in observed for k in values]
    for k in dict.fromkeys(metrics):
        idx = [i for i, name in enumerate(metrics) if name == k]
        result.rms_before_pct[k] = 100 * float(np.sqrt(np.mean((y[idx] - before[idx]) ** 2)))
        result.rms_after_pct[k] = 100 * float(np.sqrt(np.mean((y[idx] - after[idx]) ** 2)))
    for k, name in enumerate(names):
        s = float(math.sqrt(max(cov[k, k], 0.0)))
        result.parameters.append(
            Parameter(
                name,
                WORDS[name],
                math.exp(theta[k]),
                math.exp(theta[k] - 2 * s),
                math.exp(theta[k] + 2 * s),
                _base(hw, PARAMS[name][0]),
                s < PRIOR_SD / 2,
            )
        )
    return result


def _base(hw: HardwareProfile, path: str) -> float | None:
    if path == "dense_tflops.*":
        return None
    node: object = hw.model_dump()
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return float(node) if isinstance(node, int | float) else None


# ---- the fitted twin in the search's predictions (`pivot run --fit-twin`)

_FITTED: dict[tuple, Any] = {}  # (session, what was measured) -> the fitted predictor (or the stock one)


def fitted_predictor(method: Method, predictor: Any) -> Any:
    """The twin the search ranks by, fitted to this target: with the session's `fit_twin` setting, a twin predictor
    (the simulated engines') becomes the same twin on the hardware profile scaled by the multipliers the campaign's
    measurements identify (fit_target); the fit is made again only when a measurement was added. Any other
    predictor, and a fit that identifies nothing, is returned as it is."""
    from tools.engines.sim.predictor import TwinPredictor

    if not method.settings.fit_twin or not isinstance(predictor, TwinPredictor) or predictor.truth:
        return predictor
    key = (method.record.id, predictor.model_profile, predictor.hardware_name, predictor.gpus,
           tuple((e.id, method.run_count(e), e.verdict) for e in method.experiments))  # fmt: skip
    if key not in _FITTED:
        fit = fit_target(method, predictor.model_profile, predictor.hardware_name, predictor.gpus)
        multipliers = {p.name: p.value for p in (fit.parameters if fit else []) if p.identified}
        if len(_FITTED) > 64:
            _FITTED.pop(next(iter(_FITTED)))
        _FITTED[key] = (
            TwinPredictor(predictor.model_profile, scaled(load_hardware(predictor.hardware_name), multipliers),
                          predictor.gpus)
            if any(abs(v - 1) > 1e-3 for v in multipliers.values()) else predictor
        )  # fmt: skip
    return _FITTED[key]
