"""Load and validate plans (TOML); every error names the file, the line and the field.

A plan file looks like this (see plans/ for complete ones):

    name = "glm5-nvfp4-rtxpro6000x8"
    title = "GLM-5-NVFP4 on 8x RTX PRO 6000 Blackwell"

    [target]
    model = "lukealonso/GLM-5-NVFP4"
    hardware = "rtx-pro-6000-blackwell"
    gpus = 8
    engine = "sglang"
    flags = "--tp-size 8"

    [workload]
    random_input_len = 1024
    concurrency = [1, 256, 512, 1024, 2048]

    [objective]              # optional: output tok/s (kind = "throughput") when absent
    kind = "capacity"        # throughput | goodput | capacity | energy
    tpot_ms = 100            # SLOs per request, in ms: ttft_ms, tpot_ms, e2el_ms
    attainment_target = 0.95

    [[items]]
    id = "01"
    tier = 1
    kind = "flag"
    title = "..."
    flags = "--max-running-requests 2048"
    hypothesis = "..."
    expected_impact = "..."
"""

from __future__ import annotations

import importlib.util
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.errors import PlanError
from agent.models import Experiment, Plan

MAX_PLAN_BYTES = 4 * 2**20  # the seeds' plan is 12 KB
_TABLE = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_ARRAY_TABLE = re.compile(r"^\s*\[\[\s*([^\[\]]+?)\s*\]\]\s*(#.*)?$")
_KEY = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")


def _split_key(text: str) -> tuple[str, ...]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", text)
    return tuple(p.strip("\"'") for p in parts)


def key_lines(text: str) -> dict[tuple[str | int, ...], int]:
    """Map each table and key path of a TOML document to the 1-based line that defines it.

    Array-of-tables entries get their index (`items[2].kind` is ("items", 2, "kind")). Lines inside
    multi-line strings and arrays are not keys, so only lines at the start of a statement are read.
    """
    lines: dict[tuple[str | int, ...], int] = {}
    counts: dict[tuple[str, ...], int] = {}
    table: tuple[str | int, ...] = ()
    depth = 0  # open brackets of a multi-line array or inline table
    in_string: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if in_string:
            if in_string in line:
                in_string = None
            continue
        if depth == 0:
            if match := _ARRAY_TABLE.match(line):
                name = _split_key(match.group(1))
                counts[name] = counts.get(name, -1) + 1
                table = (*name, counts[name])
                lines.setdefault(table, number)
                lines.setdefault(name, number)
                continue
            if match := _TABLE.match(line):
                table = _split_key(match.group(1))
                lines.setdefault(table, number)
                continue
            if match := _KEY.match(line):
                lines.setdefault((*table, *_split_key(match.group(1))), number)
        for quote in ('"""', "'''"):
            if line.count(quote) % 2 == 1:
                in_string = quote
                line = line.split(quote, 1)[0]
        code = re.sub(r"""("[^"\\]*(?:\\.[^"\\]*)*"|'[^']*')""", "", line).split("#", 1)[0]
        depth += code.count("[") + code.count("{") - code.count("]") - code.count("}")
        depth = max(depth, 0)
    return lines


