#!/usr/bin/env python3
"""Generate tools/engines/catalog/vllm-<version>.json: vLLM's `vllm serve` command line as data, from vLLM's own parser.

Input: vLLM's source as it is in its wheel (`pip download --no-deps vllm==0.33.0 -d /tmp/vllm` and unzip the wheel;
the directory holding vllm/), and the hand-written annotations beside the catalog
(tools/engines/catalog/annotations-vllm-<version>.toml: parser name, removed flags with what to do instead).

How: vLLM builds its parser from its config dataclasses (`make_arg_parser` in vllm/entrypoints/common/cli_args.py,
the one `vllm serve` and `python -m vllm.entrypoints.openai.api_server` use), so the flags cannot be read off the
source by pattern. This script runs `make_arg_parser` itself, with the packages vLLM imports but this machine does
not have (torch, transformers, triton, ...) replaced by permissive stand-ins: the parser is vLLM's, built by vLLM's
code; only defaults computed from a stand-in (the platform's, a torch dtype) are unknown, and they are written as
None ("resolved at startup", as the SGLang catalog does for the values SGLang resolves itself).

Deprecated and no-op flags come from the source: the `_*_DEPRECATION_MESSAGE` texts of vllm/engine/arg_utils.py
and every help text that says "deprecated" or "has no effect" (the replacement is the flag the text says to use).
Removed flags come from the annotations, each checked to be absent from the parser.

    python scripts/gen_vllm_catalog.py --source /tmp/vllm/src            # write
    python scripts/gen_vllm_catalog.py --source /tmp/vllm/src --check    # exit 1 if the catalog is stale
"""

from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import re
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CATALOG_DIR = ROOT / "tools" / "engines" / "catalog"
VERSION = "0.33.0"
PROG = "vllm serve"
FLAG_KEYS = ("opts", "dest", "type", "default", "choices", "nargs", "action", "required")


class CatalogSourceError(Exception):
    """The source or the annotations are not ones this script can turn into a catalog."""


# ---------------------------------------------------------------------------------------------- stand-ins


class _StubMeta(type):
    """A stand-in class: any attribute is another stand-in, calling it gives an instance, `X[...]` and `X | Y` are it."""

    def __new__(mcls, name: str, bases: tuple, ns: dict, **kw: Any) -> _StubMeta:
        return super().__new__(mcls, name, bases, ns)

    def __init__(cls, name: str, bases: tuple, ns: dict, **kw: Any) -> None:
        super().__init__(name, bases, ns)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], _StubMeta):
            return args[0]  # used as a decorator
        return super().__call__()

    def __iter__(cls) -> Any:
        return iter(())

    def __bool__(cls) -> bool:
        return False


class Stub(metaclass=_StubMeta):
    """An instance of a stand-in: permissive to every use vLLM's import-time code makes of it."""

    def __init_subclass__(cls, **kw: Any) -> None:
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(name)()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return Stub()

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0

    def __float__(self) -> float:
        return 0.0

    def __getitem__(self, key: Any) -> Any:
        return Stub()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stub)

    def __ne__(self, other: object) -> bool:
        return not isinstance(other, Stub)

    def __lt__(self, other: Any) -> bool:
        return False

    def __gt__(self, other: Any) -> bool:
        return False

    def __le__(self, other: Any) -> bool:
        return True

    def __ge__(self, other: Any) -> bool:
        return True


def _binary(self: Any, *args: Any) -> Any:
    return Stub()


for _op in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv", "rfloordiv", "mod",
            "rmod", "pow", "rpow", "and", "rand", "or", "ror", "xor", "rxor", "lshift", "rshift", "matmul", "neg",
            "pos", "invert"):  # fmt: skip
    setattr(Stub, f"__{_op}__", _binary)


