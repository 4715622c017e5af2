"""Deprecated and no-op flags of a vLLM version, read from its source and its parser's help texts.

Shared by scripts/gen_vllm_catalog.py (the shipped catalog, from an unpacked wheel) and vllm_live.py (the installed
vLLM's parser): the `_*_DEPRECATION_MESSAGE` texts of vllm/engine/arg_utils.py and every help text that says
"deprecated" or "has no effect" (the replacement is the flag the text says to use instead).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

# "has no effect" without a condition ("has no effect with Ray executors" is not a no-op)
_NO_EFFECT = re.compile(r"has no effect(?!\s+(?:with|when|if|unless|on|for)\b)", re.IGNORECASE)
_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*(?:\.[a-z0-9_.-]+)?")


def _replacement(text: str, flag: str) -> str | None:
    match = re.search(r"[Uu]se (`?(--[\w.-]+)`?(?: [^.;]*)?) instead", text)
    return match.group(1).strip("`") if match and match.group(2) != flag else None


def detect(
    source: Path, flags: list[dict[str, Any]], helps: dict[str, str], version: str
) -> tuple[list[dict], list[dict]]:
    """(deprecated, no-op) annotations of `version` from the source under `source` (the directory holding vllm/)
    and the parser's help texts (dest -> text), in a catalog's shape."""
    by_opt = {opt: entry for entry in flags for opt in entry["opts"]}
    texts: list[tuple[str, str]] = []  # (text, where)
    arg_utils = source / "vllm" / "engine" / "arg_utils.py"
    tree = ast.parse(arg_utils.read_text(encoding="utf-8")) if arg_utils.is_file() else ast.Module(body=[])
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.endswith("_DEPRECATION_MESSAGE"):
                    texts.append((node.value.value, f"vllm/engine/arg_utils.py {target.id}"))
    for entry in flags:
        text = helps.get(entry["dest"], "")
        if entry["opts"] and re.search(r"\bdeprecated\b|has no effect", text, re.IGNORECASE):
            texts.append((text, f"help of {entry['opts'][0]} (vllm {version})"))
    deprecated: dict[str, dict] = {}
    noop: dict[str, dict] = {}
    for text, where in texts:
        named = [f for f in _FLAG.findall(text) if f in by_opt]
        if not named or not re.search(r"\bdeprecated\b|has no effect", text, re.IGNORECASE):
            continue
        flag = by_opt[named[0]]["opts"][0]
        if re.search(r"\bdeprecated\b", text, re.IGNORECASE) and flag not in deprecated:
            instead = _replacement(text, flag) or "drop it (vLLM says it will be removed)"
            deprecated[flag] = {"flag": flag, "replacement": instead, "warns": False, "source": f"{where}: {text}"}
        if _NO_EFFECT.search(text) and flag not in noop:
            noop[flag] = {"flag": flag, "evidence": text, "source": where}
    return sorted(deprecated.values(), key=lambda d: d["flag"]), sorted(noop.values(), key=lambda d: d["flag"])
