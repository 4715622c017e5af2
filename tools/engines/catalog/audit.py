"""The flag audit: for each flag as typed, would this engine version accept it, and what to do instead.

Pure: it reads a catalog and a ServerConfig and returns rows; nothing is run, imported from the engine or
printed. Statuses: ok, unknown (removed flags too, naming the documented replacement, else the nearest
spelling), ambiguous, deprecated (naming the replacement), invalid (bad type or choice, a switch given a value,
`--help`, a known invalid combination) and noop (accepted but read by no code of this version). Where the
engine has words of its own (argparse's error, the exception it raises) the message starts with them, verbatim.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from agent.models import Flag, FlagIssue, ServerConfig
from tools.engines.catalog.catalog import HELP_SPEC, Catalog, CatalogError, DeprecatedFlag, FlagSpec, NoopFlag


def nearest_flag(catalog: Catalog, name: str) -> str | None:
    """The catalog's option string closest to a mistyped flag (underscores and case forgiven), or None."""
    typed = "--" + name.split("=", 1)[0].lstrip("-").replace("_", "-").lower()
    if typed in catalog.option_strings and typed != name:
        return typed
    close = difflib.get_close_matches(typed, catalog.option_strings, n=1, cutoff=0.75)
    return close[0] if close else None


def _join(*parts: str) -> str:
    """Sentences joined with one space; a part without final punctuation gets a full stop."""
    return " ".join(p if p.endswith((".", "?", "!")) else f"{p}." for p in parts if p)


def _unresolved(catalog: Catalog, name: str, error: str) -> FlagIssue:
    removed = catalog.removed.get(name.split("=", 1)[0])
    instead = f"Not in {catalog.title} (removed): {removed.replacement}" if removed else ""
    if error.startswith("ambiguous option"):
        return FlagIssue(flag=name, status="ambiguous", message=_join(error, instead or "Write the full flag"))
    if not instead:
        near = nearest_flag(catalog, name)
        instead = f"Not a flag of {catalog.title}" + (f"; did you mean {near}?" if near else "")
    return FlagIssue(flag=name, status="unknown", message=_join(error, instead))


def _audit_flag(catalog: Catalog, flag: Flag, noop: Mapping[str, NoopFlag] | None = None) -> FlagIssue:
    found = catalog.resolve(flag.name)
    if isinstance(found, str):
        return _unresolved(catalog, flag.name, found)
    if found is HELP_SPEC:
        message = "Prints the help and exits: the server would not start; drop it."
        return FlagIssue(flag=flag.name, status="invalid", message=message)
    abbreviation = catalog.normalize(flag.name).split("=", 1)[0] not in found.opts
    note = f"Abbreviation of {found.name}; write the full flag." if abbreviation else ""
    try:
        catalog.parse(flag.argv(), require_model=False)
    except CatalogError as e:
        switch = not found.takes_value and flag.value is not None
        advice = f"{found.name} is a switch and takes no value" if switch else ""
        return FlagIssue(flag=flag.name, status="invalid", message=_join(e.message, advice))
    deprecation = catalog.deprecation(found, flag.value)
    if isinstance(deprecation, DeprecatedFlag):
        instead = deprecation.replacement
        message = (f"Deprecated in {catalog.title}; {instead}." if instead.startswith("drop ")
                   else f"Deprecated in {catalog.title}; use {instead} instead.")  # fmt: skip
        return FlagIssue(flag=flag.name, status="deprecated", message=_join(message, note))
    if deprecation is not None:
        message = (
            f"{deprecation.value!r} is a deprecated alias in {catalog.title}; "
            f"use {found.name} {deprecation.replacement} instead."
        )
        return FlagIssue(flag=flag.name, status="deprecated", message=_join(message, note))
    unread = catalog.noop_note(found) if noop is None else next((noop[o] for o in found.opts if o in noop), None)
    if unread is not None:
        message = f"Accepted but not read in {catalog.title} ({unread.evidence}): it changes nothing; drop it."
        return FlagIssue(flag=flag.name, status="noop", message=_join(message, note))
    return FlagIssue(flag=flag.name, status="ok", message=note)


def audit(catalog: Catalog, config: ServerConfig, *, noop: Mapping[str, NoopFlag] | None = None) -> list[FlagIssue]:
    """One row per flag of `config`, in the order typed, with a status and a message that says what to do instead.

    No `--model-path` is needed. Known invalid combinations are judged on the flags that parse (defaults
    filled in) and mark the rows of the flags they name. `noop` (option string -> note, e.g. from a scan of
    SGLang's source, see noop_scan.py) replaces the catalog's recorded no-op flags when given.
    """
    rows = [_audit_flag(catalog, flag, noop) for flag in config.flags]
    argv = [token for flag, row in zip(config.flags, rows, strict=True) if not row.blocking for token in flag.argv()]
    try:
        values = catalog.parse(argv, require_model=False)
    except CatalogError:  # flags that parse one by one but not together: no verdict on combinations
        return rows
    for combo in catalog.refused_combinations(values):
        refusal = f"{combo.error}: {combo.message}"
        advice = f"{catalog.name} refuses this combination at startup; instead: {combo.fix}"
        for i, flag in enumerate(config.flags):
            spec = catalog.resolve(flag.name)
            if isinstance(spec, FlagSpec) and any(opt in combo.flags for opt in spec.opts):
                earlier = rows[i].message if rows[i].status == "invalid" else ""
                rows[i] = FlagIssue(flag=flag.name, status="invalid", message=_join(earlier, refusal, advice))
    return rows