def _line_for(lines: dict[tuple[str | int, ...], int], loc: tuple[str | int, ...]) -> int | None:
    """The line of the longest prefix of `loc` that the document defines."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _field_name(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(plan)"


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_HOME = re.compile(r"(^|(?<=[\s=]))~(?=/|$|\s)")


def expand(text: str) -> str:
    """`${NAME}` and `${NAME:-default}` replaced by the environment's value (the default when unset or empty), and a
    `~` that starts a path by the home directory: what lets a shipped plan name a model under a local cache."""

    def var(match: re.Match[str]) -> str:
        value = os.environ.get(match.group(1))
        if value:
            return value
        if match.group(2) is not None:
            return match.group(2)
        raise PlanError(
            f"${{{match.group(1)}}} is not set",
            hint=f"export {match.group(1)}, or write ${{{match.group(1)}:-DEFAULT}} in the plan",
        )

    return _HOME.sub(lambda m: m.group(1) + str(Path.home()), _VAR.sub(var, text))


def _expand_target(data: dict[str, Any]) -> None:
    """The target's model and base flags with `${VAR}` and `~` expanded (they are what a launch uses)."""
    target = data.get("target")
    if not isinstance(target, dict):
        return
    if isinstance(target.get("model"), str):
        target["model"] = expand(target["model"])
    flags = target.get("flags")
    if isinstance(flags, str):
        target["flags"] = expand(flags)
    elif isinstance(flags, dict) and isinstance(flags.get("flags"), str):
        flags["flags"] = expand(flags["flags"])


def parse_plan(text: str, source: str = "<plan>") -> Plan:
    """Parse and validate plan text; PlanError names `source`, the line and the field of the first problem. The
    target's model and base flags may name `${VAR}`, `${VAR:-default}` and `~/...` (expanded here)."""
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"{source}: not valid TOML: {e}", hint="fix the syntax at that line") from e
    except RecursionError as e:  # tomllib parses nested arrays and tables by recursion
        raise PlanError(f"{source}: nested too deeply to be a plan", hint="a plan nests a few tables, no more") from e
    data.pop("source", None)
    try:
        _expand_target(data)
    except PlanError as e:
        raise PlanError(f"{source}: target: {e.message}", hint=e.hint) from e
    try:
        plan = Plan.model_validate(data)
    except ValidationError as e:
        lines = key_lines(text)
        problems = []
        for err in e.errors(include_url=False):
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "tagged-"))))
            # model-level checks report the loc of their model; field-level ones the field itself
            line = _line_for(lines, loc)
            where = f"{source}:{line}" if line else source
            message = err["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {_field_name(loc)}: {message}")
        shown = problems[:10] + ([f"... and {len(problems) - 10} more"] if len(problems) > 10 else [])
        raise PlanError("\n".join(shown)) from e
    return plan.model_copy(update={"source": source})


def plan_changes(old: Plan, new: Plan, experiments: list[Experiment] | None = None) -> list[str]:
    """What `new` changes in `old`, one line each; a PlanError when the change cannot apply to a session whose
    ledger holds `experiments` (another target, or an item removed that experiments were run for)."""
    fixed = ("model", "model_profile", "hardware", "gpus", "engine")
    if new.source and Path(new.source).is_file():  # a session recorded before profile paths were made absolute
        old = with_profile_paths(old, Path(new.source).resolve().parent)
    moved = [f for f in fixed if getattr(old.target, f) != getattr(new.target, f)]
    if moved:
        what = ", ".join(f"target.{f} {getattr(old.target, f)!r} -> {getattr(new.target, f)!r}" for f in moved)
        raise PlanError(
            f"the edited plan has another target ({what})",
            hint="a session keeps its target; start a new session with `pivot run` for another one",
        )
    tested = {e.plan_item for e in experiments or [] if e.plan_item}
    removed = [i for i in old.item_ids() if i not in new.item_ids()]
    lost = sorted(tested & set(removed))
    if lost:
        raise PlanError(
            f"the edited plan drops item{'s' if len(lost) > 1 else ''} {', '.join(lost)}, which the session has "
            "experiments for",
            hint="keep those items (edit their flags or text instead), or start a new session",
        )
    out: list[str] = []
    if old.target.flags != new.target.flags:
        out.append(f"base flags: {old.target.flags or '(none)'} -> {new.target.flags or '(none)'}")
    if old.target.engine_version != new.target.engine_version:
        out.append(f"engine version: {old.target.engine_version} -> {new.target.engine_version}")
    if old.objective != new.objective:
        out.append(f"objective: {old.objective.describe()} -> {new.objective.describe()}")
    if old.workload.model_dump(exclude={"goodput_slos_ms"}) != new.workload.model_dump(exclude={"goodput_slos_ms"}):
        out.append("workload changed (results on the old one are not compared with the new one)")
    for item_id in removed:
        out.append(f"item {item_id} removed ({old.item(item_id).title})")
    for item in new.items:
        if item.id not in old.item_ids():
            out.append(f"item {item.id} added ({item.title})")
            continue
        before = old.item(item.id)
        if before == item:
            continue
        fields = [f for f in type(item).model_fields if getattr(before, f) != getattr(item, f)]
        detail = ""
        if "flags" in fields or "remove_flags" in fields:
            detail = f": flags {before.flags or '(none)'} -> {item.flags or '(none)'}"
        out.append(f"item {item.id} changed ({', '.join(fields)}){detail}")
    for f in ("name", "title", "description", "tiers", "prior"):
        if getattr(old, f) != getattr(new, f):
            out.append(f"{f} changed")
    return out


