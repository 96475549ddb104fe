#!/usr/bin/env python3
"""Mutation testing of the conformance suite: operator mutants of ``reference_impl/``, each
served as an implementation (``--kv-impl``) and run against the shipped suite.

    scripts/mutate.py --list                      # the mutants, nothing run
    scripts/mutate.py --modules block_hash_map    # one module (about a minute)
    scripts/mutate.py --jobs 2 --results out.jsonl --resume   # all (docs/mutation.md)
    scripts/mutate.py --only 'block_pool:BlockPool.touch:cmp:0'

How a mutant is served: the reference package is copied into a temporary folder under another
name (``kvmut_ref``), with one module replaced by its mutated source, and a copy of the
reference adapter (``kvmut_adapter``) imports that copy. The suite's oracle, differential
partner and golden-trace helpers keep importing ``kvcheck.reference_impl``, which is never
touched, so a mutant is always judged against the real reference. The error classes stay the
reference's own (``kvcheck.reference_impl.errors`` is not copied), so ``isinstance`` checks
see the same types. Mutants do not declare ``kernels`` (the kernel checks do not depend on
the manager). The reference, the adapter and the suite's test modules are read once at the
start, so a checkout edited during a run does not mix versions.

Each mutant runs ``pytest -x`` on the suite under each profile of ``--profiles`` in turn
(stopping at the first failure: a mutant is *killed* when any profile's run fails), with a
fast configuration: ``--kv-max-examples`` examples, no Hypothesis shrinking, no whole-suite
inventory child and a per-call ``--kv-timeout``. A run that does not end in ``--timeout``
seconds kills the mutant too (``timeout``), and so does one the suite refuses to load
(``error``). A mutant that passes everything *survives*; docs/mutation.md lists the survivors
known to be equivalent (behaviour no vLLM-conformant observer can tell from the reference),
each with its reason, and this script exits 1 on any other survivor.

Operators (``--operators``): ``cmp`` (``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``is``/``is
not``, ``in``/``not in``), ``const`` (an int ``n`` becomes ``n + 1``, ``1`` becomes ``0``;
``True``/``False`` swap), ``boolop`` (``and``/``or``), ``arith`` (``+``/``-``, ``+=``/``-=``),
``not`` (a ``not`` dropped), ``cond`` (a bare ``if x``/``while x`` negated), ``stmt`` (a call
statement, an augmented assignment or an assignment to an attribute or item removed),
``reverse`` (``for x in xs`` iterates ``reversed(list(xs))``; ``reversed(xs)`` becomes ``xs``),
``break`` (``break`` becomes ``continue``), ``minmax`` (``min``/``max``), ``return``
(``return True``/``False`` swap).

Not mutated: input validation (code under a ``raise``, ``if`` blocks that end by raising or
by calling a ``_raise*`` helper, ``assert``s, helpers named
``_check*``/``_validate*``/``_as_*``/``_non_negative``/``_raise*`` and the statements calling
them), logging, f-strings, docstrings, declaration flags (``repr=False``,
``total=False``): the suite's contract is behaviour on valid calls. ``invariants.py`` is
mutated only when ``--modules`` names it: it is the implementation's own self-check, and a
weakened self-check cannot be told apart on a correct pool. Per profile, a mutant runs only
where the suite executes its statement on the implementation side (a coverage run of the
unmutated copy, which is also the control); mutants no profile reaches are counted as *not
covered*.

Key of a mutant: ``module:qualname:operator:index``, the index counting that operator's
mutants within the function in source order, so keys survive edits elsewhere in the module.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import fnmatch
import importlib.util
import json
import os
import queue
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO / "reference_impl"
ADAPTER_FILE = REPO / "adapters" / "reference.py"
SUITE_DIR = REPO / "conformance"
DOC = REPO / "docs" / "mutation.md"

PACKAGE = "kvmut_ref"  # the mutated copy of kvcheck.reference_impl
ADAPTER = "kvmut_adapter"  # the copy of kvcheck.adapters.reference importing it
IMPL = "kvmut_impl"  # the --kv-impl module: the adapter copy minus kernels
PLUGIN = "kvmut_plugin"  # a pytest plugin: no shrinking, no whole-suite inventory child
#: Modules not mutated: error classes (shared with the oracle) and re-exports.
SKIP_MODULES = frozenset({"__init__", "errors"})
#: Modules mutated only when named in --modules. invariants.py is the implementation's own
#: self-check (check_invariants): weakening it is unobservable on a correct pool by
#: construction, so most of its mutants survive at full cost (docs/mutation.md).
NOT_BY_DEFAULT = frozenset({"invariants"})
OPERATORS = ("cmp", "const", "boolop", "arith", "not", "cond", "stmt", "reverse", "break",
             "minmax", "return")
PROFILES = ("vllm-0.33", "vllm-0.10")

_CMP_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_ARITH_SWAP: dict[type[ast.operator], type[ast.operator]] = {ast.Add: ast.Sub, ast.Sub: ast.Add}
_DECLARATION_FLAGS = frozenset({"repr", "compare", "init", "eq", "frozen", "slots", "order",
                                "kw_only", "hash", "unsafe_hash", "match_args", "total"})
_CMP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
             ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not", ast.In: "in",
             ast.NotIn: "not in"}


# ------------------------------------------------------------------------------- mutants
@dataclasses.dataclass(frozen=True)
class Mutant:
    """One single-point change of one module. ``path`` locates the node to change: the
    field/index steps from the module's ``ast.Module`` down to it."""

    module: str
    qualname: str
    operator: str
    index: int
    line: int
    stmt_line: int  # the first line of the enclosing statement (what coverage reports)
    change: str  # human-readable, e.g. "ref_cnt == 0 -> ref_cnt != 0"
    path: tuple[tuple[str, int | None], ...]

    @property
    def key(self) -> str:
        return f"{self.module}:{self.qualname}:{self.operator}:{self.index}"


