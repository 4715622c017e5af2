"""Discovery of tool plugins and engines through entry points, the same way for built-in and third-party ones.

Three grains, as harlequin does it: list names without importing anything; load one, with an error
that names the plugin and the cause; load all, warning about the ones that fail and keeping the rest.

- group `pivot.tools`: each entry point names a pydantic-ai toolset (usually a `FunctionToolset`),
  e.g. `todo = "tools.todo:toolset"`. Its tools' names and docstrings are what the model sees.
- group `pivot.engines`: each entry point names an engine factory, a callable that builds an
  `agent.contracts.Engine` (usually the engine class itself), e.g. `sim = "tools.engines.sim:SimEngine"`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

from agent.errors import PluginError

if TYPE_CHECKING:  # pydantic-ai is imported when a toolset is loaded, not by every command that lists engines
    from pydantic_ai.toolsets import AbstractToolset

TOOLS_GROUP = "pivot.tools"
ENGINES_GROUP = "pivot.engines"
GROUPS = (TOOLS_GROUP, ENGINES_GROUP)


class PluginWarning(UserWarning):
    """A plugin failed to load; the others were loaded."""


@dataclass(frozen=True)
class PluginInfo:
    """An installed plugin as its entry point declares it, known without importing it."""

    group: str
    name: str
    value: str
    dist: str | None

    @classmethod
    def from_entry_point(cls, ep: EntryPoint) -> PluginInfo:
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else None
        return cls(group=ep.group, name=ep.name, value=ep.value, dist=dist)


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded, and why."""

    plugin: PluginInfo
    error: str

    def __str__(self) -> str:
        origin = f" (from {self.plugin.dist})" if self.plugin.dist else ""
        return f"plugin {self.plugin.name!r}{origin} in {self.plugin.group} failed to load: {self.error}"


@dataclass
class Loaded:
    """The plugins of one group that loaded, by name, and the ones that did not."""

    plugins: dict[str, Any] = field(default_factory=dict)
    infos: dict[str, PluginInfo] = field(default_factory=dict)
    failures: list[PluginFailure] = field(default_factory=list)


def _entry_points(group: str) -> list[EntryPoint]:
    if group not in GROUPS:
        raise PluginError(f"unknown plugin group {group!r}", hint=f"groups: {', '.join(GROUPS)}")
    seen: set[tuple[str, str]] = set()
    out = []
    for ep in entry_points(group=group):
        if (ep.name, ep.value) not in seen:  # the same distribution can be on sys.path twice
            seen.add((ep.name, ep.value))
            out.append(ep)
    return out


def available(group: str) -> list[PluginInfo]:
    """The plugins installed in `group`, without importing any of them."""
    return [PluginInfo.from_entry_point(ep) for ep in _entry_points(group)]


def _check(group: str, obj: Any) -> None:
    if group == TOOLS_GROUP:  # pydantic-ai only when a toolset is loaded: an engine's command never needs it
        from pydantic_ai.toolsets import AbstractToolset

        if not isinstance(obj, AbstractToolset):
            raise TypeError(f"expected a pydantic-ai toolset (e.g. FunctionToolset), got {type(obj).__name__}")
    if group == ENGINES_GROUP and not callable(obj):
        raise TypeError(f"expected an engine factory (a callable returning an Engine), got {type(obj).__name__}")


def _load(ep: EntryPoint) -> Any:
    info = PluginInfo.from_entry_point(ep)
    try:
        obj = ep.load()
        _check(ep.group, obj)
    except Exception as e:
        failure = PluginFailure(info, f"{type(e).__name__}: {e}")
        raise PluginError(str(failure), hint=f"its entry point is {ep.name} = {ep.value!r}") from e
    return obj


def load(group: str, name: str) -> Any:
    """Load one plugin by name; PluginError names it and the cause when it is missing or broken."""
    matches = [ep for ep in _entry_points(group) if ep.name == name]
    if not matches:
        known = ", ".join(sorted({p.name for p in available(group)})) or "none installed"
        raise PluginError(f"no plugin {name!r} in {group}", hint=f"installed: {known}")
    return _load(matches[0])


def load_all(group: str, on_failure: Callable[[PluginFailure], None] | None = None) -> Loaded:
    """Load every plugin of `group`; each failure is reported (a PluginWarning by default) and skipped."""
    report = on_failure or (lambda f: warnings.warn(str(f), PluginWarning, stacklevel=3))
    loaded = Loaded()
    for ep in _entry_points(group):
        info = PluginInfo.from_entry_point(ep)
        if ep.name in loaded.infos:
            first = loaded.infos[ep.name]
            failure = PluginFailure(info, f"the name is already taken by {first.value} ({first.dist}); skipped")
            loaded.failures.append(failure)
            report(failure)
            continue
        try:
            loaded.plugins[ep.name] = _load(ep)
            loaded.infos[ep.name] = info
        except PluginError as e:
            cause = e.__cause__
            failure = PluginFailure(info, f"{type(cause).__name__}: {cause}" if cause else e.message)
            loaded.failures.append(failure)
            report(failure)
    return loaded


def describe_tools(toolset: AbstractToolset) -> list[tuple[str, str]]:
    """(name, first line of the description) for each tool of a toolset that lists its tools statically."""
    from pydantic_ai.toolsets import FunctionToolset

    if isinstance(toolset, FunctionToolset):
        return [(name, (tool.description or "").strip().split("\n", 1)[0]) for name, tool in toolset.tools.items()]
    return []


def describe(obj: Any) -> str:
    """The first line of an object's docstring."""
    return ((getattr(obj, "__doc__", None) or "").strip().split("\n", 1) or [""])[0]
