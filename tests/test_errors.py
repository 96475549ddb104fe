"""kvcheck's errors: one family (``kvcheck.errors``), one ``errors`` module per layer.

Read from the source with ``ast`` (every module of every subpackage, the suite's own test
files included, vLLM's adapters too, which cannot be imported here):

* every exception class kvcheck defines lives in its layer's ``errors.py``, except private
  control-flow signals (``_Shutdown``...) that the defining module itself catches;
* every class in an ``errors`` module derives from ``KVCheckError`` (one documented
  exception: ``EngineError`` stands for an engine's own exception);
* kvcheck's own checks never raise a bare ``ValueError`` / ``AssertionError`` /
  ``TypeError`` / ``RuntimeError`` / ``Exception``: input errors are ``KVCheckInputError``s
  (still ``ValueError``s), failures ``KVCheckFailure``s (still ``AssertionError``s). The few
  that stay are listed below, each with why;
* each class is still importable from the module that raised it before the move.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
from pathlib import Path

import pytest

from kvcheck.errors import KVCheckError

ROOT = Path(__file__).resolve().parents[1]
#: pyproject.toml's package-dir: folder -> import package.
PACKAGES = {"kvcheck": "kvcheck", "reference_impl": "kvcheck.reference_impl",
            "gpu_kernels": "kvcheck.gpu_kernels", "results": "kvcheck.results",
            "conformance": "kvcheck.conformance", "adapters": "kvcheck.adapters",
            "plugin": "kvcheck.plugin", "bench": "kvcheck.bench", "events": "kvcheck.events",
            "wire": "kvcheck.wire"}
_BARE = {"ValueError", "AssertionError", "TypeError", "RuntimeError", "Exception"}
#: (file, start of the message) -> why a builtin exception is right there.
ALLOWED_BARE: dict[tuple[str, str], str] = {
    ("reference_impl/free_block_queue.py", "unreachable"):
        "an internal invariant of kvcheck itself (a kvcheck bug), not a check",
    ("gpu_kernels/cases.py", "one form allocates"):
        "an internal invariant of kvcheck itself (a kvcheck bug), not a check",
    ("bench/workload/scenarios.py", "unreachable"):
        "an internal invariant of kvcheck itself (a kvcheck bug), not a check",
    ("wire/methods.py", "{self.name}() takes"):
        "a wire method proxy called with the wrong arguments raises what a Python call does",
    ("wire/methods.py", "{self.name}() got an unexpected"):
        "a wire method proxy called with the wrong arguments raises what a Python call does",
    ("wire/methods.py", "{self.name}() missing argument"):
        "a wire method proxy called with the wrong arguments raises what a Python call does",
}
#: Classes of an errors module that are deliberately not KVCheckErrors.
NOT_KVCHECK_ERRORS = {"EngineError": "the engine's own exception (error code internal), "
                                     "treated as an in-process adapter's exception"}
#: Where each moved class was defined before (and is still importable from).
FORMER_HOMES = {
    "kvcheck.reference_impl.kv_indexer": ["IndexerInputError"],
    "kvcheck.reference_impl.invariants": ["InvariantViolation"],
    "kvcheck.conformance.protocol": ["UnsupportedSpec"],
    "kvcheck.conformance.loader": ["ImplLoadError"],
    "kvcheck.conformance.trace_check": ["TraceError"],
    "kvcheck.conformance.recorded": ["CorpusError"],
    "kvcheck.conformance.pinning": ["PinningMisuse"],
    "kvcheck.conformance.guard": ["ProtocolViolation"],
    "kvcheck.conformance.spec_seal": ["SpecMutated"],
    "kvcheck.conformance.sizing_answers": ["SizingAnswerError"],
    "kvcheck.conformance.call_limit": ["AdapterTimeout"],
    "kvcheck.conformance.interrupts": ["AdapterRaised"],
    "kvcheck.conformance.memory_limit": ["MemoryLimitExceeded"],
    "kvcheck.conformance.differential": ["ConformanceMismatch"],
    "kvcheck.conformance.hybrid_replay": ["GoldenMismatch"],
    "kvcheck.conformance.indexer_driver": ["IndexerMismatch"],
    "kvcheck.conformance.offload_model": ["OffloadLawBroken"],
    "kvcheck.conformance.offload_driver": ["OffloadMismatch"],
    "kvcheck.bench.workload.trace_file": ["TraceFileError"],
    "kvcheck.bench.counted": ["CountingUnavailable"],
    "kvcheck.bench.kernels.providers": ["ProviderUnavailable"],
    "kvcheck.results.schema": ["RecordError"],
    "kvcheck.results.io": ["OutputPathError"],
    "kvcheck.results.gate": ["GateInputError"],
    "kvcheck.results.gate_kinds": ["KindMismatchError"],
    "kvcheck.events.crosscheck": ["NoVLLMError"],
    "kvcheck.plugin.scaffold": ["ScaffoldError"],
    "kvcheck.wire.values": ["WireValueError"],
    "kvcheck.wire.client": ["EngineError"],
    "kvcheck.wire.engine": ["EngineProcessError"],
    "kvcheck.lock": ["OutputBusyError"],
}


def _source_files() -> list[Path]:
    return [path for folder in PACKAGES for path in sorted((ROOT / folder).rglob("*.py"))]


@functools.cache
def sources() -> dict[str, ast.Module]:
    """kvcheck's modules, parsed: once per process, and only where a test here runs (at
    import, each xdist worker's collection paid 1.8 s for it)."""
    return {str(path.relative_to(ROOT)): ast.parse(path.read_text(encoding="utf-8"))
            for path in _source_files()}


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def exception_classes(sources: dict[str, ast.Module]) -> dict[str, list[str]]:
    """file -> names of the exception classes it defines (a class whose base is a builtin
    exception or another such class, by name, to a fixed point)."""
    known = {n for n, v in vars(builtins).items()
             if isinstance(v, type) and issubclass(v, BaseException)}
    found: dict[str, list[str]] = {}
    classes = [(file, node) for file, tree in sources.items() for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef)]
    changed = True
    while changed:
        changed = False
        for file, node in classes:
            if node.name not in found.get(file, []) and any(
                    _base_name(b) in known for b in node.bases):
                found.setdefault(file, []).append(node.name)
                known.add(node.name)
                changed = True
    return found


