"""SGLang 0.5.23's own argparse types and actions, rebuilt so a catalog's parser fails with SGLang's exact words.

argparse names a type in its error text ("argument --x: invalid loads value: '{'") and prints an
ArgumentTypeError's text as it is, so each function here keeps the name and the messages of its SGLang
original (`sglang/srt/utils/common.py`, `sglang/srt/model_executor/cuda_graph_config.py`,
`sglang/srt/arg_groups/argparse_actions.py` in the 0.5.23 wheel). The catalog JSON names types and actions by
these names; `TYPES` and `ACTIONS` map the names to the objects.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

# Where SGLang's deprecation warnings come from; they are logged before logging is configured, so Python's
# last-resort handler prints the bare message (in bold yellow) on stderr.
DEPRECATION_LOGGER = "sglang.srt.arg_groups.argparse_actions"
# A list under this attribute of the namespace collects deprecation warnings instead of logging them.
WARNINGS_ATTR = "_pivot_catalog_warnings"

_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")


def human_readable_int(value: str) -> int:
    """An int written plainly (`8192`, `-1`) or with a case-sensitive suffix, as SGLang 0.5.23 reads it.

    SI suffixes k, M, G, T are powers of 1000 and allow decimals (`1k` = 1000, `1.5G` = 1_500_000_000,
    `25.6k` = 25600, computed in Decimal); IEC suffixes Ki, Mi, Gi, Ti are powers of 1024 and take integers only
    (`1Mi` = 1_048_576, `1.5Gi` is an error). `1K`, `1m`, `1KB` are errors. Leading and trailing spaces are ignored.
    """
    value = value.strip()
    match = _HUMAN_INT.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * _IEC[suffix]
        return int(Decimal(number) * _SI[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


def nullable_str(val: str) -> str | None:
    """The string, or None for an empty string or the word `None`."""
    if not val or val == "None":
        return None
    return val


def _no_constants(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)


def json_list_type(value: str) -> Any:
    """Any JSON value (SGLang does not check that it is a list); NaN and Infinity are refused as orjson does."""
    try:
        return json.loads(value, parse_constant=_no_constants)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"Invalid JSON list: {value}. Please provide a valid JSON list.") from None


CUDA_GRAPH_PHASES = ("decode", "prefill")
CUDA_GRAPH_KEYS_PER_PHASE: dict[str, tuple[str, ...]] = {
    "decode": ("backend", "max_bs", "bs"),
    "prefill": (
        "backend",
        "max_bs",
        "bs",
        "max_context_size",
        "full_prefill_max_req",
        "full_prefill_prefix_chunk_tokens",
        "max_seq_len",
    ),
}


def parse_cuda_graph_backend_arg(raw: str) -> str:
    """The backend name as given; the retired `tc_piecewise` is refused before argparse checks the choices."""
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError("tc_piecewise was removed; select breakable, full, or disabled")
    return raw


def parse_cuda_graph_config_arg(raw: str) -> dict[str, dict[str, Any]]:
    """`--cuda-graph-config`: a JSON object of phase -> settings, with phases and keys checked as SGLang does."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}")
    result: dict[str, dict[str, Any]] = {}
    for phase, settings in parsed.items():
        phase = str(phase)
        if phase not in CUDA_GRAPH_PHASES:
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config: unknown phase '{phase}', expected one of {CUDA_GRAPH_PHASES}"
            )
        if not isinstance(settings, dict):
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config['{phase}'] must be a JSON object, got {type(settings).__name__}"
            )
        if "backend" in settings:
            parse_cuda_graph_backend_arg(settings["backend"])
        allowed = CUDA_GRAPH_KEYS_PER_PHASE[phase]
        result[phase] = {}
        for key, value in settings.items():
            if key not in allowed:
                raise argparse.ArgumentTypeError(
                    f"--cuda-graph-config['{phase}']: unknown key '{key}', expected one of {allowed}"
                )
            result[phase][key] = value
    return result


def _warn(namespace: argparse.Namespace, message: str) -> None:
    collected = getattr(namespace, WARNINGS_ATTR, None)
    if isinstance(collected, list):
        collected.append(message)
    else:
        logging.getLogger(DEPRECATION_LOGGER).warning(f"\033[1;33m{message}\033[0m")


def deprecation_message(option_string: str | None, new_flag: str | None) -> str:
    """The warning SGLang prints when a deprecated flag is used."""
    replacement = f" Use '{new_flag}' instead." if new_flag else ""
    return f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"


class LoRAPathAction(argparse.Action):
    """`--lora-paths`: each value is a path or a JSON object with `lora_name` and `lora_path`.

    A bad JSON object raises JSONDecodeError or AssertionError out of parse_args, as in SGLang (a traceback,
    not a usage error).
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        lora_paths: list[Any] = []
        for raw in values or []:
            lora_path = raw.strip()
            if lora_path.startswith("{") and lora_path.endswith("}"):
                obj = json.loads(lora_path)
                if not (isinstance(obj, dict) and "lora_path" in obj and "lora_name" in obj):
                    raise AssertionError(
                        f"{lora_path!r} looks like a JSON str, but it does not contain 'lora_name' and 'lora_path' keys."
                    )
                lora_paths.append(obj)
            else:
                lora_paths.append(lora_path)
        setattr(namespace, self.dest, lora_paths)


class DeprecatedStoreTrueAction(argparse.Action):
    """A deprecated switch that still stores True, with a warning that names `new_flag`."""

    def __init__(
        self,
        option_strings: list[str],
        dest: str,
        new_flag: str | None = None,
        nargs: int = 0,
        const: Any = True,
        default: Any = False,
        **kwargs: Any,
    ) -> None:
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        _warn(namespace, deprecation_message(option_string, self.new_flag))
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    """A deprecated flag that stores `const_value` on its replacement's dest, with a warning.

    With nargs=None and choices (SGLang's `--monokernel-backend amd`) it takes one value, checked by argparse.
    """

    def __init__(
        self,
        option_strings: list[str],
        dest: str,
        new_flag: str | None = None,
        const_value: Any = None,
        nargs: int | str | None = 0,
        default: Any = None,
        **kwargs: Any,
    ) -> None:
        self.new_flag = new_flag
        self.const_value = const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        _warn(namespace, deprecation_message(option_string, self.new_flag))
        setattr(namespace, self.dest, self.const_value)


# Type names as the facts dump spells them -> the callable argparse gets ("None": no type).
TYPES: dict[str, Callable[[str], Any] | None] = {
    "None": None,
    "str": str,
    "int": int,
    "float": float,
    "human_readable_int": human_readable_int,
    "loads": json.loads,
    "json_list_type": json_list_type,
    "nullable_str": nullable_str,
    "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
    "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
}

# Action class names as the facts dump spells them -> what add_argument gets.
ACTIONS: dict[str, str | type[argparse.Action]] = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "BooleanOptionalAction": argparse.BooleanOptionalAction,
    "DeprecatedStoreTrueAction": DeprecatedStoreTrueAction,
    "DeprecatedStoreConstAction": DeprecatedStoreConstAction,
    "LoRAPathAction": LoRAPathAction,
}
