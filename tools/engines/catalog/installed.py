"""The flag audit against the best evidence there is: SGLang's own parser and source when installed, else the catalog.

Where SGLang is importable, its parser is built exactly as `sglang serve` builds it
(`sglang.srt.server_args.ServerArgs.add_cli_args` on an argparse parser) and the audit runs on it, with
the shipped annotations of that version (removed, deprecated, invalid combinations) where there are any.
No-op flags come from a scan of SGLang's source (noop_scan.py): the directory given, else the installed
package when it is the version audited, else the catalog's recorded no-ops. Importing SGLang can fail
(no GPU stack) or print; either way the audit falls back to the catalog and says so in `notes`.

    report = audit_flags(ServerConfig.parse("--tp 8 --num-continuous-decode-steps 8"))
    report.rows       # [FlagIssue(flag='--tp', status='ok', ...), FlagIssue(..., status='noop', ...)]
    report.parser     # "shipped catalog of SGLang 0.5.23"
    report.noops      # "the catalog's recorded no-ops" or "scan of /path/sglang (SGLang 0.5.23): ..."
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.contracts import FlagAudit
from agent.errors import PivotError
from agent.models import ServerConfig
from tools.engines.catalog.audit import audit
from tools.engines.catalog.catalog import HELP_SPEC, Catalog, CatalogParser, FlagSpec, available_versions, load_catalog
from tools.engines.catalog.noop_scan import NoopScan, find_package_dir, package_version, scan_noops

SERVER_ARGS_MODULE = "sglang.srt.server_args"
PROG = "sglang serve"


@dataclass(frozen=True)
class InstalledSGLang:
    """An SGLang package this Python can import: where it is and which version it says it is."""

    package_dir: Path
    version: str | None


def find_installed_sglang() -> InstalledSGLang | None:
    """The SGLang importable here (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location)
        if (path / "srt").is_dir():
            return InstalledSGLang(path.resolve(), package_version(path))
    return None


def _flag_spec(action: argparse.Action) -> FlagSpec:
    type_name = getattr(action.type, "__name__", type(action.type).__name__) if action.type is not None else "None"
    return FlagSpec(
        opts=tuple(action.option_strings),
        dest=action.dest,
        type=type_name,
        default=action.default,
        default_repr=repr(action.default),
        choices=None if action.choices is None else tuple(action.choices),
        nargs=action.nargs,
        action=type(action).__name__,
        required=bool(action.required),
    )


class InstalledCatalog(Catalog):
    """A Catalog whose parser is SGLang's own (`ServerArgs.add_cli_args`), annotated from a shipped catalog."""

    def __init__(self, add_cli_args: Any, version: str, annotations: Catalog | None, source: str) -> None:
        super().__init__({"engine": "sglang", "version": version, "name": "SGLang", "prog": PROG, "flags": []})
        self._add_cli_args = add_cli_args
        self.source = source
        if annotations is not None:
            self.removed = dict(annotations.removed)
            self.deprecated = dict(annotations.deprecated)
            self.deprecated_values = annotations.deprecated_values
            self.noop = dict(annotations.noop)
            self.invalid_combinations = annotations.invalid_combinations
        parser = self.parser(require_model=False)
        self.flags = tuple(_flag_spec(a) for a in parser._actions if a.option_strings and a.dest != "help")
        self._by_opt = dict.fromkeys(("-h", "--help"), HELP_SPEC)
        for spec in self.flags:
            for opt in spec.opts:
                self._by_opt[opt] = spec

    def parser(self, *, require_model: bool = True) -> CatalogParser:
        """SGLang's parser, raising CatalogError instead of exiting; `--model-path` optional unless required."""
        parser = CatalogParser(prog=PROG, add_help=True, allow_abbrev=True)
        with contextlib.redirect_stdout(sys.stderr):
            self._add_cli_args(parser)
        if not require_model:
            for action in parser._actions:
                if action.dest == "model_path":
                    action.required = False
        return parser