def _is_docstring(node: ast.AST, parent: ast.AST | None) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and isinstance(parent, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and bool(parent.body) and parent.body[0] is node)


def _error_path(body: Sequence[ast.stmt]) -> bool:
    """A block that ends by raising, or by calling a helper that only raises (``_raise*``):
    an argument check (what precedes the raise only builds its message)."""
    return bool(body) and (isinstance(body[-1], ast.Raise) or _calls_raiser(body[-1]))


#: Helpers that only raise, by name (``KVCacheManager._raise_negative``): a call to one ends
#: an argument check as a ``raise`` does.
_RAISER = re.compile(r"^_raise(_|$)")


def _calls_raiser(node: ast.stmt) -> bool:
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func = node.value.func
    name = func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else ""
    return bool(_RAISER.match(name))


def _is_logging(node: ast.AST) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and isinstance(node.value.func.value, ast.Name)
            and node.value.func.value.id == "_logger")


#: Input-validation helpers (by name): not mutated, nor the statements calling them.
_VALIDATION = re.compile(r"^_(check|validate|as|non_negative|raise)(_|$)")


def _is_validation(node: ast.AST) -> bool:
    """A validation helper's definition, or a statement that only calls one."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return bool(_VALIDATION.match(node.name))
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        name = func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else ""
        return bool(_VALIDATION.match(name))
    return False


def _short(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


class _Finder:
    """Walks one module and lists every mutation point (operators in ``OPERATORS``)."""

    def __init__(self, module: str, source: str, operators: frozenset[str]) -> None:
        self.module = module
        self.lines = source.splitlines()
        self.operators = operators
        self.out: list[Mutant] = []
        self.counts: Counter[tuple[str, str]] = Counter()

    def _add(self, qualname: str, operator: str, node: ast.AST, stmt: ast.stmt,
             change: str, path: tuple[tuple[str, int | None], ...]) -> None:
        if operator not in self.operators:
            return
        index = self.counts[(qualname, operator)]
        self.counts[(qualname, operator)] += 1
        line = getattr(node, "lineno", stmt.lineno)
        text = self.lines[line - 1].strip()
        text = text if len(text) <= 70 else text[:67] + "..."
        self.out.append(Mutant(self.module, qualname, operator, index, line, stmt.lineno,
                               f"{change} in `{text}`", path))

    def visit(self, node: ast.AST, path: tuple[tuple[str, int | None], ...], qualname: str,
              stmt: ast.stmt | None, parent: ast.AST | None) -> None:
        if isinstance(node, (ast.Raise, ast.Assert, ast.JoinedStr)) or _is_logging(node):
            return
        if _is_validation(node):
            return  # input validation: see the module docstring
        if isinstance(node, ast.keyword) and node.arg in _DECLARATION_FLAGS:
            return  # field(repr=False), dataclass(slots=True), TypedDict(total=False)
        if _is_docstring(node, parent):
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qualname = f"{qualname}.{node.name}" if qualname != "<module>" else node.name
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # Decorators, defaults and annotations are not behaviour under test.
                for i, child in enumerate(node.body):
                    self.visit(child, (*path, ("body", i)), qualname, child, node)
                return
        if isinstance(node, ast.stmt):
            stmt = node
            self._statement(node, path, qualname)
        if isinstance(node, ast.If) and _error_path(node.body) and not node.orelse:
            return  # an argument check: not mutated (see the module docstring)
        assert stmt is not None or isinstance(node, ast.Module)
        if stmt is not None:
            self._expression(node, path, qualname, stmt)
        for field, value in ast.iter_fields(node):
            if field in ("decorator_list", "returns", "annotation", "type_comment"):
                continue
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        self.visit(child, (*path, (field, i)), qualname, stmt, node)
            elif isinstance(value, ast.AST):
                self.visit(value, (*path, (field, None)), qualname, stmt, node)

    def _statement(self, node: ast.stmt, path: tuple[tuple[str, int | None], ...],
                   qualname: str) -> None:
        if qualname == "<module>":
            return  # module-level statements define things; only their constants mutate
        removable = (
            (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))
            or isinstance(node, ast.AugAssign)
            or (isinstance(node, ast.Assign)
                and all(isinstance(t, (ast.Attribute, ast.Subscript)) for t in node.targets))
        )
        if removable:
            self._add(qualname, "stmt", node, node, "statement removed", path)
        if isinstance(node, ast.AugAssign) and type(node.op) in _ARITH_SWAP:
            self._add(qualname, "arith", node, node, "+= <-> -=", path)
        if isinstance(node, ast.For):
            self._add(qualname, "reverse", node, node, "iterated in reverse", path)
        if isinstance(node, ast.Break):
            self._add(qualname, "break", node, node, "break -> continue", path)
        if (isinstance(node, ast.Return) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, bool)):
            self._add(qualname, "return", node, node, f"returns {not node.value.value}", path)
        if isinstance(node, (ast.If, ast.While)) and not isinstance(
                node.test, (ast.Compare, ast.BoolOp, ast.UnaryOp)):
            self._add(qualname, "cond", node, node, f"`{_short(node.test)}` negated", path)

    def _expression(self, node: ast.AST, path: tuple[tuple[str, int | None], ...],
                    qualname: str, stmt: ast.stmt) -> None:
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMP_SWAP:
                    new = _CMP_TEXT[_CMP_SWAP[type(op)]]
                    self._add(qualname, "cmp", node, stmt,
                              f"{_CMP_TEXT[type(op)]} -> {new} (`{_short(node)}`)",
                              (*path, ("ops", i)))
        elif isinstance(node, ast.BoolOp):
            self._add(qualname, "boolop", node, stmt, "and <-> or", path)
        elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH_SWAP:
            self._add(qualname, "arith", node, stmt, f"+ <-> - (`{_short(node)}`)", path)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._add(qualname, "not", node, stmt, "`not` dropped", path)
        elif isinstance(node, ast.Constant) and isinstance(node.value, int):
            if isinstance(node.value, bool):
                change = f"{node.value} -> {not node.value}"
            else:
                change = f"{node.value} -> {_const_mutation(node.value)}"
            self._add(qualname, "const", node, stmt, change, path)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("min", "max"):
                other = "max" if node.func.id == "min" else "min"
                self._add(qualname, "minmax", node, stmt, f"{node.func.id} -> {other}", path)
            elif node.func.id == "reversed" and len(node.args) == 1:
                self._add(qualname, "reverse", node, stmt, "reversed() dropped", path)


def _const_mutation(value: int) -> int:
    return 0 if value == 1 else value + 1


def find_mutants(module: str, source: str, operators: frozenset[str]) -> list[Mutant]:
    """Every mutation point of one module's source, in source order."""
    tree = ast.parse(source)
    finder = _Finder(module, source, operators)
    finder.visit(tree, (), "<module>", None, None)
    return sorted(finder.out, key=lambda m: (m.line, m.key))


