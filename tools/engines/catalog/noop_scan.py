"""Which SGLang flags no code reads: a scan of SGLang's package source for each flag's dest outside its definitions.

A flag is a no-op when the field it sets (its argparse dest, the dataclass field name) appears nowhere
in SGLang's Python code except where arguments are defined. Definitions are, as in SGLang 0.5.23:
every file of `sglang/srt/arg_groups/fields/`, `sglang/srt/arg_groups/field_order.py`, and in
`sglang/srt/server_args.py` the body of `add_cli_args` and the class-level field declarations (older
versions declared every field there). Everything else counts as a reader, including strings
(`getattr(args, "name")`) and docstrings, so the scan errs towards "read": a field read only through a
name built at run time would be reported as a no-op, one mentioned only in a comment elsewhere is not.

Flags and dests come from the same source (the fields' `A[T, ...]` annotations with their `Arg(cli_name=,
aliases=, no_cli=)`, and `parser.add_argument(...)` calls in `add_cli_args`), or from a catalog's flags.

    scan = scan_noops("/tmp/sglwheel/src")          # the directory holding sglang/, or sglang/ itself
    [n.flag for n in scan.noops]                     # ['--num-continuous-decode-steps', ...]
    audit(catalog, config, noop=scan.notes())        # the audit with these no-ops instead of the catalog's
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import PivotError
from tools.engines.catalog.catalog import NoopFlag

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FIELDS_DIR = "srt/arg_groups/fields"
FIELD_ORDER = "srt/arg_groups/field_order.py"
SERVER_ARGS = "srt/server_args.py"


@dataclass(frozen=True)
class SourceFlag:
    """One command-line flag as SGLang's source defines it: its option strings and the field it sets."""

    opts: tuple[str, ...]
    dest: str
    defined_in: str  # path relative to the package directory, e.g. srt/arg_groups/fields/schedule.py


@dataclass(frozen=True)
class ScannedNoop:
    """A flag whose dest no code outside the argument definitions reads."""

    flag: str
    opts: tuple[str, ...]
    dest: str
    defined_in: tuple[str, ...]  # the definition files that mention the dest

    @property
    def evidence(self) -> str:
        where = " and ".join(p.removeprefix("srt/") for p in self.defined_in) or "no file"
        return f"{self.dest} appears only in {where}"


@dataclass
class NoopScan:
    """The result of one scan: where, which version, how much was read, and the flags found unread."""

    package_dir: Path
    version: str | None
    flags: int
    files: int
    noops: list[ScannedNoop] = field(default_factory=list)

    def notes(self) -> dict[str, NoopFlag]:
        """Option string -> NoopFlag for every spelling of every unread flag, as the audit takes them."""
        source = f"identifier scan of {self.package_dir}" + (f" (SGLang {self.version})" if self.version else "")
        out: dict[str, NoopFlag] = {}
        for n in self.noops:
            note = NoopFlag(flag=n.flag, evidence=n.evidence, source=source)
            out.update(dict.fromkeys(n.opts, note))
        return out

    @property
    def summary(self) -> str:
        """One line for a terminal: what was scanned and what was found."""
        found = ", ".join(n.flag for n in self.noops) or "none"
        version = f"SGLang {self.version} " if self.version else ""
        return f"{version}source {self.package_dir}: {self.flags} flags, {self.files} files scanned; unread: {found}"


def find_package_dir(path: str | Path) -> Path:
    """The `sglang` package directory in `path` (a site-packages or unpacked wheel, or the package itself)."""
    root = Path(path).expanduser()
    for candidate in (root / "sglang", root):
        if (candidate / "srt").is_dir() and (candidate / "__init__.py").is_file():
            return candidate.resolve()
    raise PivotError(
        f"no SGLang package source in {root}",
        hint="give the directory that holds sglang/ (site-packages, or a wheel unpacked with unzip)",
    )


