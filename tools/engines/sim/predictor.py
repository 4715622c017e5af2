"""The twin as a Predictor (agent/contracts/predictor.py): SGLang's digital twin foreseeing a configuration's level.

One simulation per configuration the twin resolves alike (two command lines with the same parallel layout, limits
and faults share one), cached for the process, so a campaign predicts each configuration once. Readings are
noise-free. The sim and sim-http engines offer it for their own profiles; the real SGLang engine offers it for a
target whose model and hardware profiles pivot ships (the twin is calibrated on SGLang).

A prediction runs in a tool's worker thread and can take as long as the level it foresees (a large workload): like
the in-process engine's benchmark, it ends within a moment of a SIGINT or SIGTERM, and nothing it began is cached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent import models as m
from agent.contracts import Prediction
from agent.errors import PivotError

if TYPE_CHECKING:
    from tools.engines.sim.twin import Twin

_CACHE: dict[tuple, tuple[m.BenchLevel | None, bool]] = {}  # by what the twin resolves
_READINGS: dict[tuple, Prediction] = {}  # by command line: no second build of the same twin
_SIMULATIONS = [0]  # levels simulated (not answered from the cache): for tests and benchmarks


def simulations() -> int:
    """How many levels the twin has simulated in this process (cache misses)."""
    return _SIMULATIONS[0]


@dataclass(frozen=True)
class TwinPredictor:
    """The SGLang twin for one model profile on `gpus` GPUs of one hardware profile."""

    model_profile: str
    hardware: Any  # a hardware profile's name or file, or a HardwareProfile (the twin fitted to a target: tools/fit.py)
    gpus: int
    truth: str | None = None  # a truth file (tools/engines/sim/truth.py): the twin as the target really behaves

    @property
    def hardware_name(self) -> str:
        return str(getattr(self.hardware, "name", self.hardware))

    @property
    def name(self) -> str:
        told = f", as the truth {self.truth} has it" if self.truth else ""
        return f"the SGLang twin ({self.model_profile} on {self.gpus}x {self.hardware_name}{told})"

    def predict(self, config: m.ServerConfig, spec: m.BenchSpec, level: int) -> Prediction:
        """`config` at `level` of `spec`, from the cache when it has it."""
        outer = (
            self.model_profile,
            self.hardware_name,
            self.gpus,
            self.truth,
            str(config),
            tuple(config.env.items()) if config.env else (),
            spec.workload_key(),
            _slos(spec),
            level,
        )
        if outer not in _READINGS:
            _READINGS[outer] = self._predict(config, spec, level)
        return _READINGS[outer]

    def _predict(self, config: m.ServerConfig, spec: m.BenchSpec, level: int) -> Prediction:
        from tools.engines.catalog import CatalogError
        from tools.engines.sim.twin import TwinStartupError

        try:
            twin = build_twin(self.model_profile, self.hardware, self.gpus, config, self.truth)
        except CatalogError as e:
            return Prediction(error=f"SGLang would refuse the flags: {e.message}")
        except TwinStartupError as e:  # SGLang would not start (out of memory, a bad layout): a predicted crash
            return Prediction(crashed=True, error=f"the server would not start: {e.message}")
        except PivotError as e:  # a missing profile
            return Prediction(error=e.message)
        key = (
            twin.model.name,
            twin.hw.name,
            twin.gpus,
            repr(twin.par),
            repr(twin.limits),
            tuple(f.name for f in twin.load_faults),
            twin.power_limit_w,
            spec.workload_key(),
            _slos(spec),
            level,
        )
        if key not in _CACHE:
            _SIMULATIONS[0] += 1
            check = _stopped_by_a_signal()
            sim = twin.simulate(spec, level, check=check)
            lv = twin.level(spec, sim, level, check)
            crashed = sim.fault is not None or lv.failed > 0
            _CACHE[key] = (lv, crashed)
        lv, crashed = _CACHE[key]
        return Prediction(lv, crashed, None, tuple(twin.not_modelled), tuple(twin.no_effect))


def build_twin(model_profile: str, hardware: str, gpus: int, config: m.ServerConfig, truth: str | None = None,
               version: str = "0.5.23") -> Twin:  # fmt: skip
    """The twin for `config`, or with `truth` (a truth file) the twin as that truth has the target behave: its flags
    without effect dropped, its hardware changed and slowed by the flags' costs (tools/engines/sim/truth.py)."""
    from tools.engines.sim.truth import load_truth
    from tools.engines.sim.twin import Twin

    if not truth:
        return Twin.build(model_profile, hardware, gpus, config, version)
    t = load_truth(truth)
    read, scale = t.apply(config)
    return Twin.build(model_profile, t.hardware_for(hardware, scale), gpus, read, version)


def _stopped_by_a_signal() -> Callable[[], None]:
    """A simulation's `check`: raises once pivot has taken a SIGINT or SIGTERM since the simulation began."""
    from tools.engines import process
    from tools.engines.sim.scheduler import SimulationStopped

    before = process.signals_received()

    def check() -> None:
        if process.signals_received() != before:
            raise SimulationStopped("the twin's prediction was stopped before it finished")

    return check


def _slos(spec: m.BenchSpec) -> tuple[tuple[str, float], ...]:
    """The SLOs a predicted level is judged by (not in the workload's key: they change no request)."""
    return tuple((spec.goodput_slos_ms or {}).items())


def twin_predictor(model_profile: str | None, hardware: str | None, gpus: int) -> TwinPredictor | None:
    """The twin for these profiles, or None when the target names no model profile or hardware (nothing to
    simulate)."""
    if not model_profile or not hardware:
        return None
    return TwinPredictor(str(model_profile), str(hardware), int(gpus))
