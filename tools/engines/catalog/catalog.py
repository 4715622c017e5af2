"""One engine version's command line as data, and the argparse parser built from it that fails in the engine's words.

A catalog is loaded from `<engine>-<version>.json` beside this module (written by scripts/gen_catalog.py), or from
the package a plugin engine names (its own package data), with the types and actions that engine brings.
Its parser is a real `argparse.ArgumentParser` with the engine's prog, actions in the engine's order,
`allow_abbrev=True` and the engine's own type functions (argtypes.py for SGLang, vllm_argtypes.py for vLLM), so
"unrecognized arguments",
"ambiguous option", "invalid int value" and "invalid choice" are argparse's own texts for the Python running
pivot, which are SGLang's texts on the same Python. Instead of exiting, the parser raises CatalogError.
"""

from __future__ import annotations

import argparse
import ast
import copy
import functools
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any, NoReturn

from agent.errors import PivotError
from tools.engines.catalog import argtypes, vllm_argtypes
from tools.engines.catalog.argtypes import WARNINGS_ATTR


@dataclass(frozen=True, eq=False)
class ArgTypes:
    """An engine parser's types and actions by the names its catalog JSON uses: a type name maps to a callable
    (None for switches), an action name to argparse's name for it ("store", "store_true", ...) or an Action class."""

    types: Mapping[str, Callable[[str], Any] | None]
    actions: Mapping[str, str | type[argparse.Action]]


# What any catalog may name without bringing types of its own: argparse's basics.
BASIC_ARGTYPES = ArgTypes(
    types=MappingProxyType({"None": None, "str": str, "int": int, "float": float}),
    actions=MappingProxyType({
        "_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
        "_AppendAction": "append", "_CountAction": "count", "BooleanOptionalAction": argparse.BooleanOptionalAction,
    }),
)  # fmt: skip
# pivot's built-in catalogs' types and actions (read-only: a plugin engine brings its own ArgTypes instead).
BUILTIN_ARGTYPES: Mapping[str, ArgTypes] = MappingProxyType({
    "sglang": ArgTypes(argtypes.TYPES, argtypes.ACTIONS),
    "vllm": ArgTypes(vllm_argtypes.TYPES, vllm_argtypes.ACTIONS),
})  # fmt: skip

_HELP_OPTS = ("-h", "--help")