def package_version(package_dir: Path) -> str | None:
    """SGLang's version from the dist-info beside the package, else a literal `__version__` in its version files."""
    for info in sorted(package_dir.parent.glob("sglang-*.dist-info")):
        meta = info / "METADATA"
        if meta.is_file():
            for line in meta.read_text(errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    for name in ("_version.py", "version.py"):
        path = package_dir / name
        if not path.is_file():
            continue
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                if names & {"__version__", "version"} and isinstance(node.value.value, str):
                    return node.value.value
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == "__version__"
                and isinstance(node.value, ast.Constant)
            ):
                return str(node.value.value)
    return None


# ------------------------------------------------------------------------------------------ definitions


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(errors="replace"), filename=str(path))
    except (SyntaxError, ValueError):
        return None


def _string_list(node: ast.AST | None) -> list[str]:
    if isinstance(node, ast.List | ast.Tuple):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _annotated_flag(name: str, annotation: ast.AST) -> tuple[str, ...] | None:
    """The option strings of a field declared `name: A[T, "help"]` or `A[T, Arg(...)]`; None when it has no CLI."""
    if not isinstance(annotation, ast.Subscript):
        return None
    head = annotation.value
    head_name = head.id if isinstance(head, ast.Name) else head.attr if isinstance(head, ast.Attribute) else ""
    if head_name not in ("A", "Annotated") or not isinstance(annotation.slice, ast.Tuple):
        return None
    for meta in annotation.slice.elts[1:]:
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            return (f"--{name.replace('_', '-')}",)
        if isinstance(meta, ast.Call) and getattr(meta.func, "id", getattr(meta.func, "attr", "")) == "Arg":
            kw = {k.arg: k.value for k in meta.keywords if k.arg}
            no_cli = kw.get("no_cli")
            if isinstance(no_cli, ast.Constant) and no_cli.value is True:
                return None
            cli = kw.get("cli_name")
            main = cli.value if isinstance(cli, ast.Constant) else f"--{name.replace('_', '-')}"
            opts = [main, *_string_list(kw.get("aliases"))]
            action = kw.get("action")
            if getattr(action, "attr", getattr(action, "id", "")) == "BooleanOptionalAction":
                opts += [f"--no-{o[2:]}" for o in opts if o.startswith("--")]  # as argparse adds them
            return tuple(opts)
    return None


def _field_flags(tree: ast.Module, rel: str) -> list[SourceFlag]:
    out = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                opts = _annotated_flag(stmt.target.id, stmt.annotation)
                if opts is not None:
                    out.append(SourceFlag(opts, stmt.target.id, rel))
    return out


