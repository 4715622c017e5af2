"""The one error base: a message for the user and a hint of what to do, shown without a traceback."""

from __future__ import annotations


class PivotError(Exception):
    """An error the user can act on; the CLI prints `message` and `hint` and exits 1."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class LedgerError(PivotError):
    """The ledger (state/pivot.db) cannot be opened or is not one pivot can use."""


class SessionLocked(PivotError):
    """Another live process is working on this session."""


class SessionNotFound(PivotError):
    """No session matches the reference the user gave."""


class PlanError(PivotError):
    """A plan file is missing, not TOML, or does not follow the plan format."""


class PluginError(PivotError):
    """A plugin could not be found or loaded."""


class LaunchFailed(PivotError):
    """A server did not start (or not in time); `failure` is the class pivot records (oom, startup-timeout, ...)."""

    def __init__(self, message: str, hint: str | None = None, *, failure: str) -> None:
        super().__init__(message, hint)
        self.failure = failure