class CatalogError(PivotError):
    """The command line was refused, with the message exactly as the engine's argparse words it.

    `exit_code` is what the engine would exit with: 2 for a usage error (argparse prints `usage` and then
    `<prog>: error: <message>`), 0 for `--help` (the help text is in `stdout`), 1 for an exception raised by
    an action (SGLang prints a traceback). `stderr` is what the engine would print on stderr.
    """

    def __init__(
        self,
        message: str,
        *,
        prog: str = "",
        usage: str | Callable[[], str] = "",
        exit_code: int = 2,
        stdout: str = "",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.prog = prog
        self._usage = usage
        self.exit_code = exit_code
        self.stdout = stdout

    @property
    def usage(self) -> str:
        """argparse's usage text (`usage: sglang serve [-h] ...` and a newline), formatted when first asked for."""
        if callable(self._usage):
            self._usage = self._usage()
        return self._usage

    @property
    def stderr(self) -> str:
        """The text the engine writes on stderr for this error."""
        if self.exit_code == 2:
            return f"{self.usage}{self.prog}: error: {self.message}\n"
        return f"{self.message}\n" if self.message else ""


class CatalogParser(argparse.ArgumentParser):
    """An ArgumentParser that raises CatalogError where argparse would print and exit."""

    def error(self, message: str) -> NoReturn:
        raise CatalogError(message, prog=self.prog, usage=self.format_usage, exit_code=2)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise CatalogError((message or "").rstrip("\n"), prog=self.prog, usage=self.format_usage, exit_code=status)

    def print_help(self, file: Any = None) -> None:
        if file is not None:
            return super().print_help(file)
        raise CatalogError("", prog=self.prog, exit_code=0, stdout=self.format_help())


@dataclass(frozen=True)
class FlagSpec:
    """One argparse action of the engine: its option strings, where the value goes, how it is read."""

    opts: tuple[str, ...]
    dest: str
    type: str  # the type's name as the facts dump spells it; "None" for switches
    default: Any  # parsed from `default_repr`; None where the engine resolves the value later (hooks)
    default_repr: str
    choices: tuple[Any, ...] | None
    nargs: int | str | None  # 0 for switches, None for one value, "+", "*" or "?"
    action: str  # the action class name, e.g. "_StoreAction", "BooleanOptionalAction"
    required: bool

    @property
    def name(self) -> str:
        """The flag's main spelling, e.g. `--tp-size` (a positional argument's dest)."""
        return self.opts[0] if self.opts else self.dest

    @property
    def takes_value(self) -> bool:
        """True when the flag consumes values from the command line."""
        return self.nargs != 0

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> FlagSpec:
        """A spec from one catalog entry (the facts dump's shape)."""
        return cls(
            opts=tuple(entry["opts"]),
            dest=entry["dest"],
            type=entry["type"],
            default=ast.literal_eval(entry["default"]),
            default_repr=entry["default"],
            choices=None if entry["choices"] is None else tuple(entry["choices"]),
            nargs=entry["nargs"],
            action=entry["action"],
            required=bool(entry["required"]),
        )


HELP_SPEC = FlagSpec(_HELP_OPTS, "help", "None", None, "None", None, 0, "_HelpAction", False)


@dataclass(frozen=True)
class RemovedFlag:
    """A flag that is no longer in this version, with what to do instead."""

    flag: str
    replacement: str
    source: str = ""


@dataclass(frozen=True)
class DeprecatedFlag:
    """A flag still accepted but deprecated; `new_flag` is what the engine's own warning names."""

    flag: str
    replacement: str
    warns: bool
    source: str = ""
    new_flag: str | None = None
    const_value: Any = None


@dataclass(frozen=True)
class DeprecatedValue:
    """A value of current flags that is a deprecated alias of `replacement`."""

    flags: tuple[str, ...]
    value: str
    replacement: str
    source: str = ""


@dataclass(frozen=True)
class NoopFlag:
    """A flag accepted by the parser whose value no code of this version reads."""

    flag: str
    evidence: str
    source: str = ""


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


def _evaluate(node: ast.AST, values: Mapping[str, Any]) -> Any:
    """Evaluate the small expression language of `when` (names, constants, comparisons, and/or/not, %)."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, values)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_evaluate(v, values) for v in node.values)
        return any(_evaluate(v, values) for v in node.values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _evaluate(node.operand, values)
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, values)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _evaluate(right_node, values)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _evaluate(node.left, values) % _evaluate(node.right, values)
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_evaluate(e, values) for e in node.elts)
    raise ValueError(f"unsupported expression: {ast.dump(node)}")


@dataclass(frozen=True)
class InvalidCombination:
    """Flags that parse but that the engine refuses together, raising `error` with `message` at startup."""

    name: str
    flags: tuple[str, ...]
    when: str  # an expression over parsed values (dests), e.g. "a and b == 'none'"
    error: str  # the exception the engine raises, e.g. "ValueError"
    message: str  # the engine's message, exactly
    fix: str
    source: str = ""
    _tree: ast.Expression = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tree", ast.parse(self.when, mode="eval"))

    def applies(self, values: Mapping[str, Any]) -> bool:
        """True when the parsed values (dest -> value, defaults included) make the engine refuse to start."""
        try:
            return bool(_evaluate(self._tree, values))
        except (
            KeyError,
            TypeError,
            ZeroDivisionError,
        ):  # a dest missing or a None compared with a number: cannot be decided
            return False


@dataclass
class ParsedArgs:
    """The result of parsing: dest -> value with defaults applied, and the deprecation warnings SGLang would print."""

    values: dict[str, Any]
    warnings: list[str]


def _version_key(version: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\-]", version))


class Catalog:
    """One engine version's command line: its flags, a parser built from them, and the annotations.

    `removed`, `deprecated` and `noop` map a flag spelling to its annotation; `deprecated_values` and
    `invalid_combinations` are lists. All of it is read-only data.
    """

    def __init__(self, data: Mapping[str, Any], argtypes: ArgTypes | None = None) -> None:
        self.engine: str = data["engine"]
        self.version: str = data["version"]
        self.name: str = data.get("name", self.engine)
        self.prog: str = data["prog"]
        self.add_help: bool = bool(data.get("add_help", True))
        self.flags: tuple[FlagSpec, ...] = tuple(FlagSpec.from_entry(e) for e in data["flags"])
        self.removed: dict[str, RemovedFlag] = {r["flag"]: RemovedFlag(**r) for r in data.get("removed", [])}
        self.deprecated: dict[str, DeprecatedFlag] = {
            d["flag"]: DeprecatedFlag(**d) for d in data.get("deprecated", [])
        }
        self.deprecated_values: tuple[DeprecatedValue, ...] = tuple(
            DeprecatedValue(**{**d, "flags": tuple(d["flags"])}) for d in data.get("deprecated_values", [])
        )
        self.noop: dict[str, NoopFlag] = {n["flag"]: NoopFlag(**n) for n in data.get("noop", [])}
        self.invalid_combinations: tuple[InvalidCombination, ...] = tuple(
            InvalidCombination(**{**c, "flags": tuple(c["flags"])}) for c in data.get("invalid_combinations", [])
        )
        self._by_opt: dict[str, FlagSpec] = {}
        if self.add_help:
            self._by_opt.update(dict.fromkeys(_HELP_OPTS, HELP_SPEC))
        for spec in self.flags:
            for opt in spec.opts:
                self._by_opt[opt] = spec
        self._parsers: dict[bool, CatalogParser] = {}
        stray = sorted(flag for flag in self.noop if flag not in self._by_opt)
        if stray:  # a no-op is a flag the parser takes and no code reads: one it does not take would audit unknown
            raise PivotError(
                f"the catalog of {self.name} {self.version} lists {', '.join(stray)} as a no-op but not among its "
                "flags: a no-op is accepted by the parser and read nowhere",
                hint="add it to `flags` too (with its opts, dest and type), or drop it from `noop`",
            )
        kinds = argtypes or BUILTIN_ARGTYPES.get(self.engine, BASIC_ARGTYPES)
        self.types, self.actions = kinds.types, kinds.actions
        # the dest of the flag naming the model: required by the engine, optional for audits that need no model
        self.model_dest: str = data.get("model_dest", "model_path")
        unknown = sorted({s.type for s in self.flags} - set(self.types)) + sorted(
            {s.action for s in self.flags} - set(self.actions)
        )
        if unknown:
            raise PivotError(
                f"the catalog of {self.name} {self.version} names types or actions its engine does not bring: "
                + ", ".join(unknown),
                hint="give the engine's CatalogEngine an `argtypes = ArgTypes(types, actions)` that names them",
            )
        self.underscores: bool = bool(data.get("underscores", False))  # `--max_model_len` means `--max-model-len`

    @property
    def title(self) -> str:
        """The engine and version as messages name them, e.g. `SGLang 0.5.23`."""
        return f"{self.name} {self.version}"

    def __repr__(self) -> str:
        return f"<Catalog {self.engine} {self.version}: {len(self.flags)} flags>"

    # ---------------------------------------------------------------------------------------------
    # Looking flags up.

    @property
    def option_strings(self) -> list[str]:
        """Every option string in the parser's order (argparse's order for abbreviations), -h/--help first."""
        return list(self._by_opt)

    def flag(self, name: str) -> FlagSpec | None:
        """The flag with exactly this option string (any alias, `--no-x` forms too), or None."""
        return self._by_opt.get(name)

    def resolve(self, name: str) -> FlagSpec | str:
        """The flag `name` means to the engine's argparse: exact, `--x=value`, or a unique prefix.

        Otherwise the engine's error message: "ambiguous option: ... could match ..." or
        "unrecognized arguments: ...". Mirrors Python 3.11's argparse (`_parse_optional`) for option-like names.
        """
        name = self.normalize(name)
        if name in self._by_opt:
            return self._by_opt[name]
        if "=" in name:
            head = name.split("=", 1)[0]
            if head in self._by_opt:
                return self._by_opt[head]
        matches: list[str] = []
        if name.startswith("--"):
            prefix = name.split("=", 1)[0]
            matches = [opt for opt in self._by_opt if opt.startswith(prefix)]
        elif name.startswith("-") and len(name) > 1:
            short = name[:2]
            matches = [opt for opt in self._by_opt if opt == short or opt.startswith(name)]
        if len(matches) > 1:
            return f"ambiguous option: {name} could match {', '.join(matches)}"
        if len(matches) == 1:
            return self._by_opt[matches[0]]
        return f"unrecognized arguments: {name}"

    def deprecation(
        self, spec: FlagSpec, value: str | Sequence[str] | None = None
    ) -> DeprecatedFlag | DeprecatedValue | None:
        """The deprecation that applies to this flag (or to this value of it), if any."""
        for opt in spec.opts:
            if opt in self.deprecated:
                return self.deprecated[opt]
        typed = [value] if isinstance(value, str) else list(value or [])
        for note in self.deprecated_values:
            if note.value in typed and any(opt in note.flags for opt in spec.opts):
                return note
        return None

    def noop_note(self, spec: FlagSpec) -> NoopFlag | None:
        """The no-op annotation of this flag, if no code of this version reads it."""
        return next((self.noop[opt] for opt in spec.opts if opt in self.noop), None)

    # ---------------------------------------------------------------------------------------------
    # Parsing.

    def parser(self, *, require_model: bool = True) -> CatalogParser:
        """A new parser for this version (callers may add options of their own to it).

        With `require_model=False`, `--model-path` is optional, for audits and twins that need no model.
        """
        parser = CatalogParser(prog=self.prog, add_help=self.add_help, allow_abbrev=True)
        for spec in self.flags:
            opts, kwargs = self._argument(spec, require_model)
            parser.add_argument(*opts, **kwargs)
        return parser

    def normalize(self, token: str) -> str:
        """A command-line token as the engine's parser sees it: for vLLM, `--max_model_len=8` is
        `--max-model-len=8` (its FlexibleArgumentParser turns underscores in flag names into dashes)."""
        if not self.underscores or not token.startswith("--"):
            return token
        head, sep, value = token.partition("=")
        return head.replace("_", "-") + sep + value

    def _argument(self, spec: FlagSpec, require_model: bool) -> tuple[list[str], dict[str, Any]]:
        opts = list(spec.opts)
        kwargs: dict[str, Any] = {"action": self.actions[spec.action], "dest": spec.dest, "default": spec.default}
        if spec.default == argparse.SUPPRESS:  # argparse tells SUPPRESS by identity
            kwargs["default"] = argparse.SUPPRESS
        if not opts:  # a positional argument (vLLM's model tag): argparse takes its dest as the name
            opts = [kwargs.pop("dest")]
        if spec.action == "BooleanOptionalAction":  # it adds the --no-x spellings itself
            opts = [o for o in opts if not (o.startswith("--no-") and f"--{o[5:]}" in spec.opts)]
        if self.types[spec.type] is not None:
            kwargs["type"] = self.types[spec.type]
        if spec.choices is not None:
            kwargs["choices"] = list(spec.choices)
        if spec.nargs != 0:
            kwargs["nargs"] = spec.nargs
        if spec.required and (require_model or spec.dest != self.model_dest):
            kwargs["required"] = True
        note = self.deprecated.get(spec.name)
        if spec.action in ("DeprecatedStoreTrueAction", "DeprecatedStoreConstAction") and note is not None:
            kwargs["new_flag"] = note.new_flag
            if spec.action == "DeprecatedStoreConstAction":
                kwargs["const_value"] = note.const_value
        return opts, kwargs

    def _cached_parser(self, require_model: bool) -> CatalogParser:
        if require_model not in self._parsers:
            self._parsers[require_model] = self.parser(require_model=require_model)
        return self._parsers[require_model]

    def parse_args(self, argv: Sequence[str], *, require_model: bool = True) -> ParsedArgs:
        """Parse a command line as the engine would; raises CatalogError with the engine's message.

        Deprecation warnings are collected in the result rather than logged.
        """
        parser = self._cached_parser(require_model)
        namespace = argparse.Namespace(**{WARNINGS_ATTR: []})
        try:
            parser.parse_args([self.normalize(t) for t in argv], namespace)
        except CatalogError as e:
            e.hint = e.hint or self._hint(argv)
            raise
        except (AssertionError, ValueError) as e:  # raised by an action (--lora-paths): SGLang shows a traceback
            raise CatalogError(f"{type(e).__name__}: {e}", prog=self.prog, exit_code=1) from e
        values = vars(namespace)
        warnings = values.pop(WARNINGS_ATTR)
        # The parser is reused: copy mutable defaults so a caller's change cannot leak into the next parse.
        values = {k: copy.deepcopy(v) if isinstance(v, list | dict) else v for k, v in values.items()}
        return ParsedArgs(values=values, warnings=warnings)

    def parse(self, argv: Sequence[str], *, require_model: bool = True) -> dict[str, Any]:
        """dest -> value for a command line, defaults applied; raises CatalogError as the engine would fail."""
        return self.parse_args(argv, require_model=require_model).values

    def defaults(self) -> dict[str, Any]:
        """dest -> default for every flag (None where the engine resolves the value at startup)."""
        return self.parse([], require_model=False)

    def refused_combinations(self, values: Mapping[str, Any]) -> list[InvalidCombination]:
        """The known invalid combinations that parsed values (from `parse`) fall into."""
        return [combo for combo in self.invalid_combinations if combo.applies(values)]

    def _hint(self, argv: Sequence[str]) -> str | None:
        """What to do instead of the removed flags in `argv`, for the CLI's hint line."""
        notes = [self.removed[t.split("=", 1)[0]] for t in argv if t.split("=", 1)[0] in self.removed]
        return "; ".join(f"{n.flag} is not in {self.title} (removed): {n.replacement}" for n in notes) or None


