"""What every part of the analysis shares: thresholds, number formatting, a finding's constructor, and how an
experiment's flags split the model (tp, pp, ep) as its engine reads them."""

from __future__ import annotations

from dataclasses import asdict
from typing import Protocol

from agent import models as m
from agent.contracts import Engine, load_engine
from agent.errors import PivotError
from agent.store import Store
from tools.profiles import ModelProfile, model_for

GB = 1e9
GIB = float(1 << 30)
STOPPED_EXPONENT = 0.2
SUBLINEAR_EXPONENT = 0.8
KV_FULL = 0.9
LOW_POWER_SHARE = 0.5
SMALL_GEMM_SHARE_OF_PEAK = 0.25
ACTIVATION_BYTES = {"nvfp4": 0.5625, "fp4": 0.5, "fp8": 1.0}  # W4A4 / W8A8 quantize activations too; else bf16


class SessionLike(Protocol):
    """What the analysis needs of a session: its ledger and its id (agent.session.Session has both)."""

    store: Store

    @property
    def id(self) -> str: ...


def _n(value: float, decimals: int = 0) -> str:
    """A number as the findings print it (thousands separators, fixed decimals)."""
    return f"{value:,.{decimals}f}"


def _rows(value: float) -> str:
    """Rows per expert: two decimals below 1, one below 10, whole numbers above."""
    return _n(value, 2 if value < 1 else 1 if value < 10 else 0)


def _finding(kind: str, text: str, values: dict[str, float], **kw) -> m.Finding:
    return m.Finding(kind=kind, text=text, values={k: float(v) for k, v in values.items()}, **kw)


def flag_value(config: m.ServerConfig, *names_: str) -> str | None:
    """The value of the last of these spellings set in `config`, as typed."""
    found = None
    for flag in config.flags:
        if flag.name in names_ and flag.value is not None:
            found = flag.value if isinstance(flag.value, str) else flag.value[0]
    return found


def layout(config: m.ServerConfig, server_info: dict | None = None, *, engine: Engine | None) -> dict[str, int]:
    """tp, pp and ep as the engine reads its flags (Engine.parallelism), else the server's own report, else 1.

    Without an engine (its plugin is not installed here) only the server's report is read."""
    degrees = asdict(engine.parallelism(config)) if engine is not None else {}
    out = {}
    for key in ("tp", "pp", "ep"):
        value: object = degrees.get(key, 1)
        if value == 1 and server_info:
            value = server_info.get(f"{key}_size") or (server_info.get("resolved") or {}).get(f"{key}_size") or 1
        try:
            out[key] = max(int(value), 1)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            out[key] = 1
    return out


def session_engine(record: m.Session) -> Engine | None:
    """The session's engine, built from its name and options, for what only the engine knows (how its flags split
    the model); None when it cannot be built here (its plugin is not installed, or its options are refused)."""
    try:
        return load_engine(record.engine, **record.settings.engine_options)
    except PivotError:
        return None


def _plan_engine(target: m.Target) -> Engine | None:
    """The engine a plan names, with default options, for how its flags split the model; None when it cannot be
    built here."""
    try:
        return load_engine(target.engine)
    except PivotError:
        return None


def _model_profile(target: m.Target) -> ModelProfile:
    return model_for(target.model_profile, target.model)