def _resolve(tree: ast.AST, path: tuple[tuple[str, int | None], ...]) -> tuple[ast.AST, str,
                                                                              int | None]:
    """(parent node, field, index) of the node at ``path``."""
    node = tree
    for field, index in path[:-1]:
        value = getattr(node, field)
        node = value if index is None else value[index]
    return node, path[-1][0], path[-1][1]


def apply_mutant(source: str, mutant: Mutant) -> str:
    """The module's source with ``mutant`` applied (unparsed: comments are dropped)."""
    tree = ast.parse(source)
    parent, field, index = _resolve(tree, mutant.path)
    value = getattr(parent, field)
    node = value if index is None else value[index]
    op = mutant.operator
    replacement: ast.AST | None = None
    if op == "cmp" and field == "ops":
        value[index] = _CMP_SWAP[type(node)]()
    elif op == "const":
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        node.value = (not node.value) if isinstance(node.value, bool) else \
            _const_mutation(node.value)
    elif op == "boolop":
        assert isinstance(node, ast.BoolOp)
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif op == "arith":
        assert isinstance(node, (ast.BinOp, ast.AugAssign))
        node.op = _ARITH_SWAP[type(node.op)]()
    elif op == "not":
        assert isinstance(node, ast.UnaryOp)
        replacement = node.operand
    elif op == "cond":
        assert isinstance(node, (ast.If, ast.While))
        node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
    elif op == "stmt":
        replacement = ast.Pass()
    elif op == "reverse" and isinstance(node, ast.For):
        node.iter = ast.Call(func=ast.Name("reversed", ast.Load()), keywords=[], args=[
            ast.Call(func=ast.Name("list", ast.Load()), args=[node.iter], keywords=[])])
    elif op == "reverse":
        assert isinstance(node, ast.Call)
        replacement = node.args[0]
    elif op == "break":
        replacement = ast.Continue()
    elif op == "minmax":
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        node.func = ast.Name("max" if node.func.id == "min" else "min", ast.Load())
    elif op == "return":
        assert isinstance(node, ast.Return) and isinstance(node.value, ast.Constant)
        node.value = ast.Constant(not node.value.value)
    else:
        raise AssertionError(f"unknown operator {op}")
    if replacement is not None:
        if index is None:
            setattr(parent, field, replacement)
        else:
            value[index] = replacement
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