def _catalog_files(package: str | None = None) -> resources.abc.Traversable:
    try:
        return resources.files(package or __package__ or "tools.engines.catalog")
    except ModuleNotFoundError as e:
        raise PivotError(f"no package {package!r} to read a catalog from", hint="name an installed package") from e


def available_versions(engine: str = "sglang", *, package: str | None = None) -> list[str]:
    """The versions of `engine` that have a catalog in `package` (default pivot's own), oldest first."""
    prefix = f"{engine}-"
    files = _catalog_files(package).iterdir()
    names = [p.name for p in files if p.name.startswith(prefix) and p.name.endswith(".json")]
    return sorted((n[len(prefix) : -len(".json")] for n in names), key=_version_key)


@functools.lru_cache(maxsize=16)
def load_catalog(
    engine: str = "sglang", version: str = "0.5.23", *, package: str | None = None, argtypes: ArgTypes | None = None
) -> Catalog:
    """The catalog of one engine version, `<engine>-<version>.json` in `package` (default pivot's shipped ones),
    parsed with `argtypes` (default: pivot's for its engines, else argparse's basics); PivotError (with the
    versions there are) if there is none."""
    path = _catalog_files(package) / f"{engine}-{version}.json"
    if not path.is_file():
        versions = available_versions(engine, package=package)
        raise PivotError(
            f"no command-line catalog for {engine} {version}",
            hint=f"catalogs for {engine}: {', '.join(versions)}" if versions else f"no catalogs for {engine} at all",
        )
    try:
        data = json.loads(path.read_text())
        return Catalog(data, argtypes)
    except PivotError:
        raise
    except (ValueError, KeyError, TypeError, SyntaxError) as e:
        raise PivotError(f"the catalog {path} is not a catalog: {type(e).__name__}: {e}") from e