def bundled_plans_dir() -> Path:
    """Where the plans that ship with pivot are: inside the installed package, or plans/ in a checkout."""
    spec = importlib.util.find_spec("agent.bundled_plans")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if Path(location).is_dir():
                return Path(location)
    return Path(__file__).resolve().parent.parent / "plans"


def bundled_plans() -> dict[str, Path]:
    """Plans shipped with pivot, by file stem."""
    folder = bundled_plans_dir()
    return {p.stem: p for p in sorted(folder.glob("*.toml"))} if folder.is_dir() else {}


def resolve_plan_path(ref: str | Path) -> Path:
    """A plan file from a path, or the name of a plan that ships with pivot."""
    text = str(ref)
    shown = text if len(text) <= 120 else text[:117] + "..."  # a 5,000-character argument is not echoed whole
    path = Path(ref).expanduser()
    try:
        if path.is_file():
            return path
    except (OSError, ValueError) as e:  # a name too long for the file system, a NUL byte
        raise PlanError(f"no plan file {shown!r}: {getattr(e, 'strerror', None) or e.__class__.__name__}",
                        hint="give a path to a .toml file, or a shipped plan's name (`pivot plan list`)") from None  # fmt: skip
    shipped = bundled_plans()
    name = path.stem if path.suffix == ".toml" else text
    if name in shipped:
        return shipped[name]
    known = ", ".join(shipped) or "none"
    raise PlanError(f"no plan file {shown!r}", hint=f"give a path to a .toml file, or one of: {known}")


def load_plan(ref: str | Path) -> Plan:
    """Read, parse and validate a plan file (or a shipped plan by name)."""
    path = resolve_plan_path(ref)
    try:
        if path.stat().st_size > MAX_PLAN_BYTES:
            raise PlanError(f"{path}: larger than {MAX_PLAN_BYTES // 2**20} MiB: not a plan")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PlanError(f"{path}: cannot read the plan: {e}") from e
    return with_profile_paths(parse_plan(text, source=str(path)), path.resolve().parent)


def is_profile_path(ref: str) -> bool:
    """Whether a profile reference is a file (`my-gpu.toml`, `profiles/x.toml`) rather than a shipped profile's name."""
    return ref.endswith(".toml") or "/" in ref or "\\" in ref


def with_profile_paths(plan: Plan, folder: Path) -> Plan:
    """The plan with each profile it names by a relative path (`model_profile = "qwen.toml"`) made absolute from
    `folder`, the plan file's directory, so the plan means the same files from any working directory."""
    target = plan.target
    update: dict[str, Any] = {}
    for field in ("model_profile", "hardware"):
        ref = getattr(target, field)
        if ref and is_profile_path(ref) and not Path(ref).expanduser().is_absolute():
            update[field] = str((folder / Path(ref).expanduser()).resolve())
    if not update:
        return plan
    return plan.model_copy(update={"target": target.model_copy(update=update)})
