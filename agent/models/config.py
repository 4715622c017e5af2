"""Server configuration: ordered flags, as typed, in SGLang's spelling (Flag, FlagChange, ConfigDiff, ServerConfig)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from agent.errors import PivotError
from agent.models.base import _Model

# --------------------------------------------------------------------------------------------------
# Server configuration: ordered flags, as typed, in SGLang's spelling.

_FLAG_NAME = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_.-]*$|^-[A-Za-z][A-Za-z0-9]*$")  # -x, and vLLM's -tp, -O3


def _is_flag_token(token: str) -> bool:
    """True for `--name`, `--name=value`, `-x` and vLLM's `-tp`; false for values such as `-1` or `0.5`."""
    if token.startswith("--"):
        return len(token) > 2
    return len(token) >= 2 and token[0] == "-" and token[1].isalpha() and "=" not in token


class Flag(_Model):
    """One command-line flag as the user typed it: `--tp-size 8`, `--enable-mscclpp`, `--cuda-graph-bs-decode 1 2 4`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The flag with its dashes, exactly as typed, e.g. `--tp-size`.")
    value: str | tuple[str, ...] | None = Field(
        default=None, description="None for a switch, a string for one value, a tuple for several."
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not _FLAG_NAME.match(name):
            raise ValueError(f"{name!r} is not a command-line flag (flags look like --name)")
        return name

    def argv(self) -> list[str]:
        """The flag and its values as separate argv tokens."""
        if self.value is None:
            return [self.name]
        if isinstance(self.value, tuple):
            return [self.name, *self.value]
        return [self.name, self.value]

    def __str__(self) -> str:
        return shlex.join(self.argv())


SWITCH_ON = "(on)"  # how a diff shows the value of a flag that takes none


class FlagChange(_Model):
    """A flag (or environment variable) whose value differs between two configs; None means absent."""

    name: str
    old: str | None
    new: str | None

    def __str__(self) -> str:
        if self.old is None:
            return self.name if self.new == SWITCH_ON else f"{self.name} {self.new}"
        if self.new is None:
            return f"without {self.name}"
        return f"{self.name} {self.old} -> {self.new}"


class ConfigDiff(_Model):
    """What changed from one ServerConfig to another, flag by flag and variable by variable."""

    flags: list[FlagChange] = []
    env: list[FlagChange] = []
    power_limit: FlagChange | None = Field(default=None, description="The GPU power limit, when it changed.")

    @property
    def empty(self) -> bool:
        return not self.flags and not self.env and self.power_limit is None

    def __str__(self) -> str:
        parts = [str(c) for c in self.flags] + [f"env {c}" for c in self.env]
        if self.power_limit is not None:
            parts.append(str(self.power_limit))
        return ", ".join(parts) if parts else "(no change)"


def _render_value(flag: Flag | None) -> str | None:
    if flag is None:
        return None
    return " ".join(flag.argv()[1:])


class ServerConfig(_Model):
    """An engine's command line as ordered flags in the engine's own spelling, plus its environment.

    The order is kept because it is what the user typed and what the launch log shows; when a flag
    appears twice, the last one wins, as with argparse.
    """

    flags: tuple[Flag, ...] = ()
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the server.")
    gpu_power_limit_w: float | None = Field(
        default=None,
        gt=0,
        description="The power limit set on each of the server's GPUs for the experiment (NVML), restored after; "
        "None leaves the GPUs' limit as it is.",
    )

    @classmethod
    def parse(cls, args: str | Sequence[str] | None, env: dict[str, str] | None = None) -> ServerConfig:
        """Build a config from a command-line string (split like a POSIX shell, never run by one) or argv list."""
        if args is None:
            return cls(env=dict(env or {}))
        try:
            tokens = shlex.split(args) if isinstance(args, str) else [str(t) for t in args]
        except ValueError as e:  # an unclosed quote
            raise PivotError(f"cannot split {args!r} into arguments: {e}") from e
        flags: list[Flag] = []
        name: str | None = None
        values: list[str] = []

        def close() -> None:
            if name is not None:
                value: str | tuple[str, ...] | None
                value = None if not values else values[0] if len(values) == 1 else tuple(values)
                flags.append(Flag(name=name, value=value))

        for token in tokens:
            if _is_flag_token(token):
                close()
                name, values = token, []
                if token.startswith("--") and "=" in token:
                    name, _, inline = token.partition("=")
                    values = [inline]
            elif name is None:
                raise PivotError(
                    f"unexpected argument {token!r} before any flag",
                    hint="server configs are flags only, e.g. '--tp-size 8 --enable-mscclpp'",
                )
            else:
                values.append(token)
        close()
        return cls(flags=tuple(flags), env=dict(env or {}))

    @model_validator(mode="before")
    @classmethod
    def _accept_argv(cls, data: Any) -> Any:
        """Plans and tools may give flags as a command-line string or an argv list."""
        try:
            if isinstance(data, str | list):
                return cls.parse(data).model_dump()
            if isinstance(data, dict) and isinstance(data.get("flags"), str | list):
                items = data["flags"]
                if isinstance(items, str) or all(isinstance(t, str) for t in items):
                    return {**data, "flags": cls.parse(items).flags}
        except PivotError as e:
            raise ValueError(e.message) from e
        return data

    def argv(self) -> list[str]:
        """The flags as an argv list, ready for subprocess without a shell."""
        return [token for flag in self.flags for token in flag.argv()]

    def command_line(self, command: Sequence[str]) -> str:
        """The line a user pastes into a shell to run `command` with these flags: the environment first, then the
        command, then the flags (a power limit, which is set on the GPU and not on the command, after it)."""
        env = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        text = " ".join([*env, shlex.join([*command, *self.argv()])])
        if self.gpu_power_limit_w is not None:
            text = f"{text} [{power_limit_text(self.gpu_power_limit_w)}]"
        return text

    def __str__(self) -> str:
        text = shlex.join(self.argv())
        if self.env:
            text = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())) + " " + text
        if self.gpu_power_limit_w is not None:
            text = f"{text} [{power_limit_text(self.gpu_power_limit_w)}]".lstrip()
        return text

    def names(self) -> list[str]:
        """Flag names in order of first appearance."""
        return list(dict.fromkeys(f.name for f in self.flags))

    def get(self, name: str) -> Flag | None:
        """The flag with this exact name (the last one, if repeated), or None."""
        found = [f for f in self.flags if f.name == name]
        return found[-1] if found else None

    def __contains__(self, name: object) -> bool:
        return any(f.name == name for f in self.flags)

    def with_flags(self, other: ServerConfig | str | Sequence[str]) -> ServerConfig:
        """A copy with `other`'s flags set: a flag already present is replaced where it stood, new ones go last."""
        extra = other if isinstance(other, ServerConfig) else ServerConfig.parse(other)
        updates = {f.name: f for f in extra.flags}  # the last of a repeated flag wins
        existing = set(self.names())
        out: list[Flag] = []
        for flag in self.flags:
            if flag.name not in updates:
                out.append(flag)
            elif updates[flag.name] not in out:
                out.append(updates[flag.name])
        out.extend(f for name, f in updates.items() if name not in existing)
        power = extra.gpu_power_limit_w if extra.gpu_power_limit_w is not None else self.gpu_power_limit_w
        return ServerConfig(flags=tuple(out), env={**self.env, **extra.env}, gpu_power_limit_w=power)

    def without(self, *names: str) -> ServerConfig:
        """A copy without the named flags."""
        drop = set(names)
        return ServerConfig(
            flags=tuple(f for f in self.flags if f.name not in drop),
            env=dict(self.env),
            gpu_power_limit_w=self.gpu_power_limit_w,
        )

    def with_power_limit(self, watts: float | None) -> ServerConfig:
        """A copy whose GPUs run under this power limit (None: the GPUs' own)."""
        return self.model_copy(update={"gpu_power_limit_w": None if watts is None else float(watts)})

    def diff(self, base: ServerConfig) -> ConfigDiff:
        """What this config changes relative to `base`."""
        flags: list[FlagChange] = []
        for name in dict.fromkeys([*base.names(), *self.names()]):
            old, new = base.get(name), self.get(name)
            if old != new:
                old_text = None if old is None else (_render_value(old) or SWITCH_ON)
                new_text = None if new is None else (_render_value(new) or SWITCH_ON)
                flags.append(FlagChange(name=name, old=old_text, new=new_text))
        env = [
            FlagChange(name=k, old=base.env.get(k), new=self.env.get(k))
            for k in sorted(set(base.env) | set(self.env))
            if base.env.get(k) != self.env.get(k)
        ]
        power = None
        if base.gpu_power_limit_w != self.gpu_power_limit_w:
            power = FlagChange(
                name=POWER_LIMIT_NAME,
                old=None if base.gpu_power_limit_w is None else f"{base.gpu_power_limit_w:g} W",
                new=None if self.gpu_power_limit_w is None else f"{self.gpu_power_limit_w:g} W",
            )
        return ConfigDiff(flags=flags, env=env, power_limit=power)


POWER_LIMIT_NAME = "GPU power limit"


def power_limit_text(watts: float) -> str:
    """ "GPU power limit 450 W": how configs and diffs write it."""
    return f"{POWER_LIMIT_NAME} {watts:g} W"