def _add_argument_flags(func: ast.AST, rel: str) -> list[SourceFlag]:
    out = []
    for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
        if getattr(call.func, "attr", None) != "add_argument":
            continue
        opts = tuple(a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
        if not opts or not all(o.startswith("-") for o in opts):
            continue
        dest_kw = next((k.value for k in call.keywords if k.arg == "dest"), None)
        if isinstance(dest_kw, ast.Constant) and isinstance(dest_kw.value, str):
            dest = dest_kw.value
        else:
            long = next((o for o in opts if o.startswith("--")), opts[0])
            dest = long.lstrip("-").replace("-", "_")
        out.append(SourceFlag(opts, dest, rel))
    return out


def _server_args_definitions(tree: ast.Module) -> tuple[list[ast.AST], list[tuple[int, int]]]:
    """`add_cli_args` functions and ServerArgs' class-level field declarations, with their line ranges."""
    nodes: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "add_cli_args":
            nodes.append(node)
        elif isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            nodes.extend(s for s in node.body if isinstance(s, ast.AnnAssign))
    spans = [(n.lineno, n.end_lineno or n.lineno) for n in nodes]  # type: ignore[attr-defined]
    return nodes, spans


def source_flags(package_dir: Path) -> list[SourceFlag]:
    """Every flag SGLang's source defines: annotated fields in arg_groups/fields, add_argument calls in add_cli_args."""
    out: list[SourceFlag] = []
    fields_dir = package_dir / FIELDS_DIR
    if fields_dir.is_dir():
        for path in sorted(fields_dir.glob("*.py")):
            tree = _parse(path)
            if tree is not None:
                out.extend(_field_flags(tree, path.relative_to(package_dir).as_posix()))
    server_args = package_dir / SERVER_ARGS
    tree = _parse(server_args) if server_args.is_file() else None
    if tree is not None:
        for node in _server_args_definitions(tree)[0]:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.extend(_add_argument_flags(node, SERVER_ARGS))
    # one entry per dest (a deprecated spelling registered by hand may share a field's dest)
    merged: dict[str, SourceFlag] = {}
    for f in out:
        if f.dest in merged:
            old = merged[f.dest]
            merged[f.dest] = SourceFlag(tuple(dict.fromkeys((*old.opts, *f.opts))), f.dest, old.defined_in)
        else:
            merged[f.dest] = f
    return list(merged.values())


# ------------------------------------------------------------------------------------------ readers


def _masked(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """`text` with the given 1-based line ranges blanked, so their words do not count."""
    if not spans:
        return text
    lines = text.splitlines(keepends=True)
    for start, end in spans:
        for i in range(start - 1, min(end, len(lines))):
            lines[i] = "\n"
    return "".join(lines)


def _before_hash(text: str, word: str) -> bool:
    """True when `word` appears on some line before that line's first `#` (so certainly not in a comment)."""
    pattern = re.compile(rf"^[^#\n]*\b{re.escape(word)}\b", re.MULTILINE)
    return pattern.search(text) is not None


def _code_words(text: str) -> set[str]:
    """Words in names and strings (docstrings and f-strings included), not in comments."""
    words: set[str] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NAME, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
                words.update(_WORD.findall(tok.string))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return set(_WORD.findall(text))  # cannot tokenize: every word counts (a reader, to be safe)
    return words


def scan_noops(
    source: str | Path,
    flags: Iterable[tuple[Sequence[str], str]] | None = None,
) -> NoopScan:
    """Scan SGLang's package source under `source` for flags whose dest nothing outside the definitions reads.

    `flags` are (option strings, dest) pairs, e.g. from a catalog; by default they come from the source itself.
    Raises PivotError when `source` holds no SGLang package or no flag definitions.
    """
    package_dir = find_package_dir(source)
    version = package_version(package_dir)
    if flags is None:
        defined = source_flags(package_dir)
        if not defined:
            raise PivotError(
                f"no flag definitions found in {package_dir}",
                hint=f"expected {FIELDS_DIR}/*.py or add_cli_args in {SERVER_ARGS}",
            )
    else:
        defined = [SourceFlag(tuple(opts), dest, "") for opts, dest in flags]
    dests = {f.dest for f in defined}

    definition_files: dict[str, set[str]] = {}  # dest -> definition files that mention it
    readers: dict[str, list[tuple[Path, str]]] = {}  # dest -> (file, text as scanned) where it appears
    files = 0
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        files += 1
        found = set(_WORD.findall(text)) & dests
        if not found:
            continue
        if rel.startswith(FIELDS_DIR + "/") or rel == FIELD_ORDER:
            for dest in found:
                definition_files.setdefault(dest, set()).add(rel)
            continue
        if rel == SERVER_ARGS:
            tree = _parse(path)
            spans = _server_args_definitions(tree)[1] if tree is not None else []
            masked = _masked(text, spans)
            for dest in found - set(_WORD.findall(masked)):
                definition_files.setdefault(dest, set()).add(rel)
            text = masked
            found &= set(_WORD.findall(masked))
        for dest in found:
            readers.setdefault(dest, []).append((path, text))

    code_words: dict[Path, set[str]] = {}
    noops: list[ScannedNoop] = []
    for f in defined:
        read = False
        for path, text in readers.get(f.dest, []):
            if _before_hash(text, f.dest):
                read = True  # a word before the first # of its line is code or a string, never a comment
                break
            if path not in code_words:
                code_words[path] = _code_words(text)
            if f.dest in code_words[path]:
                read = True
                break
        if not read:
            where = tuple(sorted(definition_files.get(f.dest, ()), key=lambda p: (p == FIELD_ORDER, p)))
            noops.append(ScannedNoop(flag=f.opts[0], opts=f.opts, dest=f.dest, defined_in=where))
    return NoopScan(package_dir=package_dir, version=version, flags=len(defined), files=files, noops=noops)
