#!/usr/bin/env python3
"""Generate tools/engines/catalog/<engine>-<version>.json: an engine's command line as data, from a facts dump.

Input: the argparse dump in ../shared/facts (one entry per action: opts, dest, type, default as repr, choices,
nargs, action class, required) and the hand-written annotations file beside the catalog
(tools/engines/catalog/annotations-<version>.toml: parser name, removed, deprecated and no-op flags, invalid
combinations). Output: one JSON file, one flag or annotation per line so that a new version diffs readably.
The annotations are checked against the dump (a deprecated flag must exist, a removed one must not, a
combination may only name real dests), so a typo fails here rather than in an audit.

    python scripts/gen_catalog.py --facts ../shared/facts/sglang-0.5.23-flags.json          # write
    python scripts/gen_catalog.py --facts ../shared/facts/sglang-0.5.23-flags.json --check  # exit 1 if stale
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CATALOG_DIR = ROOT / "tools" / "engines" / "catalog"

FLAG_KEYS = ("opts", "dest", "type", "default", "choices", "nargs", "action", "required")
KNOWN_TYPES = {
    "None",
    "str",
    "int",
    "float",
    "human_readable_int",
    "loads",
    "json_list_type",
    "nullable_str",
    "parse_cuda_graph_backend_arg",
    "parse_cuda_graph_config_arg",
}
KNOWN_ACTIONS = {
    "_StoreAction",
    "_StoreTrueAction",
    "BooleanOptionalAction",
    "DeprecatedStoreTrueAction",
    "DeprecatedStoreConstAction",
    "LoRAPathAction",
}
WARNING_ACTIONS = {"DeprecatedStoreTrueAction", "DeprecatedStoreConstAction"}
# What a `when` expression of an invalid combination may contain.
_WHEN_NODES = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.In,
    ast.NotIn,
    ast.Is,
    ast.IsNot,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.Tuple,
    ast.List,
    ast.BinOp,
    ast.Mod,
)


class CatalogSourceError(Exception):
    """The facts dump or the annotations file is not one this script can turn into a catalog."""


def _fail(message: str) -> None:
    raise CatalogSourceError(message)


def _check_flags(flags: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Check every dump entry; return option string -> entry."""
    by_opt: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(flags):
        if set(entry) != set(FLAG_KEYS):
            _fail(f"flag #{i} has keys {sorted(entry)}, expected {sorted(FLAG_KEYS)}")
        if entry["type"] not in KNOWN_TYPES:
            _fail(f"{entry['opts']}: unknown type {entry['type']!r} (teach tools/engines/catalog/argtypes.py first)")
        if entry["action"] not in KNOWN_ACTIONS:
            _fail(
                f"{entry['opts']}: unknown action {entry['action']!r} (teach tools/engines/catalog/argtypes.py first)"
            )
        try:
            ast.literal_eval(entry["default"])
        except (ValueError, SyntaxError):
            _fail(f"{entry['opts']}: default {entry['default']!r} is not a Python literal")
        for opt in entry["opts"]:
            if opt in by_opt:
                _fail(f"option string {opt} appears twice")
            by_opt[opt] = entry
    return by_opt


def _check_when(name: str, when: str, dests: set[str]) -> None:
    try:
        tree = ast.parse(when, mode="eval")
    except SyntaxError as e:
        _fail(f"invalid combination {name!r}: `when` is not an expression: {e}")
    for node in ast.walk(tree):
        if not isinstance(node, _WHEN_NODES):
            _fail(f"invalid combination {name!r}: `when` may not contain {type(node).__name__}")
        if isinstance(node, ast.Name) and node.id not in dests:
            _fail(f"invalid combination {name!r}: {node.id!r} is not a dest of this parser")


def _check_annotations(notes: dict[str, Any], by_opt: dict[str, dict[str, Any]]) -> None:
    dests = {entry["dest"] for entry in by_opt.values()}
    for item in notes.get("removed", []):
        if item["flag"] in by_opt:
            _fail(f"removed flag {item['flag']} is still in the parser")
    for item in notes.get("deprecated", []):
        entry = by_opt.get(item["flag"])
        if entry is None:
            _fail(f"deprecated flag {item['flag']} is not in the parser")
        warns = entry["action"] in WARNING_ACTIONS
        if bool(item.get("warns")) != warns:
            _fail(f"deprecated flag {item['flag']}: warns={item.get('warns')} but its action is {entry['action']}")
        if warns and not item.get("new_flag"):
            _fail(f"deprecated flag {item['flag']}: its warning names new_flag; give it")
        if ("const_value" in item) != (entry["action"] == "DeprecatedStoreConstAction"):
            _fail(f"deprecated flag {item['flag']}: const_value goes with DeprecatedStoreConstAction only")
    for item in notes.get("deprecated_values", []):
        for flag in item["flags"]:
            entry = by_opt.get(flag)
            if entry is None:
                _fail(f"deprecated value {item['value']!r}: flag {flag} is not in the parser")
            if entry["choices"] is not None and item["value"] not in entry["choices"]:
                _fail(f"deprecated value {item['value']!r} is not a choice of {flag}")
    for item in notes.get("noop", []):
        if item["flag"] not in by_opt:
            _fail(f"no-op flag {item['flag']} is not in the parser")
    for item in notes.get("invalid_combinations", []):
        for flag in item["flags"]:
            if flag not in by_opt:
                _fail(f"invalid combination {item['name']!r}: flag {flag} is not in the parser")
        _check_when(item["name"], item["when"], dests)


