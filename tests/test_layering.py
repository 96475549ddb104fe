"""kvcheck's subpackages depend on each other one way only (no import cycles).

Every ``import`` in every module is read with ``ast``, at any depth (an import inside a
function counts: a lazy import is still a dependency), and each dependency between two
subpackages must be one the layering allows:

    kvcheck (core: errors, atomic)   <- everything
    reference_impl                   a leaf: the reference depends on nothing else
    gpu_kernels                      may use reference_impl
    results                          takes what it needs as arguments: core only
    events                           the KV-event wire format: the reference's events only
    conformance                      uses reference_impl, gpu_kernels and events (the
                                     events_wire area decodes an implementation's bytes)
    wire                             implementations in other processes (exec:): the
                                     protocol's types and the loader, nothing above
    adapters                         third-party managers behind the protocol (the
                                     reference's event_wire encodes with events)
    plugin, bench                    on top (plugin's `kvcheck events` uses events, and
                                     bench's event_codec times it); bench
                                     may use plugin's hook specs and the
                                     adapters (to time the reference and vLLM directly), not
                                     the reverse

A subpackage also may not reach the next layer up through a lazy import; a test importing
the modules would not see that, which is why this reads the source.

Inside a subpackage, files import each other one way only too: no cycle between two modules
of one folder, whether the import runs at load time, inside a function (lazy), under
``TYPE_CHECKING`` (type-only) or through ``importlib.import_module`` with a literal name. A
cycle that only a lazy or type-only import closes still means two files that cannot be read,
tested or replaced one without the other; the cure is a lower module both import.
"""

from __future__ import annotations

