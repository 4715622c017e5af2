"""A small engine for testing the method: its output tok/s is a formula of the plan items in its config.

Each item of a `Formula` is one flag with an effect: a factor on output tok/s (helps or hurts), an interaction
with another item (a factor that applies only when both are set), a crash under load at the top level, a failure
at startup, a flag the engine refuses (its audit blocks it), or a no-op (accepted, read nowhere). The engine offers
the same formula as its Predictor (the contract allows it: a predictor only has to foresee a configuration's level
without a launch), so the search is exact on it, and runs in process like the `sim` engine, in no time, with
optional multiplicative noise drawn from the experiment's seed, and an optional drift (every benchmark run
measures (1 + drift) times the one before it: a host whose load falls). A workload of its own (longer prompts) scales every
configuration alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import models as m
from agent.contracts import LedgerLink, Prediction
from agent.errors import LaunchFailed, PivotError
from tests.factories import bench_level
from tools.engines.base import BaseEngine

BASE_TOK_S = 1000.0


@dataclass(frozen=True)
class Effect:
    """What one item's flag does."""

    flag: str  # e.g. "--knob-3 1"
    factor: float = 1.0  # on output tok/s when set
    with_item: str | None = None  # the interaction: `pair_factor` applies when this other item's flag is set too
    pair_factor: float = 1.0
    crash: bool = False  # requests fail at the top level (under load)
    startup: bool = False  # the server does not start
    refused: bool = False  # the audit blocks it (an unknown flag)
    noop: bool = False  # accepted, read nowhere