# ------------------------------------------------------------------------------- serving
_PLUGIN_SOURCE = '''"""pytest plugin (-p kvmut_plugin) of the mutant runs: Hypothesis without the
shrink phase (a mutant run needs the verdict, not a minimal example), and no child pytest
collecting the whole suite for the completeness verdict of a partial run (only the exit status
is read).
"""
import sys

from hypothesis import Phase, settings

settings.register_profile("kvmut", phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile("kvmut")


def pytest_sessionstart(session):
    for name, module in list(sys.modules.items()):
        if name.startswith("kvcheck.plugin") and hasattr(module, "inventory_subprocess"):
            module.inventory_subprocess = lambda *args, **kwargs: None
'''

_IMPL_SOURCE = f'''"""--kv-impl={IMPL}: the reference adapter over the mutated copy, no kernels."""
import dataclasses

from {ADAPTER} import *  # noqa: F403
from {ADAPTER} import IMPL_INFO as _INFO

IMPL_INFO = dataclasses.replace(_INFO, name="mutant",
                                capabilities=_INFO.capabilities - {{"kernels"}})
'''


def _rewrite_imports(text: str) -> str:
    """Point ``kvcheck.reference_impl`` imports at the copy, except its error classes."""
    text = text.replace("kvcheck.reference_impl", PACKAGE)
    return text.replace(f"{PACKAGE}.errors", "kvcheck.reference_impl.errors")


def snapshot() -> dict[str, str]:
    """The reference's module sources, the adapter's (under ``ADAPTER``) and the suite's test
    modules (under ``suite/<name>``), read once: a run mutates and tests one consistent
    version even if the checkout changes meanwhile."""
    sources = {p.stem: p.read_text(encoding="utf-8") for p in sorted(REFERENCE_DIR.glob("*.py"))}
    sources[ADAPTER] = ADAPTER_FILE.read_text(encoding="utf-8")
    for path in sorted(SUITE_DIR.glob("test_*.py")):
        if path.name != "test_kernels.py":  # mutants declare no kernels
            sources[f"suite/{path.name}"] = path.read_text(encoding="utf-8")
    return sources


