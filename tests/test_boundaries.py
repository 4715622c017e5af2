"""The core (models, store, session, plugins) never imports tools/ or textual: the design's boundaries, checked."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ["agent/models.py", "agent/store.py", "agent/session.py", "agent/plugins.py", "agent/servers.py"]
FORBIDDEN = ("tools", "textual")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("module", CORE)
def test_core_module_source_does_not_import_tools_or_textual(module):
    bad = [n for n in _imports(ROOT / module) if n.split(".")[0] in FORBIDDEN]
    assert not bad, f"{module} imports {bad}"


def test_importing_the_core_loads_neither_tools_nor_textual():
    code = (
        "import sys; import agent.models, agent.store, agent.session, agent.plugins; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tools', 'textual'}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_checker_catches_a_forbidden_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from tools.engines import sim\nimport textual.widgets\nimport toolsy\n")
    assert [n for n in _imports(sample) if n.split(".")[0] in FORBIDDEN] == ["tools.engines", "textual.widgets"]


def test_tools_never_import_the_loop_cli_or_tui():
    bad = []
    for path in (ROOT / "tools").rglob("*.py"):
        for name in _imports(path):
            if name in ("agent.loop", "agent.cli") or name.startswith("agent.tui") or name.split(".")[0] == "textual":
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, bad


def test_only_the_store_writes_sql():
    pattern = ("execute(", "executescript(", "sqlite3.connect")
    offenders = [
        str(p.relative_to(ROOT))
        for p in [*(ROOT / "agent").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]
        if p.name != "store.py" and any(s in p.read_text() for s in pattern)
    ]
    assert not offenders, offenders
