"""Cancelling a step of the agent cleanly: the server stops now, and the tool in flight records nothing it did not
finish.

The agent's sync tools run in worker threads, which cannot be interrupted. So the session's engine is wrapped:
every deployment it launches is tracked, and once the step is cancelled its servers are stopped (a server still
starting too, which the session does not hold yet) and each call into a deployment (`wait_ready`, `benchmark`)
or the engine (`launch`) ends with StepCancelled instead of returning what the stopped server gave. The tools do
not catch StepCancelled, so a benchmark cut short is not recorded as failed levels and a launch cut short is not
recorded as a server that did not start: the experiment stays `running` until the controller marks it
`interrupted`, exactly as a resume after Ctrl-C of `pivot run` finds it.

The wrappers forward everything else (attributes, and the wrapped methods' signatures, which tools inspect).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from agent.session import Deployment, Engine


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
            errors.append(f"{getattr(deployment, 'base_url', '?')}: {type(e).__name__}: {e}")
    return errors


def _guarded(method: Callable[..., Any], canceller: Canceller) -> Callable[..., Any]:
    """`method` that refuses to start, and refuses to return, once the step is cancelled. functools.wraps keeps
    its signature visible to inspect.signature (run_benchmark looks for `output_file`, launch for `ledger`)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        canceller.check()
        try:
            value = method(*args, **kwargs)
        except Exception as e:
            if canceller.cancelled:  # the server was stopped under it: that is the cancel, not a failure
                raise StepCancelled("the step was cancelled") from e
            raise
        canceller.check()
        return value

    return call


class CancellableDeployment:
    """A deployment whose calls end with StepCancelled once the step is cancelled; stop() always goes through."""

    _GUARDED = frozenset({"wait_ready", "benchmark"})

    def __init__(self, inner: Deployment, canceller: Canceller) -> None:
        self._inner = inner
        self._canceller = canceller

    @property
    def inner(self) -> Deployment:
        return self._inner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._inner, name)
        if name in self._GUARDED and callable(value):
            return _guarded(value, self._canceller)
        return value

    def stop(self) -> None:
        self._inner.stop()

    def __repr__(self) -> str:
        return f"CancellableDeployment({self._inner!r})"


class CancellableEngine:
    """An engine whose launches are tracked and wrapped in CancellableDeployment.

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

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never build the engine for private lookups (copy, pickle, repr internals)
            raise AttributeError(name)
        value = getattr(self.inner, name)
        if name == "launch" and callable(value):
            return self._launcher(value)
        if name == "with_seed" and callable(value):

            @functools.wraps(value)
            def with_seed(seed: int) -> CancellableEngine:
                return CancellableEngine(value(seed), self._canceller)

            return with_seed
        return value

    def _launcher(self, launch: Callable[..., Deployment]) -> Callable[..., Deployment]:
        canceller = self._canceller

        @functools.wraps(launch)
        def call(*args: Any, **kwargs: Any) -> Deployment:
            canceller.check()
            deployment = CancellableDeployment(launch(*args, **kwargs), canceller)
            if not canceller.track(deployment):
                deployment.stop()
                raise StepCancelled("the step was cancelled")
            return deployment

        return call

    def __repr__(self) -> str:
        return f"CancellableEngine({self._inner or self._factory!r})"