class Workspace:
    """A temporary folder holding the copied package, the adapter copy and the plugin; one
    module at a time is replaced by a mutant's source."""

    def __init__(self, root: Path, sources: dict[str, str]) -> None:
        self.root = root
        self.sources = sources
        self.package = root / PACKAGE
        self.package.mkdir(parents=True)
        self.suite = root / "suite"  # the suite's test modules, as they were at the start
        self.suite.mkdir()
        for name, text in sources.items():
            if name.startswith("suite/"):
                (root / name).write_text(text, encoding="utf-8")
            elif name not in ("errors", ADAPTER):
                self.install(name, None)
        (root / f"{ADAPTER}.py").write_text(_rewrite_imports(sources[ADAPTER]), encoding="utf-8")
        (root / f"{IMPL}.py").write_text(_IMPL_SOURCE, encoding="utf-8")
        (root / f"{PLUGIN}.py").write_text(_PLUGIN_SOURCE, encoding="utf-8")
        self.work = root / "run"  # the pytest cwd: repro traces land here
        self.work.mkdir()

    def install(self, module: str, source: str | None) -> None:
        """Put ``source`` (None: the original) in place of ``module``."""
        text = self.sources[module] if source is None else source
        path = self.package / f"{module}.py"
        path.write_text(_rewrite_imports(text), encoding="utf-8")
        # Mutants of one module may be written within one second, at one size: the .pyc of
        # the last one (stamped with the source's mtime in seconds and its size) could pass for
        # this one's, so it goes. Everything else keeps its bytecode from run to run.
        Path(importlib.util.cache_from_source(str(path))).unlink(missing_ok=True)

    def pytest_command(self, profile: str, args: argparse.Namespace,
                       coverage_file: Path | None = None) -> list[str]:
        runner = [sys.executable]
        if coverage_file is not None:
            runner += ["-m", "coverage", "run", f"--data-file={coverage_file}",
                       f"--source={self.package}"]
        return [*runner, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                "-p", PLUGIN, f"--kv-impl={IMPL}", f"--kv-profile={profile}",
                f"--kv-max-examples={args.max_examples}", f"--kv-timeout={args.call_timeout}",
                str(self.suite)]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), env.get("PYTHONPATH", "")])
        # Bytecode is cached (``install`` drops a replaced module's): about 2 s less per run.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        return env


@dataclasses.dataclass
class Outcome:
    status: str  # killed | survived | timeout | error (the suite refused to load it)
    profile: str | None
    detail: str
    seconds: float


_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)")


def run_mutant(ws: Workspace, mutant: Mutant | None, profiles: Sequence[str],
               args: argparse.Namespace) -> Outcome:
    """Run the suite on ``mutant`` (None: the unmutated copy) under each profile in turn,
    until one run fails."""
    start = time.monotonic()
    if mutant is not None:
        ws.install(mutant.module, apply_mutant(ws.sources[mutant.module], mutant))
    try:
        for profile in profiles:
            try:
                proc = subprocess.run(ws.pytest_command(profile, args), cwd=ws.work,
                                      env=ws.env(), capture_output=True, text=True,
                                      timeout=args.timeout, check=False)
            except subprocess.TimeoutExpired:
                return Outcome("timeout", profile, f"no verdict in {args.timeout:g}s",
                               time.monotonic() - start)
            if proc.returncode == 0:
                continue
            lines = (proc.stdout + proc.stderr).splitlines()
            failed = next((m.group(2) for line in lines if (m := _FAILED.match(line))), None)
            if proc.returncode == 1 and failed:
                return Outcome("killed", profile, failed.rsplit("/", 1)[-1],
                               time.monotonic() - start)
            tail = " | ".join(line.strip() for line in lines[-3:])
            return Outcome("error", profile, f"exit {proc.returncode}: {tail[:200]}",
                           time.monotonic() - start)
        return Outcome("survived", None, "", time.monotonic() - start)
    finally:
        if mutant is not None:
            ws.install(mutant.module, None)


Coverage = dict[str, dict[str, set[int]]]  # profile -> module -> executed lines