def _stub_class(name: str) -> type:
    return _StubMeta(name.rsplit(".", 1)[-1], (Stub,), {"__module__": "stub", "__qualname__": name})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of top-level packages this Python cannot find get a stand-in module (vllm itself never does)."""

    def __init__(self) -> None:
        self.stubbed: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        top = fullname.split(".")[0]
        if top == "vllm" or top in sys.stdlib_module_names:
            return None
        if top in self.stubbed:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if "." in fullname:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                if finder.find_spec(fullname, path, target) is not None:
                    return None
            except Exception:
                continue
        self.stubbed.add(top)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def build_parser(source: Path) -> tuple[argparse.ArgumentParser, list[str]]:
    """vLLM's `vllm serve` parser, built by vLLM's make_arg_parser from `source`; and the packages stood in for."""
    if not (source / "vllm" / "entrypoints" / "common" / "cli_args.py").is_file():
        raise CatalogSourceError(f"{source} does not hold vLLM's source (vllm/entrypoints/common/cli_args.py)")
    finder = StandIns()
    sys.meta_path.insert(0, finder)
    sys.path.insert(0, str(source))
    real_version = importlib.metadata.version

    def version(name: str) -> str:  # vLLM asks for torch's version at import time
        try:
            return real_version(name)
        except importlib.metadata.PackageNotFoundError:
            return {"torch": "2.14.0"}.get(name, "0.0.0")

    importlib.metadata.version = version
    import vllm.engine.arg_utils as arg_utils  # type: ignore[import-not-found]

    class _Quiet:  # a config's default_factory that needs the platform (a stand-in) leaves that default unknown
        def __enter__(self) -> _Quiet:
            return self

        def __exit__(self, *exc: Any) -> bool:
            return True

    arg_utils.suppress_logging = lambda *a, **k: _Quiet()
    from vllm.entrypoints.common.cli_args import make_arg_parser  # type: ignore[import-not-found]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    return make_arg_parser(FlexibleArgumentParser(prog=PROG)), sorted(finder.stubbed)


# ---------------------------------------------------------------------------------------------- the dump


def _type_name(fn: Any, dest: str) -> str:
    """The catalog's name for an argparse type (tools/engines/catalog/vllm_parser_dump.py names them for both)."""
    from tools.engines.catalog.vllm_parser_dump import type_name

    name = type_name(fn, dest)
    if "lambda" in name:
        raise CatalogSourceError(f"{dest}: a lambda type this script does not know (add it to LAMBDA_TYPES)")
    return name


def _literal(value: Any) -> str:
    """A default as a Python literal the catalog can read back; "None" where it is not one (resolved at startup)."""
    if isinstance(value, Stub) or isinstance(type(value), _StubMeta):
        return "None"
    if hasattr(value, "value") and type(value).__module__.startswith("vllm"):  # an enum member
        value = value.value
    text = repr(value)
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return "None"
    return text


UNKNOWN_CHOICES: list[str] = []  # flags whose choices come from a stand-in (the platform's): left unchecked


def _choices(action: argparse.Action) -> list[Any] | None:
    if action.choices is None:
        return None
    out = []
    for value in action.choices:
        if hasattr(value, "value") and type(value).__module__.startswith("vllm"):
            value = value.value
        if isinstance(value, Stub) or isinstance(type(value), _StubMeta):
            UNKNOWN_CHOICES.append(action.option_strings[0])
            return None
        if not (value is None or isinstance(value, str | int | float | bool)):
            raise CatalogSourceError(f"{action.option_strings}: a choice that is not a plain value: {value!r}")
        out.append(value)
    return out