@dataclass(frozen=True)
class Formula:
    """Output tok/s as a product of the effects of the flags set (item id -> effect)."""

    effects: dict[str, Effect] = field(default_factory=dict)

    def _set(self, config: m.ServerConfig) -> set[str]:
        names = set(config.names())
        return {i for i, e in self.effects.items() if e.flag.split()[0] in names}

    def reading(self, config: m.ServerConfig, spec: m.BenchSpec, level: int) -> tuple[float | None, bool]:
        """(output tok/s at `level`, crashed): None tok/s when the server would not start."""
        on = self._set(config)
        tok = BASE_TOK_S * (level / max(spec.concurrency)) ** 0.5 * (128 / max(spec.random_input_len, 1)) ** 0.2
        crashed = False
        for i in sorted(on):
            e = self.effects[i]
            if e.startup or e.refused:
                return None, True
            if e.noop:
                continue
            tok *= e.factor
            if e.with_item is not None and e.with_item in on:
                tok *= e.pair_factor
            crashed = crashed or (e.crash and level == max(spec.concurrency))
        return tok, crashed

    def issues(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        on = self._set(config)
        out = [m.FlagIssue(flag=f.name, status="ok") for f in config.flags]
        for i in sorted(on):
            e = self.effects[i]
            name = e.flag.split()[0]
            if e.refused:
                out = [x for x in out if x.flag != name]
                out.append(m.FlagIssue(flag=name, status="unknown", message="unrecognized argument (the formula)"))
            elif e.noop:
                out = [x for x in out if x.flag != name]
                out.append(m.FlagIssue(flag=name, status="noop", message="accepted but read nowhere (the formula)"))
        return out


@dataclass(frozen=True)
class FormulaPredictor:
    """The formula itself, noise-free: what the engine offers as its Predictor."""

    formula: Formula
    name: str = "the test formula"

    def predict(self, config: m.ServerConfig, spec: m.BenchSpec, level: int) -> Prediction:
        tok, crashed = self.formula.reading(config, spec, level)
        if tok is None:
            return Prediction(crashed=True, error="the server would not start (the formula)")
        if crashed:
            return Prediction(bench_level(level, 0.0, completed=0, failed=level), crashed=True)
        return Prediction(bench_level(level, tok))


class FormulaDeployment:
    """A server of the formula engine: benchmarks answer at once, with the engine's noise."""

    argv: list[str] | None = None

    def __init__(self, engine: FormulaEngine, config: m.ServerConfig, log_path: Path) -> None:
        self.engine, self.config, self.log_path = engine, config, log_path
        self.base_url = "formula://test"
        self.level_telemetry: list[m.Telemetry] = []
        self.failure: str | None = None
        self._alive = True
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("The server is fired up and ready to roll!\n", encoding="utf-8")

    def wait_ready(self, timeout_s: float, on_progress: Any = None) -> None:
        if not self._alive:
            raise PivotError("the formula server is not running")

    def alive(self) -> bool:
        return self._alive

    def log_tail(self, n: int = 50) -> list[str]:
        return self.log_path.read_text(encoding="utf-8").splitlines()[-n:]

    def benchmark(
        self, spec: m.BenchSpec, on_progress: Any = None, *, on_level: Any = None, output_file: Path | None = None
    ) -> m.BenchResult:
        self.engine.calls.append(("benchmark", str(self.config)))
        if self.engine.hook is not None:
            self.engine.hook("benchmark", self)
        rng = random.Random(self.engine.seed)
        drift = (1 + self.engine.drift) ** (sum(1 for k, _ in self.engine.calls if k == "benchmark") - 1)
        result = m.BenchResult(spec=spec, engine="formula", source="simulated")
        for c in spec.concurrency:
            tok, crashed = self.engine.formula.reading(self.config, spec, c)
            if not self._alive or crashed or tok is None:
                result.levels.append(bench_level(c, 0.0, completed=0, failed=c, errors={"server crashed": c}))
                self._alive, self.failure = False, "cuda-error"
                continue
            tok *= drift  # a host that speeds up (or slows down) run after run
            noisy = tok * (1 + rng.gauss(0, self.engine.noise)) if self.engine.noise else tok
            result.levels.append(bench_level(c, noisy))
        self.level_telemetry = [m.Telemetry(source="simulated", gpus=[], max_concurrency=c) for c in spec.concurrency]
        result.finished_at = m.utcnow()
        return result

    def telemetry(self) -> m.Telemetry:
        return m.Telemetry(source="simulated", gpus=[])

    def metrics(self) -> dict[str, Any]:
        return {"source": "simulated"}

    def profile(self, out_dir: Path, spec: m.BenchSpec | None = None) -> m.ProfileSummary:
        raise PivotError("the formula engine has no profiler")

    def stop(self) -> None:
        self._alive = False


class FormulaEngine(BaseEngine):
    """The engine of a Formula (see the module docstring); `hook(event, deployment)` lets a test kill or fail it."""

    name = "formula"
    ready_timeout_s = 5.0

    def __init__(self, formula: Formula, noise: float = 0.0, seed: int = 0, hook: Any = None, calls: Any = None,
                 drift: float = 0.0):  # fmt: skip
        self.formula, self.noise, self.seed, self.hook, self.drift = formula, noise, seed, hook, drift
        self.calls: list[tuple[str, str]] = calls if calls is not None else []

    def with_seed(self, seed: int) -> FormulaEngine:
        return FormulaEngine(self.formula, self.noise, seed, self.hook, self.calls, self.drift)

    def validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        return self.formula.issues(config)

    def predictor(self, target: m.Target) -> FormulaPredictor:
        return FormulaPredictor(self.formula)

    def start(
        self, config: m.ServerConfig, log_path: Path, *, ledger: LedgerLink | None, issues: list[m.FlagIssue]
    ) -> FormulaDeployment:
        """The server of `config`, past BaseEngine.launch's audit gate."""
        self.calls.append(("launch", str(config)))
        if self.hook is not None:
            self.hook("launch", config)
        on = self.formula._set(config)
        if any(self.formula.effects[i].startup for i in on):
            raise LaunchFailed("out of memory at startup (the formula)", failure="oom")
        return FormulaDeployment(self, config, log_path)


def formula_plan(
    effects: dict[str, Effect],
    tiers: dict[str, int],
    expected: dict[str, str] | None = None,
    workloads: dict[str, dict[str, Any]] | None = None,
    name: str = "formula",
) -> m.Plan:
    """A plan of one flag item per effect (a workload item, with its overrides, where `workloads` names it), on a
    target pivot has profiles for (so the analysis and the plan checks have something to read)."""
    items = []
    for i, e in effects.items():
        workload = (workloads or {}).get(i)
        items.append(
            m.PlanItem(
                id=i,
                tier=tiers[i],
                title=f"Knob {i}",
                kind="workload" if workload else "flag",
                flags=m.ServerConfig.parse(e.flag),
                workload=workload,
                hypothesis="It might help.",
                expected_impact=(expected or {}).get(i, "+2-5% output tok/s"),
            )
        )
    return m.Plan(
        name=name,
        title="A plan of formula items",
        target=m.Target(
            model="org/formula-70b",
            model_profile="llama-3.3-70b-fp8",
            hardware="h200",
            gpus=1,
            flags=m.ServerConfig.parse("--tp-size 1"),
        ),
        workload=m.BenchSpec(random_input_len=128, random_output_len=64, concurrency=[1, 64]),
        tiers={t: f"tier {t}" for t in sorted(set(tiers.values()))},
        items=items,
    )


def run_to_the_end(home: Path, plan: m.Plan, engine: FormulaEngine, settings: m.SessionSettings,
                   continues: int = 4) -> tuple[Any, str, Any]:  # fmt: skip
    """A formula campaign through the real loop in a home of its own, `continue` at each pivot (up to `continues`):
    (its store, its session id, the last run's outcome)."""
    from agent import loop
    from agent.session import Paths, Session
    from agent.store import Store

    paths = Paths.from_env(home)
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    store = Store(paths.db_path)
    with Session.create(store, paths, plan, engine=engine, settings=settings) as s:
        sid = s.id
    with Session.open(store, paths, sid, engine=engine) as s:
        out = loop.run(s)
    for _ in range(continues):
        if out.status != "pivot":
            break
        with Session.open(store, paths, sid, engine=engine) as s:
            out = loop.run(s, answer="continue")
    return store, sid, out