def covered_lines(ws: Workspace, args: argparse.Namespace) -> Coverage | None:
    """Per profile, the lines of each module the suite executes on the implementation side
    (the copy, not the oracle); None when coverage.py is not installed. Also the control run:
    exits if the unmutated copy fails the suite."""
    try:
        import coverage
    except ImportError:
        return None
    out: Coverage = {}
    for profile in args.profiles:
        data_file = ws.root / f".coverage-{profile}"
        proc = subprocess.run(ws.pytest_command(profile, args, data_file), cwd=ws.work,
                              env=ws.env(), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"mutate.py: the unmutated copy fails the suite under {profile}:"
                             "\n" + (proc.stdout + proc.stderr)[-3000:])
        data = coverage.CoverageData(basename=str(data_file))
        data.read()
        out[profile] = {Path(f).stem: set(data.lines(f) or ()) for f in data.measured_files()}
    return out


def profiles_reaching(mutant: Mutant, cov: Coverage | None, profiles: Sequence[str],
                      ) -> list[str]:
    """The profiles whose suite run executes the mutated statement (all without coverage):
    in the others the mutant cannot change behaviour."""
    if cov is None:
        return list(profiles)
    return [p for p in profiles if mutant.stmt_line in cov[p].get(mutant.module, ())]


# ------------------------------------------------------------------------------- equivalents
_KEY_CELL = re.compile(r"^\|\s*`([^`]+)`\s*\|")


@dataclasses.dataclass(frozen=True)
class Equivalent:
    """One row of the "Equivalent mutants" table: the change it was written for (the
    ``change`` cell, backticks and ``\\|`` escapes removed) and why it is equivalent."""

    change: str
    reason: str


def documented_equivalents(path: Path = DOC) -> dict[str, Equivalent]:
    """``key -> Equivalent`` from the "Equivalent mutants" table of docs/mutation.md. A key
    may be a glob (``invariants:check_invariants:stmt:*``) where one reason covers a family."""
    if not path.exists():
        return {}
    out: dict[str, Equivalent] = {}
    section = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):  # a heading: is it the table's section?
            section = line.lstrip("#").strip().lower().startswith("equivalent mutants")
            continue
        match = _KEY_CELL.match(line)
        if section and match:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            out[match.group(1)] = Equivalent(_plain(cells[1]) if len(cells) > 2 else "",
                                             cells[-1] if len(cells) > 1 else "")
    return out


def _plain(change: str) -> str:
    """A change as text: backticks and table escapes dropped, whitespace collapsed, a
    trailing ``...`` (the script truncates long source lines) removed."""
    text = " ".join(change.replace("`", "").replace("\\|", "|").split())
    return text.removesuffix("...")


def same_change(row: Equivalent, mutant: Mutant) -> bool:
    """Whether ``row`` was written for ``mutant``'s change. Keys number the mutation points
    of one function in source order, so an edit above a point gives its key to another
    change: a row whose change is not the mutant's (one a prefix of the other, as both may
    be truncated) no longer explains it."""
    doc, now = row.change, _plain(mutant.change)
    return bool(doc) and (doc.startswith(now) or now.startswith(doc))


def equivalent_reason(mutant: Mutant, equivalents: dict[str, Equivalent]) -> str | None:
    """The documented reason ``mutant`` is equivalent, or None (also when its key's row was
    written for another change: ``stale_row``)."""
    row = equivalents.get(mutant.key)
    if row is not None:
        return row.reason if same_change(row, mutant) else None
    return next((row.reason for pattern, row in equivalents.items()
                 if "*" in pattern and fnmatch.fnmatchcase(mutant.key, pattern)), None)


def stale_row(mutant: Mutant, equivalents: dict[str, Equivalent]) -> Equivalent | None:
    """The row listed under ``mutant``'s key for another change, or None."""
    row = equivalents.get(mutant.key)
    return row if row is not None and not same_change(row, mutant) else None