import ast
import functools
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Folder of each subpackage (pyproject.toml's package-dir); "kvcheck" is the core.
FOLDERS = {"kvcheck": "kvcheck", "reference_impl": "reference_impl",
           "gpu_kernels": "gpu_kernels", "results": "results", "conformance": "conformance",
           "adapters": "adapters", "plugin": "plugin", "bench": "bench", "events": "events",
           "wire": "wire"}
_BASE = {"kvcheck"}
ALLOWED: dict[str, set[str]] = {
    "kvcheck": set(),
    "reference_impl": _BASE,
    "gpu_kernels": _BASE | {"reference_impl"},
    "results": _BASE,
    "events": _BASE | {"reference_impl"},
    "conformance": _BASE | {"reference_impl", "gpu_kernels", "events"},
    "adapters": _BASE | {"reference_impl", "gpu_kernels", "conformance", "events"},
    "plugin": _BASE | {"reference_impl", "gpu_kernels", "conformance", "results", "events"},
    "bench": _BASE | {"reference_impl", "gpu_kernels", "conformance", "results", "plugin",
                      "adapters", "events"},
    # The process wire (docs/wire-protocol.md): the protocol's types and the loader, for the
    # client and for serving any implementation; the loader reaches the client by name (as
    # it reaches adapters by their aliases), plugin and bench drive exec: targets by value.
    "wire": _BASE | {"conformance"},
}


def _import_module_target(node: ast.Call) -> str | None:
    """The module an ``importlib.import_module(...)`` / ``__import__(...)`` call names: the
    literal, or the constant head of an f-string (``f"kvcheck.gpu_kernels.{name}"`` is at
    least a dependency on ``kvcheck.gpu_kernels``); None for any other call."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in {"import_module", "__import__"} or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        head = arg.values[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            return head.value.rstrip(".") or None
    return None


def imported_modules(source: str) -> dict[str, int]:
    """Dotted kvcheck name -> first line importing it, for every import in ``source``: plain
    and ``from`` imports at any depth, and ``importlib.import_module`` / ``__import__`` calls.
    ``from kvcheck.a import b`` yields ``kvcheck.a`` and ``kvcheck.a.b`` (``b`` may be a
    module); the caller keeps the names that are modules."""
    return dict(_imported_modules(source))


@functools.cache
def _imported_modules(source: str) -> tuple[tuple[str, int], ...]:
    """``imported_modules``, parsed once per source text: each parametrized test below reads
    the whole tree again, and parsing it was 2.5 s a test."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and (target := _import_module_target(node)):
            names = [target]
        for name in names:
            if name.split(".")[0] == "kvcheck":
                found.setdefault(name, node.lineno)
    return tuple(found.items())


def imported_subpackages(source: str) -> dict[str, int]:
    """kvcheck subpackage -> first line importing it, for every import in ``source``
    (``kvcheck.errors`` and the other core modules count as ``kvcheck``)."""
    found: dict[str, int] = {}
    for name, line in imported_modules(source).items():
        parts = name.split(".")
        sub = parts[1] if len(parts) > 1 and parts[1] in FOLDERS else "kvcheck"
        if found.get(sub, line) >= line:
            found[sub] = line
    return found


def module_graph(sub: str) -> dict[str, dict[str, str]]:
    """Module of subpackage ``sub`` -> {module of ``sub`` it imports: 'file:line'}, modules
    named relative to ``sub`` (``replay.scheduler``; a package's ``__init__`` as
    ``replay.__init__``, the top one as ``__init__``). A package ``__init__`` is a node like
    the others, imported by ``from kvcheck.x import name`` when ``name`` is not one of its
    modules (importing a module also runs ``__init__``, but only a name defined there ties the
    importer to it)."""
    folder = ROOT / FOLDERS[sub]
    prefix = "kvcheck" if sub == "kvcheck" else f"kvcheck.{sub}"
    files = {".".join(path.relative_to(folder).with_suffix("").parts): path
             for path in sorted(folder.rglob("*.py"))}
    graph: dict[str, dict[str, str]] = {}
    for stem, path in files.items():
        edges = graph.setdefault(stem, {})
        for name, line in imported_modules(path.read_text(encoding="utf-8")).items():
            if not name.startswith(prefix + "."):
                continue  # another subpackage, or the package itself (``import kvcheck.x``)
            dep = name[len(prefix) + 1:]
            if f"{dep}.__init__" in files:
                continue  # a package named in ``from kvcheck.x.pkg import module``
            if dep not in files:  # ``from kvcheck.x[.pkg] import name``: a name __init__ defines
                parent = dep.rpartition(".")[0]
                dep = f"{parent}.__init__" if parent else "__init__"
                if dep not in files:
                    continue  # ``from kvcheck.x.module import name``: the module's own name
            if dep != stem:
                edges.setdefault(dep, f"{path.relative_to(ROOT)}:{line}")
    return graph


def dependency_graph() -> dict[str, dict[str, str]]:
    """subpackage -> {subpackage it imports: 'file:line' of the first such import}."""
    graph: dict[str, dict[str, str]] = {}
    for sub, folder in FOLDERS.items():
        edges = graph.setdefault(sub, {})
        for path in sorted((ROOT / folder).rglob("*.py")):
            for dep, line in imported_subpackages(path.read_text(encoding="utf-8")).items():
                if dep != sub:
                    edges.setdefault(dep, f"{path.relative_to(ROOT)}:{line}")
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str]:
    """One dependency cycle as [a, b, ..., a], or [] if the graph has none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_the_reader_sees_every_kind_of_import() -> None:
    source = ("import kvcheck.results.io\nfrom kvcheck.plugin.loader import x\n"
              "from kvcheck import conformance, errors\nimport os\n"
              "def f():\n    from kvcheck.gpu_kernels import cases\n")
    assert imported_subpackages(source) == {"results": 1, "plugin": 2, "conformance": 3,
                                            "kvcheck": 3, "gpu_kernels": 6}


def test_the_reader_sees_lazy_type_only_and_importlib_imports() -> None:
    source = ("import importlib\nfrom typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from kvcheck.conformance.driver import Driver\n"
              "def f():\n    return importlib.import_module('kvcheck.bench.measure.paired')\n"
              "def g(name):\n    return importlib.import_module(f'kvcheck.gpu_kernels.{name}')\n"
              "def h():\n    return __import__('kvcheck.results.io')\n"
              "importlib.import_module('vllm.v1.core')\n")
    assert imported_modules(source) == {
        "kvcheck.conformance.driver": 4, "kvcheck.conformance.driver.Driver": 4,
        "kvcheck.bench.measure.paired": 6, "kvcheck.gpu_kernels": 8, "kvcheck.results.io": 10}
    assert imported_subpackages(source) == {"conformance": 4, "bench": 6, "gpu_kernels": 8,
                                            "results": 10}


def test_the_module_graph_names_the_importing_line(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "results"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from kvcheck.results import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from kvcheck.results.a import f\n")
    (pkg / "c.py").write_text("from kvcheck.results import name_in_init, a\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    graph = module_graph("results")
    assert graph == {"__init__": {}, "a": {"b": "results/a.py:2"},
                     "b": {"a": "results/b.py:3"},
                     "c": {"__init__": "results/c.py:1", "a": "results/c.py:1"}}
    assert find_cycle(graph) == ["a", "b", "a"]


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": ""}, "b": {}, "c": {"a": ""}}) == []


@pytest.mark.parametrize("sub", sorted(FOLDERS))
def test_dependencies_point_one_way(sub: str) -> None:
    edges = dependency_graph()[sub]
    wrong = {dep: where for dep, where in edges.items() if dep not in ALLOWED[sub]}
    assert wrong == {}, (
        f"kvcheck.{sub} may import only {sorted(ALLOWED[sub])}; it imports "
        + ", ".join(f"kvcheck.{d} ({w})" for d, w in sorted(wrong.items())))


def test_no_import_cycle_between_subpackages() -> None:
    assert find_cycle(dependency_graph()) == []


def test_the_allowed_layering_itself_has_no_cycle() -> None:
    assert find_cycle({k: dict.fromkeys(v, "") for k, v in ALLOWED.items()}) == []


@pytest.mark.parametrize("sub", sorted(FOLDERS))
def test_no_import_cycle_between_files_of_a_subpackage(sub: str) -> None:
    graph = module_graph(sub)
    cycle = find_cycle(graph)
    assert cycle == [], (
        f"kvcheck.{sub} has an import cycle between its files: "
        + " -> ".join(f"{a} ({graph[a][b]})" for a, b in itertools.pairwise(cycle))
        + f" -> {cycle[-1]}; lazy and type-only imports count: move what both need into a "
        "lower module")


def test_every_subpackage_is_layered() -> None:
    """A subpackage added to pyproject.toml's package-dir must be given its place here: one
    left out would have its imports read by nobody."""
    import tomllib

    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]
    mapped = {name.removeprefix("kvcheck.") if name != "kvcheck" else "kvcheck": folder
              for name, folder in package_dir.items()}
    assert mapped == FOLDERS


def private_imports(source: str, is_module: Callable[[str, str], bool]
                    ) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` of each private name (``_x``, not a dunder) a module imports
    from another kvcheck module. Package-private modules are not counted: imported from their
    package (``from kvcheck.gpu_kernels import _host``: ``is_module(package, name)``) or
    imported from (``from kvcheck.gpu_kernels._attention_core import ...``), they exist to be
    shared inside their package. What a private name means is that no other file relies on
    it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ImportFrom) and node.module
                and node.module.startswith("kvcheck")):
            continue
        if node.module.rpartition(".")[2].startswith("_"):
            continue
        found += [(node.lineno, node.module, alias.name) for alias in node.names
                  if alias.name.startswith("_") and not alias.name.startswith("__")
                  and not is_module(node.module, alias.name)]
    return found


def _is_module(package: str, name: str) -> bool:
    """Whether ``package.name`` is a module file of kvcheck (``kvcheck.gpu_kernels._host``)."""
    sub = package.removeprefix("kvcheck.") if package != "kvcheck" else "kvcheck"
    return sub in FOLDERS and (ROOT / FOLDERS[sub] / f"{name}.py").is_file()


def test_the_private_import_reader() -> None:
    source = ("from kvcheck.a import _secret, public\nfrom kvcheck import __version__\n"
              "from kvcheck.gpu_kernels._core import _tile\nfrom kvcheck.gpu_kernels import _host\n"
              "def f():\n    from kvcheck.b.c import _lazy\n")
    found = private_imports(source, lambda package, name: name == "_host")
    assert found == [(1, "kvcheck.a", "_secret"), (6, "kvcheck.b.c", "_lazy")]
    assert _is_module("kvcheck.gpu_kernels", "_host")
    assert not _is_module("kvcheck.reference_impl", "_as_block_table")


@pytest.mark.parametrize("sub", sorted(FOLDERS))
def test_no_module_imports_another_modules_private_names(sub: str) -> None:
    """A private name stays in its file (``hybrid_scheduler`` imported ``_Scheduler``,
    ``event_codec`` ``_vllm_event``, the batch tables ``block_table``'s checks): a name two
    files share is public, with a docstring and a place in ``__all__``."""
    found = [f"{path.name}:{line}: from {module} import {name}"
             for path in sorted((ROOT / FOLDERS[sub]).rglob("*.py"))
             for line, module, name in private_imports(path.read_text(encoding="utf-8"),
                                                       _is_module)]
    assert not found, "\n".join(found)
