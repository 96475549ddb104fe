"""kvcheck's subpackages depend on each other one way only (no import cycles).

Every ``import`` in every module is read with ``ast``, at any depth (an import inside a
function counts: a lazy import is still a dependency), and each dependency between two
subpackages must be one the layering allows:

    kvcheck (core: errors, atomic)   <- everything
    reference_impl                   a leaf: the reference depends on nothing else
    gpu_kernels                      may use reference_impl
    results                          takes what it needs as arguments: core only
    conformance                      uses reference_impl and gpu_kernels
    adapters                         third-party managers behind the protocol
    plugin, bench                    on top; bench may use plugin's hook specs and the
                                     adapters (to time the reference and vLLM directly), not
                                     the reverse

A subpackage also may not reach the next layer up through a lazy import; a test importing
the modules would not see that, which is why this reads the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Folder of each subpackage (pyproject.toml's package-dir); "kvcheck" is the core.
FOLDERS = {"kvcheck": "kvcheck", "reference_impl": "reference_impl",
           "gpu_kernels": "gpu_kernels", "results": "results", "conformance": "conformance",
           "adapters": "adapters", "plugin": "plugin", "bench": "bench"}
_BASE = {"kvcheck"}
ALLOWED: dict[str, set[str]] = {
    "kvcheck": set(),
    "reference_impl": _BASE,
    "gpu_kernels": _BASE | {"reference_impl"},
    "results": _BASE,
    "conformance": _BASE | {"reference_impl", "gpu_kernels"},
    "adapters": _BASE | {"reference_impl", "gpu_kernels", "conformance"},
    "plugin": _BASE | {"reference_impl", "gpu_kernels", "conformance", "results"},
    "bench": _BASE | {"reference_impl", "gpu_kernels", "conformance", "results", "plugin",
                      "adapters"},
}


def imported_subpackages(source: str) -> dict[str, int]:
    """kvcheck subpackage -> first line importing it, for every import in ``source``
    (``kvcheck.errors`` and the other core modules count as ``kvcheck``)."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "kvcheck":  # from kvcheck import conformance
                names = [f"kvcheck.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] != "kvcheck":
                continue
            sub = parts[1] if len(parts) > 1 and parts[1] in FOLDERS else "kvcheck"
            found.setdefault(sub, node.lineno)
    return found


def dependency_graph() -> dict[str, dict[str, str]]:
    """subpackage -> {subpackage it imports: 'file:line' of the first such import}."""
    graph: dict[str, dict[str, str]] = {}
    for sub, folder in FOLDERS.items():
        edges = graph.setdefault(sub, {})
        for path in sorted((ROOT / folder).glob("*.py")):
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
