"""Cancelling a step of the agent cleanly: the server stops now, and the tool in flight records nothing it did not
finish.

The agent's sync tools run in worker threads, which cannot be interrupted. So the session's engine is wrapped:
every deployment it launches is tracked, and once the step is cancelled its servers are stopped (a server still
starting too, which the session does not hold yet) and each call into a deployment (`wait_ready`, `benchmark`)
or the engine (`launch`) ends with StepCancelled instead of returning what the stopped server gave. The tools do
not catch StepCancelled, so a benchmark cut short is not recorded as failed levels and a launch cut short is not
recorded as a server that did not start: the experiment stays `running` until the controller marks it
`interrupted`, exactly as a resume after Ctrl-C of `pivot run` finds it.

Both wrappers implement the Engine and Deployment protocols member by member, so nothing needs to look inside.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from agent import models as m
from agent.contracts import (
    Deployment,
    Diagnosis,
    Engine,
    EngineOptions,
    FlagAudit,
    LedgerLink,
    LevelCallback,
    Parallelism,
    Predictor,
    ProgressCallback,
)

T = TypeVar("T")


class StepCancelled(Exception):
    """The user cancelled the step; raised in the tool's thread at its next call into the engine."""


class Canceller:
    """One step's cancel flag and the deployments launched during the session (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._deployments: list[Deployment] = []

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def reset(self) -> None:
        """A new step begins; deployments of earlier steps that were stopped are forgotten."""
        with self._lock:
            self._event.clear()
            self._deployments = [d for d in self._deployments if _alive(d)]

    def check(self) -> None:
        if self._event.is_set():
            raise StepCancelled("the step was cancelled")

    def track(self, deployment: Deployment) -> bool:
        """Remember a new deployment; False when the step was cancelled meanwhile (the caller stops it)."""
        with self._lock:
            self._deployments.append(deployment)
            return not self._event.is_set()

    def cancel(self) -> list[Deployment]:
        """Set the flag; returns the deployments to stop."""
        with self._lock:
            self._event.set()
            return list(self._deployments)

    def deployments(self) -> list[Deployment]:
        with self._lock:
            return list(self._deployments)


def _alive(deployment: Deployment) -> bool:
    try:
        return bool(deployment.alive())
    except Exception:
        return False


def stop_quietly(deployments: list[Deployment]) -> list[str]:
    """Stop each deployment (safe to call twice); returns the errors, one line each."""
    errors = []
    for deployment in deployments:
        try:
            deployment.stop()
        except Exception as e:  # one that fails to stop must not keep the others running
            errors.append(f"{deployment.base_url}: {type(e).__name__}: {e}")
    return errors


class CancellableDeployment:
    """A deployment whose calls end with StepCancelled once the step is cancelled; stop() always goes through.

    It is a Deployment itself: every member of the protocol is written out and passed to the inner deployment."""

    def __init__(self, inner: Deployment, canceller: Canceller) -> None:
        self._inner = inner
        self._canceller = canceller

    @property
    def inner(self) -> Deployment:
        return self._inner

    def _guard(self, call: Callable[[], T]) -> T:
        """`call` refused before it starts and before it returns once the step is cancelled."""
        self._canceller.check()
        try:
            value = call()
        except Exception as e:
            if self._canceller.cancelled:  # the server was stopped under it: that is the cancel, not a failure
                raise StepCancelled("the step was cancelled") from e
            raise
        self._canceller.check()
        return value

    @property
    def base_url(self) -> str:
        return self._inner.base_url

    @property
    def argv(self) -> list[str] | None:
        return self._inner.argv

    @property
    def log_path(self) -> Path | None:
        return self._inner.log_path

    @property
    def level_telemetry(self) -> list[m.Telemetry]:
        return self._inner.level_telemetry

    @property
    def failure(self) -> str | None:
        return self._inner.failure

    def wait_ready(self, timeout_s: float, on_progress: ProgressCallback | None = None) -> None:
        self._guard(lambda: self._inner.wait_ready(timeout_s, on_progress))

    def alive(self) -> bool:
        return self._inner.alive()

    def log_tail(self, n: int = 50) -> list[str]:
        return self._inner.log_tail(n)

    def benchmark(
        self,
        spec: m.BenchSpec,
        on_progress: ProgressCallback | None = None,
        *,
        on_level: LevelCallback | None = None,
        output_file: Path | None = None,
    ) -> m.BenchResult:
        return self._guard(lambda: self._inner.benchmark(spec, on_progress, on_level=on_level, output_file=output_file))

    def telemetry(self) -> m.Telemetry:
        return self._inner.telemetry()

    def metrics(self) -> dict[str, Any]:
        return self._inner.metrics()

    def profile(self, out_dir: Path, spec: m.BenchSpec | None = None) -> m.ProfileSummary:
        return self._guard(lambda: self._inner.profile(out_dir, spec))

    def stop(self) -> None:
        self._inner.stop()

    def __repr__(self) -> str:
        return f"CancellableDeployment({self._inner!r})"


class CancellableEngine:
    """An engine whose launches are tracked and wrapped in CancellableDeployment; an Engine itself.

    `factory` (instead of `inner`) builds the engine on first use: opening a session of an engine this host cannot build (sglang
    on a laptop) still shows its ledger, as `pivot show` does, and fails only when the agent launches a server.
    """

    def __init__(
        self, inner: Engine | None, canceller: Canceller, *, factory: Callable[[], Engine] | None = None
    ) -> None:
        if inner is None and factory is None:
            raise ValueError("an engine or a factory is needed")
        self._inner, self._factory = inner, factory
        self._canceller = canceller
        self._lock = threading.Lock()

    @property
    def inner(self) -> Engine:
        with self._lock:
            if self._inner is None:
                assert self._factory is not None
                self._inner = self._factory()
            return self._inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def ready_timeout_s(self) -> float:
        return self.inner.ready_timeout_s

    @property
    def gauges(self) -> Mapping[str, str]:
        return self.inner.gauges

    @property
    def Options(self) -> type[EngineOptions] | None:  # the protocol's name for the options model
        return self.inner.Options

    @property
    def model_flags(self) -> Sequence[str]:
        return self.inner.model_flags

    def predictor(self, target: m.Target) -> Predictor | None:
        return self.inner.predictor(target)

    def validate(self, config: m.ServerConfig) -> list[m.FlagIssue]:
        return self.inner.validate(config)

    def audit(self, config: m.ServerConfig, *, version: str | None = None, source: Path | None = None) -> FlagAudit:
        return self.inner.audit(config, version=version, source=source)

    def parallelism(self, config: m.ServerConfig) -> Parallelism:
        return self.inner.parallelism(config)

    def not_modelled(self, config: m.ServerConfig) -> list[str]:
        return self.inner.not_modelled(config)

    def diagnose(self, lines: Sequence[str]) -> Diagnosis:
        return self.inner.diagnose(lines)

    def with_seed(self, seed: int) -> CancellableEngine:
        return CancellableEngine(self.inner.with_seed(seed), self._canceller)

    def launch(
        self,
        config: m.ServerConfig,
        log_path: Path,
        *,
        ledger: LedgerLink | None = None,
        force: bool = False,
        issues: Sequence[m.FlagIssue] | None = None,
    ) -> CancellableDeployment:
        self._canceller.check()
        deployment = CancellableDeployment(
            self.inner.launch(config, log_path, ledger=ledger, force=force, issues=issues), self._canceller
        )
        if not self._canceller.track(deployment):
            deployment.stop()
            raise StepCancelled("the step was cancelled")
        return deployment

    def __repr__(self) -> str:
        return f"CancellableEngine({self._inner or self._factory!r})"
