"""vLLM 0.33.0's argparse types and actions, rebuilt so a catalog's parser reads and refuses values as `vllm serve` does.

Each function keeps the name argparse prints in "invalid <name> value" and the ArgumentTypeError text of its vLLM
original (`vllm/utils/argparse_utils.py`, `vllm/engine/arg_utils.py`, `vllm/entrypoints/common/cli_args.py` in the
0.33.0 wheel). The catalog JSON (scripts/gen_vllm_catalog.py) names types and actions by the names in TYPES and
ACTIONS. Two approximations, said where they are: a config given as JSON (`parse_dataclass`) is checked to be JSON
but its fields are not validated against vLLM's dataclass, and the LoRA modules are parsed without building
vLLM's LoRAModulePath objects.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any


def human_readable_int(value: str) -> int:
    """An int with an optional suffix as vLLM reads it: k, m, g, t are powers of 1000 (decimals allowed, `25.6k`);
    K, M, G, T powers of 1024 (integers only, `1.5K` is refused)."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        try:
            return int(number) * binary[suffix]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?"
            ) from None
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    """human_readable_int, or -1 for `-1` and `auto` (detect automatically)."""
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


def _parse_type(return_type: Callable[[str], Any]) -> Callable[[str], Any]:
    """vLLM's parse_type: a ValueError of `return_type` becomes "Value V cannot be converted to T."."""

    def _parse_type(val: str) -> Any:
        try:
            return return_type(val)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"Value {val} cannot be converted to {return_type}.") from e

    return _parse_type


def _optional_type(return_type: Callable[[str], Any]) -> Callable[[str], Any]:
    """vLLM's optional_type: "" and "None" are None, anything else goes through parse_type(return_type)."""

    def _optional_type(val: str) -> Any:
        if val == "" or val == "None":
            return None
        return _parse_type(return_type)(val)

    return _optional_type


def parse_dataclass(val: str) -> Any:
    """A config given as JSON (`--compilation-config '{"mode": 3}'`): checked to be JSON (numbers may carry vLLM's
    suffixes); its fields are not validated here (vLLM validates them against its dataclass)."""
    expanded = re.sub(
        r"(?<=[:\[,\s])(\d+(?:\.\d+)?[kKmMgGtT])(?=[,\]}\s])", lambda mt: str(human_readable_int(mt.group(1))), val
    )
    try:
        return json.loads(expanded)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"ValidationError: invalid JSON: {e}") from None


def union_dict_and_str(val: str) -> Any:
    """A JSON object when it looks like one, else the string."""
    if not re.match(r"(?s)^\s*{.*}\s*$", val):
        return str(val)
    return _optional_type(json.loads)(val)


def parse_reasoning_parser(val: str) -> str:
    """`none` (any case) is the unset default."""
    return "" if val.lower() == "none" else val


def lower_underscore(s: str) -> str:
    """A backend name as vLLM normalizes it: lower case, dashes to underscores."""
    return s.lower().replace("-", "_")


def device_id_list(s: str) -> list[int | str]:
    """`--device-ids "2,3,5,7"`: comma-separated indices (ints) or UUIDs (strings)."""
    return [int(part) if part.isdigit() else part for part in (p.strip() for p in s.split(","))]


class EnableDisableAction(argparse.BooleanOptionalAction):
    """vLLM's BooleanOptionalAction that pairs `--enable-x` with `--disable-x` (and still accepts `--no-x`).

    The catalog lists every spelling the parser registers; the action is given the positive ones and works out the
    negative ones as vLLM's does.
    """

    _inverse_prefixes = {"--enable-": "--disable-", "--disable-": "--enable-"}  # noqa: RUF012

    def __init__(self, option_strings: list[str], dest: str, *args: Any, **kwargs: Any) -> None:
        primary: list[str] = []
        derived: set[str] = set()  # the spellings argparse and this action add themselves
        for opt in option_strings:
            if opt in derived:
                continue
            primary.append(opt)
            if opt.startswith("--"):
                derived.add(f"--no-{opt[2:]}")
                derived |= {
                    inv + opt.removeprefix(pre) for pre, inv in self._inverse_prefixes.items() if opt.startswith(pre)
                }
        super().__init__(primary, dest, *args, **kwargs)
        inverses = [
            inverse + opt.removeprefix(prefix)
            for opt in primary
            for prefix, inverse in self._inverse_prefixes.items()
            if opt.startswith(prefix)
        ]
        negated = {opt for opt in self.option_strings if opt not in primary}
        self.negative_option_strings = negated | set(inverses)
        self.option_strings = [*self.option_strings, *inverses]

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, option_string not in self.negative_option_strings)


class LoRAParserAction(argparse.Action):
    """`--lora-modules`: `name=path` items or JSON objects with `name` and `path`; a bad JSON item is a usage error."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        if isinstance(values, str):
            raise TypeError("Expected values to be a list")
        modules: list[dict[str, Any]] = []
        for item in values or []:
            if item in (None, ""):
                continue
            if "=" in item and "," not in item:
                name, path = item.split("=", 1)
                modules.append({"name": name, "path": path})
                continue
            try:
                data = json.loads(item)
                modules.append({"name": data["name"], "path": data["path"], **data})
            except json.JSONDecodeError:
                parser.error(f"Invalid JSON format for --lora-modules: {item}")
            except (KeyError, TypeError) as e:
                parser.error(f"Invalid fields for --lora-modules: {item} - {e!s}")
        setattr(namespace, self.dest, modules)


class DeprecatedLogConfigFileAction(argparse._StoreAction):
    """`--log-config-file`: stored as given; vLLM warns that it is deprecated (the catalog's annotation says so)."""


# Type names as the catalog spells them -> the callable argparse gets ("None": no type).
TYPES: dict[str, Callable[[str], Any] | None] = {
    "None": None,
    "str": str,
    "int": int,
    "float": float,
    "loads": json.loads,
    "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": human_readable_int_or_auto,
    "parse_dataclass": parse_dataclass,
    "union_dict_and_str": union_dict_and_str,
    "parse_reasoning_parser": parse_reasoning_parser,
    "lower_underscore": lower_underscore,
    "device_id_list": device_id_list,
    "parse_type(loads)": _parse_type(json.loads),
    "optional_type(str)": _optional_type(str),
    "optional_type(int)": _optional_type(int),
    "optional_type(float)": _optional_type(float),
    "optional_type(loads)": _optional_type(json.loads),
    "optional_type(human_readable_int)": _optional_type(human_readable_int),
    "optional_type(parse_dataclass)": _optional_type(parse_dataclass),
    "optional_type(parse_type(loads))": _optional_type(_parse_type(json.loads)),
}

# Action class names as the catalog spells them -> what add_argument gets.
ACTIONS: dict[str, str | type[argparse.Action]] = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_AppendAction": "append",
    "EnableDisableAction": EnableDisableAction,
    "BooleanOptionalAction": argparse.BooleanOptionalAction,  # vLLM 0.32's switches (0.33 pairs them with --disable-x)
    "LoRAParserAction": LoRAParserAction,
    "DeprecatedLogConfigFileAction": DeprecatedLogConfigFileAction,
}