def render(facts: dict[str, Any], notes: dict[str, Any], facts_name: str, facts_sha256: str) -> str:
    """The catalog JSON text for one facts dump and its annotations (deterministic, newline-terminated)."""
    if (facts.get("engine"), facts.get("version")) != (notes.get("engine"), notes.get("version")):
        _fail(
            f"facts are for {facts.get('engine')} {facts.get('version')}, "
            f"annotations for {notes.get('engine')} {notes.get('version')}"
        )
    flags = [{key: entry[key] for key in FLAG_KEYS} for entry in facts["flags"]]
    by_opt = _check_flags(flags)
    _check_annotations(notes, by_opt)
    parser = notes["parser"]
    header: list[tuple[str, Any]] = [
        ("engine", facts["engine"]),
        ("version", facts["version"]),
        ("name", notes.get("name", facts["engine"])),
        ("prog", parser["prog"]),
        ("add_help", bool(parser.get("add_help", True))),
        ("parser_source", parser.get("source", "")),
        ("source", facts.get("source", "")),
        ("facts", facts_name),
        ("facts_sha256", facts_sha256),
        ("generated_by", f"scripts/gen_catalog.py --facts ../shared/facts/{facts_name}"),
    ]
    sections: list[tuple[str, list[Any]]] = [
        ("flags", flags),
        ("removed", notes.get("removed", [])),
        ("deprecated", notes.get("deprecated", [])),
        ("deprecated_values", notes.get("deprecated_values", [])),
        ("noop", notes.get("noop", [])),
        ("invalid_combinations", notes.get("invalid_combinations", [])),
    ]
    out = ["{"]
    for key, value in header:
        out.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},")
    for n, (key, items) in enumerate(sections):
        rows = ",\n".join(f"    {json.dumps(item, ensure_ascii=False)}" for item in items)
        tail = "," if n < len(sections) - 1 else ""
        out.append(f"  {json.dumps(key)}: [\n{rows}\n  ]{tail}" if items else f"  {json.dumps(key)}: []{tail}")
    out.append("}")
    return "\n".join(out) + "\n"


def generate(facts_path: Path, annotations_path: Path | None = None) -> tuple[Path, str]:
    """Where the catalog for `facts_path` belongs and its text; annotations default to the file for its version."""
    raw = facts_path.read_bytes()
    facts = json.loads(raw)
    engine, version = facts["engine"], facts["version"]
    annotations_path = annotations_path or CATALOG_DIR / f"annotations-{version}.toml"
    notes = tomllib.loads(annotations_path.read_text())
    text = render(facts, notes, facts_path.name, hashlib.sha256(raw).hexdigest())
    return CATALOG_DIR / f"{engine}-{version}.json", text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--facts", type=Path, required=True, help="the argparse dump, e.g. ../shared/facts/sglang-0.5.23-flags.json"
    )
    ap.add_argument("--annotations", type=Path, help="default: tools/engines/catalog/annotations-<version>.toml")
    ap.add_argument("--out", type=Path, help="default: tools/engines/catalog/<engine>-<version>.json")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the catalog file is not up to date")
    args = ap.parse_args(argv)
    try:
        default_out, text = generate(args.facts, args.annotations)
    except (OSError, KeyError, json.JSONDecodeError, tomllib.TOMLDecodeError, CatalogSourceError) as e:
        print(f"gen_catalog: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    out = args.out or default_out
    if args.check:
        current = out.read_text() if out.exists() else None
        if current != text:
            print(f"gen_catalog: {out} is not up to date; run without --check", file=sys.stderr)
            return 1
        print(f"gen_catalog: {out} is up to date")
        return 0
    out.write_text(text)
    n_flags = len(json.loads(text)["flags"])
    print(f"gen_catalog: wrote {out} ({n_flags} flags)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