# ------------------------------------------------------------------------------- main
def select(args: argparse.Namespace, sources: dict[str, str]) -> list[Mutant]:
    """The mutants ``--modules`` / ``--operators`` / ``--only`` / ``--sample`` / ``--limit``
    ask for, in module and source order."""
    modules = sorted(m for m in sources
                     if m not in SKIP_MODULES and m != ADAPTER and not m.startswith("suite/"))
    if args.modules:
        wanted = [m.strip().removesuffix(".py") for m in args.modules.split(",") if m.strip()]
        unknown = sorted(set(wanted) - set(modules))
        if unknown:
            raise SystemExit(f"mutate.py: unknown module(s) {unknown}; known: {modules}")
        modules = [m for m in modules if m in wanted]
    else:
        modules = [m for m in modules if m not in NOT_BY_DEFAULT]
    operators = frozenset(args.operators.split(",")) if args.operators else frozenset(OPERATORS)
    bad = sorted(operators - set(OPERATORS))
    if bad:
        raise SystemExit(f"mutate.py: unknown operator(s) {bad}; known: {list(OPERATORS)}")
    mutants = [m for module in modules for m in find_mutants(module, sources[module], operators)]
    if args.only:
        keys = set(args.only)
        mutants = [m for m in mutants if m.key in keys]
        unknown = sorted(keys - {m.key for m in mutants})
        if unknown:
            raise SystemExit(f"mutate.py: no mutant has the key(s) {unknown} (see --list)")
    if args.sample is not None:
        rng = random.Random(args.seed)
        chosen = set(rng.sample(range(len(mutants)), min(args.sample, len(mutants))))
        mutants = [m for i, m in enumerate(mutants) if i in chosen]
    if args.limit is not None:
        mutants = mutants[: args.limit]
    return mutants


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


def summarize(results: list[tuple[Mutant, Outcome]], not_covered: list[Mutant],
              equivalents: dict[str, Equivalent]) -> tuple[list[str], int]:
    """(report lines, number of unexplained survivors)."""
    per: dict[str, Counter[str]] = defaultdict(Counter)
    for mutant, outcome in results:
        status = outcome.status
        if status == "survived" and equivalent_reason(mutant, equivalents) is not None:
            status = "equivalent"
        per[mutant.module][status] += 1
        per[mutant.module]["total"] += 1
    for mutant in not_covered:
        per[mutant.module]["not covered"] += 1
    rows = [["module", "mutants", "killed", "equivalent", "survived", "score", "not covered"]]
    total: Counter[str] = Counter()
    for module in sorted(per):
        c = per[module]
        total.update(c)
        rows.append(_score_row(module, c))
    rows.append(_score_row("total", total))
    lines = _table(rows)
    unexplained = [(m, o) for m, o in results
                   if o.status == "survived" and equivalent_reason(m, equivalents) is None]
    if unexplained:
        lines += ["", "survivors not listed as equivalent in docs/mutation.md:"]
        for m, _ in unexplained:
            lines.append(f"  {m.key}  line {m.line}: {m.change}")
            row = stale_row(m, equivalents)
            if row is not None:
                lines.append(f"    (the table's row for this key was written for another change, "
                             f"{row.change!r}: update or move it)")
    return lines, len(unexplained)


