"""The design's boundaries, checked: the layers (application > domain > core, by import-linter's contract in
pyproject.toml), the core never importing tools/ or textual, plugins never importing each other, only the store
writing SQL and only the reports writing under docs_out/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STORE = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "agent" / "store").glob("*.py"))
CORE = [
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "agent" / "models").glob("*.py")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "agent" / "contracts").glob("*.py")),
    *STORE,
    "agent/session.py",
    "agent/paths.py",
    "agent/plugins.py",
    "agent/servers.py",
    "agent/errors.py",
    "agent/text.py",
    "agent/plans.py",
    "agent/settings.py",
]
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
        "import sys; import agent.models, agent.store, agent.session, agent.plugins, agent.contracts, agent.plans; "
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
            if (
                name in ("agent.loop", "agent.cli")
                or name.startswith(("agent.cli.", "agent.tui"))
                or name.split(".")[0] == "textual"
            ):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, bad


def _plugin_modules(root: Path = ROOT) -> dict[str, str]:
    """The tool plugins' modules (the `pivot.tools` entry points in pyproject.toml), by entry-point name."""
    import tomllib

    eps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]["pivot.tools"]
    return {name: target.split(":")[0] for name, target in eps.items()}


def _modules_imported(path: Path, package: str) -> set[str]:
    """Every module a file imports, `from pkg import name` counted as `pkg.name` too, relative imports resolved
    against `package` (the file's own package)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.add(module)
            out |= {f"{module}.{a.name}" for a in node.names}
    return out


def plugin_cross_imports(root: Path = ROOT) -> list[str]:
    """Tool plugin modules that import another tool plugin module (shared code belongs in a module of its own)."""
    plugins = set(_plugin_modules(root).values())
    bad = []
    for module in sorted(plugins):
        path = root / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = root / module.replace(".", "/") / "__init__.py"
        imported = _modules_imported(path, module.rpartition(".")[0] if path.name != "__init__.py" else module)
        bad += [f"{module} imports {other}" for other in sorted(plugins - {module}) if other in imported]
    return bad


def test_no_tool_plugin_imports_another_plugin():
    assert len(_plugin_modules()) >= 2
    offenders = plugin_cross_imports()
    assert not offenders, "move the shared code into a module of its own (tools/experiments.py): " + "; ".join(
        offenders
    )


def test_the_plugin_import_checker_catches_each_spelling(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "pyproject.toml").write_text(
        '[project.entry-points."pivot.tools"]\n'
        'a = "tools.a:toolset"\nb = "tools.b:toolset"\nc = "tools.c:toolset"\nd = "tools.d:toolset"\n'
        'e = "tools.e:toolset"\n'
    )
    (tmp_path / "tools" / "a.py").write_text("from tools.b import x\n")
    (tmp_path / "tools" / "b.py").write_text("from tools import c\n")
    (tmp_path / "tools" / "c.py").write_text("from . import d\n")
    (tmp_path / "tools" / "d.py").write_text("import tools.e\nfrom tools import shared\n")
    (tmp_path / "tools" / "e.py").write_text("from tools.shared import x\n")
    assert plugin_cross_imports(tmp_path) == [
        "tools.a imports tools.b",
        "tools.b imports tools.c",
        "tools.c imports tools.d",
        "tools.d imports tools.e",
    ]


def test_only_the_store_writes_sql():
    pattern = ("execute(", "executescript(", "sqlite3.connect")
    store = ROOT / "agent" / "store"
    offenders = [
        str(p.relative_to(ROOT))
        for p in [*(ROOT / "agent").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]
        if store not in p.parents and any(s in p.read_text() for s in pattern)
    ]
    assert not offenders, offenders
    assert len(STORE) > 5 and any(s in (store / "core.py").read_text() for s in pattern)  # the rule still sees it


def test_only_the_reports_package_writes_under_docs_out():
    """docs_out/ is reached through Paths.docs_dir/docs_root (agent/paths.py defines them); only tools/reports/ asks."""
    pattern = ("docs_dir(", "docs_root")
    users = {
        rel
        for p in [*(ROOT / "agent").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]
        if (rel := str(p.relative_to(ROOT))) != "agent/paths.py" and any(s in p.read_text() for s in pattern)
    }
    assert users, "nothing writes under docs_out/: the rule checks nothing"
    assert not [u for u in users if not u.startswith("tools/reports/")], sorted(users)


# Size limits: no module over MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES (a function's lines run
# from its `def` to its last line, decorators and docstring included), in every module of agent/ and tools/.
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 100
SIZED_PATHS = ["agent", "tools"]


def size_offenders(paths: list[str], root: Path = ROOT) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and functions over MAX_FUNCTION_LINES, under `paths` (files or folders)."""
    files = sorted({f for p in paths for f in ([root / p] if p.endswith(".py") else (root / p).rglob("*.py"))})
    out = []
    for path in files:
        source = path.read_text()
        rel = path.relative_to(root)
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            out.append(f"{rel}: {lines} lines")
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                size = node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1
                if size > MAX_FUNCTION_LINES:
                    out.append(f"{rel}:{node.lineno} {node.name}(): {size} lines")
    return out