def _caught_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            kinds = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            names.update(_base_name(k) for k in kinds)
    return names


def bare_raises(sources: dict[str, ast.Module]) -> list[tuple[str, int, str, str]]:
    """``(file, line, exception, start of the message)`` of each ``raise`` of a builtin
    exception in ``_BARE``."""
    out = []
    for file, tree in sources.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            exc = node.exc
            func = exc.func if isinstance(exc, ast.Call) else exc
            name = _base_name(func)
            if name not in _BARE:
                continue
            message = ""
            if isinstance(exc, ast.Call) and exc.args:
                first = exc.args[0]
                if isinstance(first, ast.JoinedStr):
                    message = ast.unparse(first)[2:-1]
                elif isinstance(first, ast.Constant):
                    message = str(first.value)
            out.append((file, node.lineno, name, message))
    return out


def test_the_scan_sees_every_kind_of_definition() -> None:
    """The scanner itself: an exception two levels down from a builtin, one from a kvcheck
    class by attribute, a private signal caught and one not, and bare raises of each form."""
    src = {
        "pkg/errors.py": ast.parse("class A(ValueError): ...\nclass B(A): ...\n"),
        "pkg/mod.py": ast.parse(
            "import errors\nclass C(errors.B): ...\nclass _Signal(Exception): ...\n"
            "class NotAnError: ...\n"
            "def f():\n    try:\n        raise _Signal\n    except _Signal:\n        pass\n"
            "    raise ValueError(f'bad {x}')\n"
            "def g():\n    raise AssertionError\n"),
    }
    assert exception_classes(src) == {"pkg/errors.py": ["A", "B"],
                                      "pkg/mod.py": ["C", "_Signal"]}
    assert _caught_names(src["pkg/mod.py"]) == {"_Signal"}
    assert [(n, m) for _, _, n, m in bare_raises(src)] == [("ValueError", "bad {x}"),
                                                          ("AssertionError", "")]


def test_every_exception_class_is_in_its_layers_errors_module() -> None:
    misplaced = []
    for file, names in all_classes().items():
        if file.endswith("/errors.py"):
            continue
        caught = _caught_names(sources()[file])
        misplaced += [f"{file}: {name}" for name in names
                      if not (name.startswith("_") and name in caught)]
    assert not misplaced, (
        "exception classes outside their layer's errors.py (move each there and import it "
        "back; a private control-flow signal must be caught in its own module):\n  "
        + "\n  ".join(misplaced))


def test_no_bare_builtin_exception_where_a_kvcheck_error_exists() -> None:
    found = bare_raises(sources())
    unexplained = [f"{file}:{line}: raise {name}({message[:50]!r}...)"
                   for file, line, name, message in found
                   if not any(file == f and message.startswith(m) for f, m in ALLOWED_BARE)]
    assert not unexplained, (
        "raise KVCheckInputError (bad input) or KVCheckFailure (a broken rule), or the layer's "
        "subclass from its errors module, instead of:\n  " + "\n  ".join(unexplained))
    # Every exemption still matches a raise (a stale one would hide a new bare raise).
    stale = [key for key in ALLOWED_BARE
             if not any(f == key[0] and m.startswith(key[1]) for f, _, _, m in found)]
    assert not stale, f"ALLOWED_BARE entries that match no raise any more: {stale}"


_ERRORS_MODULES = sorted(str(path.relative_to(ROOT)) for path in _source_files()
                         if path.name.endswith("errors.py"))


@functools.cache
def all_classes() -> dict[str, list[str]]:
    return exception_classes(sources())


@pytest.mark.parametrize("file", _ERRORS_MODULES)
def test_errors_modules_hold_kvcheck_errors(file: str) -> None:
    folder = file.split("/", 1)[0]
    module = importlib.import_module(
        "kvcheck.errors" if folder == "kvcheck" else f"{PACKAGES[folder]}.errors")
    assert sorted(module.__all__) == sorted(all_classes()[file]), (
        f"{file}: __all__ must list exactly the classes it defines")
    for name in module.__all__:
        cls = getattr(module, name)
        if name in NOT_KVCHECK_ERRORS:
            assert not issubclass(cls, KVCheckError)
        else:
            assert issubclass(cls, KVCheckError), f"{file}: {name} is not a KVCheckError"


@pytest.mark.parametrize(("former", "names"), sorted(FORMER_HOMES.items()))
def test_moved_classes_are_importable_where_they_were(former: str, names: list[str]) -> None:
    module = importlib.import_module(former)
    for name in names:
        cls = getattr(module, name)
        home = importlib.import_module(cls.__module__)
        assert cls.__module__.endswith("errors"), f"{former}.{name} is defined in {home}"
        assert name in module.__all__, f"{former} no longer exports {name}"
