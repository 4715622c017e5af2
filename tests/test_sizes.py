"""Small modules with one job: no module of agent/ or tools/ over 700 lines, no function over 100 (by the AST, so a
decorator, a docstring and the body all count)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 100


def _modules() -> list[Path]:
    return sorted(p for top in ("agent", "tools") for p in (ROOT / top).rglob("*.py"))


def test_no_module_is_over_700_lines():
    long = {
        str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these modules (lines): {long}"


def test_no_function_is_over_100_lines():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (n := (node.end_lineno or node.lineno) - start + 1) > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert not long, f"split these functions (lines): {long}"


def test_the_checks_see_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    node = ast.parse(f"def f():\n{body}\n").body[0]
    assert node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