def test_modules_and_functions_stay_small():
    offenders = size_offenders(SIZED_PATHS)
    assert not offenders, "split these (one rule per function, one concern per module): " + "; ".join(offenders)


def test_the_size_checker_catches_a_long_module_and_a_long_function(tmp_path):
    long_function = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text(long_function + "y = 2\n" * MAX_MODULE_LINES)
    (tmp_path / "pkg" / "small.py").write_text("def g():\n    return 1\n")
    found = size_offenders(["pkg"], root=tmp_path)
    assert found == [f"pkg/big.py: {MAX_FUNCTION_LINES + 1 + MAX_MODULE_LINES} lines", "pkg/big.py:1 f(): 101 lines"]


# ---- the layers: import-linter's contract in pyproject.toml


def _layers(root: Path = ROOT) -> list[list[str]]:
    import tomllib

    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    return [[name.strip() for name in layer.replace("|", ":").split(":")] for layer in layers]


def _lint_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )


def test_the_layers_contract_is_kept():
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # the layers, the proposers' direction, the method's values without a proposer, the engines below the method,
    # loadgen and analysis apart, the models alone
    assert "6 kept, 0 broken" in proc.stdout


def test_every_module_of_agent_is_placed_in_a_layer():
    """A new module of agent/ says whether it is the core or the application: the contract names it."""
    application, domain, core = _layers()
    assert domain == ["tools"]
    placed = {name.split(".")[1] for name in application + core}
    found = {
        p.stem if p.is_file() else p.name
        for p in (ROOT / "agent").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    }
    found -= {"bundled_plans"}  # plans shipped as data (pyproject's package-dir), no code
    assert not found - placed, f"place these in a layer of pyproject.toml's contract: {sorted(found - placed)}"
    assert not placed - found, f"the contract names modules that do not exist: {sorted(placed - found)}"


@pytest.mark.parametrize(
    ("module", "planted", "arrow"),
    [
        ("tools/search.py", "import agent.loop\n", "tools.search -> agent.loop"),
        ("agent/store/core.py", "from tools import search as _search\n", "agent.store.core -> tools.search"),
        ("tools/peers.py", "from tools import search as _search\n", "tools.peers -> tools.search"),
        ("agent/models/bench.py", "from agent import store as _store\n", "agent.models.bench -> agent.store"),
        ("tools/method/moves.py", "from tools import search as _search\n", "tools.method.moves -> tools.search"),
        (
            "tools/engines/sim/engine.py",
            "from tools.method import reading as _r\n",
            "tools.engines.sim.engine -> tools.method.reading",
        ),
        (
            "tools/loadgen/stream.py",
            "from tools.analysis import roofline as _r\n",
            "tools.loadgen.stream -> tools.analysis.roofline",
        ),
    ],
)
def test_a_planted_import_that_runs_back_up_breaks_the_contract(tmp_path, module, planted, arrow):
    import os
    import shutil

    for name in ("agent", "tools"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + planted)
    proc = _lint_imports(tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "BROKEN" in proc.stdout and arrow in proc.stdout, proc.stdout[-3000:]


# No circle: the method's moves are computed by tools/method/compute.py (moves_of), which calls the proposers, and its
# values import none (the `method-values` contract); the search reads its probes (the ledger's leave-one-out facts),
# never the other way. Any circle, a function-local or a type-checking import included, fails.


def circles(graph) -> list[set[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph.modules):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    import grimp

    graph = grimp.build_graph("agent", "tools", include_external_packages=False)
    found = [sorted(c) for c in circles(graph)]
    assert not found, f"import circles: {found}"


def test_the_circle_finder_finds_a_planted_circle():
    import grimp

    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert circles(graph) == [{"p.a", "p.b", "p.c"}]