def _score_row(name: str, c: Counter[str]) -> list[str]:
    killed = c["killed"] + c["timeout"] + c["error"]
    scored = c["total"] - c["equivalent"]
    score = f"{100 * killed / scored:.1f}%" if scored else "-"
    return [name, str(c["total"]), str(killed), str(c["equivalent"]), str(c["survived"]),
            score, str(c["not covered"])]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modules", help="comma list of reference_impl modules (default: all "
                                          f"but {', '.join(sorted(NOT_BY_DEFAULT))})")
    parser.add_argument("--operators", help=f"comma list of {','.join(OPERATORS)}")
    parser.add_argument("--only", action="append", metavar="KEY", help="run this mutant key")
    parser.add_argument("--limit", type=int, help="run the first N selected mutants only")
    parser.add_argument("--sample", type=int, help="a random sample of N mutants")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0)")
    parser.add_argument("--profiles", default=",".join(PROFILES),
                        help="profiles run in turn until one fails (default: both)")
    parser.add_argument("--max-examples", type=int, default=20,
                        help="--kv-max-examples of each suite run (default 20)")
    parser.add_argument("--call-timeout", type=float, default=10,
                        help="--kv-timeout: seconds per adapter call (default 10)")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds per suite run before the mutant counts as killed by "
                             "timeout (default 300)")
    parser.add_argument("--jobs", type=int, default=1, help="suite runs in parallel (default 1)")
    parser.add_argument("--no-coverage", action="store_true",
                        help="run mutants on lines the suite never executes too")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--results", type=Path,
                        help="append each outcome to this JSON Lines file as it comes")
    parser.add_argument("--resume", action="store_true",
                        help="with --results: skip the mutants that file already has")
    args = parser.parse_args(argv)
    args.profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]

    sources = snapshot()
    mutants = select(args, sources)
    if args.list:
        for m in mutants:
            print(f"{m.key:60} line {m.line:4}  {m.change}")
        print(f"{len(mutants)} mutants")
        return 0
    equivalents = documented_equivalents()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvmut-") as tmp:
        workspaces = [Workspace(Path(tmp) / f"job{i}", sources) for i in range(max(1, args.jobs))]
        cov = None if args.no_coverage else covered_lines(workspaces[0], args)
        if cov is None:
            control = run_mutant(workspaces[0], None, args.profiles, args)
            if control.status != "survived":
                raise SystemExit(f"mutate.py: the unmutated copy fails the suite: {control}")
        plan = [(m, profiles_reaching(m, cov, args.profiles)) for m in mutants]
        not_covered = [m for m, profiles in plan if not profiles]
        plan = [(m, profiles) for m, profiles in plan if profiles]
        previous = _previous_results(args, {m.key: m for m, _ in plan})
        plan = [(m, profiles) for m, profiles in plan if m.key not in previous]
        print(f"control passed in {time.monotonic() - started:.0f}s; {len(plan)} mutants to "
              f"run ({len(previous)} done before), {len(not_covered)} on lines the suite "
              "never executes", flush=True)
        results = list(previous.values()) + _run_all(plan, workspaces, equivalents, args)
    report, unexplained = summarize(results, not_covered, equivalents)
    print()
    print("\n".join(report))
    print(f"\n{len(results) - len(previous)} mutants run in {time.monotonic() - started:.0f}s")
    return 1 if unexplained else 0


def _previous_results(args: argparse.Namespace, planned: dict[str, Mutant],
                      ) -> dict[str, tuple[Mutant, Outcome]]:
    """With ``--resume``, the outcomes ``--results`` already holds for planned mutants."""
    if not (args.resume and args.results and args.results.exists()):
        return {}
    out: dict[str, tuple[Mutant, Outcome]] = {}
    for line in args.results.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        mutant = planned.get(record["key"])
        if mutant is not None and record["change"] == mutant.change:  # the same mutant
            out[mutant.key] = (mutant, Outcome(record["status"], record["profile"],
                                               record["detail"], record["seconds"]))
    return out


def _run_all(plan: list[tuple[Mutant, list[str]]], workspaces: list[Workspace],
             equivalents: dict[str, Equivalent], args: argparse.Namespace,
             ) -> list[tuple[Mutant, Outcome]]:
    """Run every planned mutant, one workspace per job; prints one line per mutant."""
    free: queue.Queue[Workspace] = queue.Queue()
    for ws in workspaces:
        free.put(ws)
    done: list[tuple[Mutant, Outcome]] = []
    lock = threading.Lock()

    def one(item: tuple[Mutant, list[str]]) -> None:
        mutant, profiles = item
        ws = free.get()
        try:
            outcome = run_mutant(ws, mutant, profiles, args)
        finally:
            free.put(ws)
        label = outcome.status
        if label == "survived" and equivalent_reason(mutant, equivalents) is not None:
            label = "equivalent"
        where = f" [{outcome.profile}] {outcome.detail}" if outcome.profile else ""
        with lock:
            done.append((mutant, outcome))
            if args.results:
                with args.results.open("a", encoding="utf-8") as out:
                    out.write(json.dumps({"key": mutant.key, "line": mutant.line,
                                          "change": mutant.change,
                                          **dataclasses.asdict(outcome)}) + "\n")
            print(f"[{len(done)}/{len(plan)}] {label:10} {outcome.seconds:5.1f}s {mutant.key} "
                  f"(line {mutant.line}: {mutant.change}){where}", flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(workspaces)) as pool:
        list(pool.map(one, plan))
    order = {m.key: i for i, (m, _) in enumerate(plan)}
    return sorted(done, key=lambda r: order[r[0].key])


if __name__ == "__main__":
    sys.exit(main())
