"""The one error base: a message for the user and a hint of what to do, shown without a traceback."""

from __future__ import annotations

import os
import re

# Environment variables whose values are secrets: model and provider API keys, tokens, passwords.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)

# The secrets a launched process never inherits, by their names: model and provider API keys (..._API_KEY,
# HEROKU_INFERENCE_KEY: ..._KEY), tokens, secrets and passwords, credentials, and AWS's access keys.
LAUNCH_SECRET_NAME = re.compile(
    r"(_KEY|_TOKEN|PASSWORD|PASSWD|CREDENTIALS?|_KEY_ID)$|SECRET|ACCESS_KEY|^(API_KEY|TOKEN|KEY)$", re.IGNORECASE
)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says its value is a secret (LAUNCH_SECRET_NAME): what pivot never
    passes on to a process it launches. Redaction (SECRET_NAME) is broader: it may as well hide too much."""
    return LAUNCH_SECRET_NAME.search(name) is not None


_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{6,}")
_KEYLIKE = re.compile(r"\b(sk|pk|rk|key|api|tok)([-_])[A-Za-z0-9_\-]{8,}", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with secrets replaced by [redacted]: the values of secret environment variables (names with KEY,
    TOKEN, SECRET or PASSWORD; values of 8 characters or more), bearer tokens and key-shaped words (`sk-...`,
    `key_...`). The one redaction of pivot: for anything a server or a model sent back that pivot shows or records."""
    for name, value in os.environ.items():
        if len(value) >= 8 and value in text and SECRET_NAME.search(name):
            text = text.replace(value, "[redacted]")
    text = _BEARER.sub(r"\1 [redacted]", text)
    return _KEYLIKE.sub(r"\1\2[redacted]", text)


class PivotError(Exception):
    """An error the user can act on; the CLI prints `message` and `hint` and exits 1."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class Interrupted(PivotError):
    """The user stopped a command (Ctrl-C); the message says what was kept and the hint how to go on."""


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


class RequestsRefused(PivotError):
    """The server is up but refused every request of the benchmark's first level (an HTTP error before anything was
    measured): an outcome of the experiment, recorded with `failure` and the server's words in `detail`."""

    failure = "request-refused"

    def __init__(self, message: str, hint: str | None = None, *, detail: str) -> None:
        super().__init__(message, hint)
        self.detail = detail


class LaunchFailed(PivotError):
    """A server did not start (or not in time); `failure` is the class pivot records (oom, startup-timeout, ...)."""

    def __init__(self, message: str, hint: str | None = None, *, failure: str) -> None:
        super().__init__(message, hint)
        self.failure = failure