def installed_catalog(installed: InstalledSGLang) -> InstalledCatalog:
    """The installed SGLang's parser as a Catalog; PivotError (with the reason) if it cannot be built."""
    version = installed.version or "unknown"
    try:
        with contextlib.redirect_stdout(sys.stderr):  # SGLang's import may print; stdout may be carrying JSON
            module = importlib.import_module(SERVER_ARGS_MODULE)
        add_cli_args = module.ServerArgs.add_cli_args
        annotations = load_catalog("sglang", version) if version in available_versions("sglang") else None
        return InstalledCatalog(
            add_cli_args, version, annotations, f"SGLang {version}'s own parser ({installed.package_dir})"
        )
    except PivotError:
        raise
    except BaseException as e:  # an import of a GPU stack can fail in many ways, SystemExit included
        if isinstance(e, KeyboardInterrupt):
            raise
        raise PivotError(
            f"SGLang {version} is installed at {installed.package_dir} but its parser could not be built: "
            f"{type(e).__name__}: {e}",
            hint="the audit falls back to the shipped catalog",
        ) from e


@functools.lru_cache(maxsize=4)
def _scan(package_dir: str, mtime_ns: int) -> NoopScan:
    return scan_noops(package_dir)


def scan_source(path: str | Path) -> NoopScan:
    """scan_noops, remembered per package directory for as long as it is unchanged (a scan takes a second or two)."""
    package_dir = find_package_dir(path)
    return _scan(str(package_dir), (package_dir / "srt").stat().st_mtime_ns)


def audit_flags(
    config: ServerConfig,
    *,
    version: str | None = None,
    sglang_source: str | Path | None = None,
    use_installed: bool = True,
) -> FlagAudit:
    """Audit `config`'s flags for SGLang `version` (default: the installed one, else the newest catalog).

    Uses the installed SGLang's own parser when it is that version (and `use_installed`), else the shipped
    catalog (PivotError if there is none for `version`). No-ops: a scan of `sglang_source` when given
    (PivotError if it holds no SGLang package), else of the installed source when it is the version audited,
    else the catalog's recorded ones. Never imports SGLang when `use_installed` is False.
    """
    notes: list[str] = []
    installed = find_installed_sglang() if use_installed else None
    catalog: Catalog | None = None
    parser_text = ""
    if installed is not None and (version is None or installed.version == version):
        try:
            live = installed_catalog(installed)
            catalog, parser_text = live, live.source
        except PivotError as e:
            notes.append(f"{e.message}; using the shipped catalog")
    if catalog is None:
        versions = available_versions("sglang")
        chosen = version or (versions[-1] if versions else "0.5.23")
        catalog = load_catalog("sglang", chosen)
        parser_text = f"shipped catalog of SGLang {chosen}"
        if installed is not None and version is not None and installed.version != version:
            notes.append(f"installed SGLang is {installed.version}, not {version}: its parser was not used")

    noop = None
    noops_text = "the catalog's recorded no-ops"
    scan: NoopScan | None = None
    if sglang_source is not None:
        scan = scan_source(sglang_source)
    elif installed is not None and installed.version == catalog.version:
        try:
            scan = scan_source(installed.package_dir)
        except PivotError as e:
            notes.append(f"the installed SGLang source could not be scanned ({e.message}); using recorded no-ops")
    if scan is not None:
        noop = scan.notes()
        noops_text = f"scan of {scan.summary}"
        if scan.version and scan.version != catalog.version:
            notes.append(
                f"the scanned source is SGLang {scan.version}, the flags were judged as SGLang {catalog.version}"
            )
    elif not catalog.noop:
        noops_text = f"none recorded for SGLang {catalog.version}"
    rows = audit(catalog, config, noop=noop)
    return FlagAudit(rows=rows, parser=parser_text, noops=noops_text, version=catalog.version, notes=notes)