def dump(parser: argparse.ArgumentParser) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """One entry per action (the positional model tag included, -h/--help left out) and dest -> help text."""
    spellings: dict[int, list[str]] = {}
    for opt, action in parser._option_string_actions.items():
        spellings.setdefault(id(action), []).append(opt)
    flags, helps = [], {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        opts = spellings.get(id(action), []) if action.option_strings else []
        flags.append(
            {
                "opts": opts,
                "dest": action.dest,
                "type": _type_name(action.type, action.dest),
                "default": _literal(action.default),
                "choices": _choices(action),
                "nargs": action.nargs,
                "action": type(action).__name__,
                "required": bool(action.required),
            }
        )
        helps[action.dest] = " ".join((action.help or "").split())
    return flags, helps


# ---------------------------------------------------------------------------------------------- annotations


def detect(source: Path, flags: list[dict[str, Any]], helps: dict[str, str]) -> tuple[list[dict], list[dict]]:
    """Deprecated and no-op flags from the source (tools/engines/catalog/vllm_scan.py, shared with the live audit)."""
    from tools.engines.catalog.vllm_scan import detect as scan

    return scan(source, flags, helps, VERSION)


# ---------------------------------------------------------------------------------------------- the catalog


def render(
    flags: list[dict], notes: dict[str, Any], deprecated: list[dict], noop: list[dict], stubbed: list[str]
) -> str:
    """The catalog JSON text, one flag or annotation per line (the format of tools/engines/catalog/*.json)."""
    from tools.engines.catalog.vllm_argtypes import ACTIONS, TYPES

    for entry in flags:
        if entry["type"] not in TYPES:
            raise CatalogSourceError(f"{entry['opts']}: type {entry['type']!r} unknown to vllm_argtypes.py (add it)")
        if entry["action"] not in ACTIONS:
            raise CatalogSourceError(f"{entry['opts']}: action {entry['action']!r} unknown to vllm_argtypes.py")
    by_opt = {opt for entry in flags for opt in entry["opts"]}
    for item in notes.get("removed", []):
        if item["flag"] in by_opt:
            raise CatalogSourceError(f"removed flag {item['flag']} is still in vLLM {VERSION}'s parser")
    header = [
        ("engine", "vllm"),
        ("version", VERSION),
        ("name", notes.get("name", "vLLM")),
        ("prog", notes["parser"]["prog"]),
        ("add_help", True),
        ("underscores", True),
        ("parser_source", notes["parser"]["source"]),
        ("source", f"vllm {VERSION} wheel: make_arg_parser run with stand-ins for {', '.join(stubbed)}; help omitted"),
        ("choices_unchecked", sorted(set(UNKNOWN_CHOICES))),
        ("generated_by", "scripts/gen_vllm_catalog.py --source DIR (the unpacked vllm wheel)"),
    ]
    sections = [("flags", flags), ("removed", notes.get("removed", [])), ("deprecated", deprecated),
                ("deprecated_values", []), ("noop", noop),
                ("invalid_combinations", notes.get("invalid_combinations", []))]  # fmt: skip
    out = ["{"]
    for key, value in header:
        out.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},")
    for n, (key, items) in enumerate(sections):
        rows = ",\n".join(f"    {json.dumps(item, ensure_ascii=False)}" for item in items)
        tail = "," if n < len(sections) - 1 else ""
        out.append(f"  {json.dumps(key)}: [\n{rows}\n  ]{tail}" if items else f"  {json.dumps(key)}: []{tail}")
    out.append("}")
    return "\n".join(out) + "\n"


def source_version(source: Path) -> str:
    text = (source / "vllm" / "_version.py").read_text() if (source / "vllm" / "_version.py").exists() else ""
    match = re.search(r"""(?:__version__|version)\s*(?::\s*str)?\s*=\s*['"]([^'"]+)['"]""", text)
    return match.group(1) if match else "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, required=True, help="the unpacked vllm wheel (the directory holding vllm/)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the catalog file is not up to date")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    out = CATALOG_DIR / f"vllm-{VERSION}.json"
    try:
        found = source_version(args.source)
        if found != VERSION:
            raise CatalogSourceError(f"{args.source} is vLLM {found}, this script pins {VERSION}")
        notes = tomllib.loads((CATALOG_DIR / f"annotations-vllm-{VERSION}.toml").read_text())
        parser, stubbed = build_parser(args.source)
        flags, helps = dump(parser)
        deprecated, noop = detect(args.source, flags, helps)
        text = render(flags, notes, deprecated, noop, stubbed)
    except (OSError, KeyError, tomllib.TOMLDecodeError, CatalogSourceError) as e:
        print(f"gen_vllm_catalog: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.check:
        if (out.read_text() if out.exists() else None) != text:
            print(f"gen_vllm_catalog: {out} is not up to date; run without --check", file=sys.stderr)
            return 1
        print(f"gen_vllm_catalog: {out} is up to date")
        return 0
    out.write_text(text)
    print(f"gen_vllm_catalog: wrote {out} ({len(flags)} arguments, {len(deprecated)} deprecated, {len(noop)} no-op)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
