"""pytest-cov: ``--cov=kvcheck`` measures kvcheck, and ``--cov=mypkg`` measures the engine under
test, with no "previously imported" warning.

pytest imports plugin entry modules before pytest-cov starts measuring, so the entry module
``kvcheck.plugin.plugin`` imports nothing of kvcheck at module level and the rest of the plugin
is imported from ``pytest_configure``. These tests hold it to that.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from kv_helpers import make_ref, reference_capabilities_source

import kvcheck
import kvcheck.plugin
from kvcheck.conformance.loader import DEFAULT_CALL_TIMEOUT
from kvcheck.conformance.protocol import PROFILES
from kvcheck.plugin import plugin as entry
from kvcheck.plugin import state


def test_the_entry_module_imports_nothing_of_kvcheck() -> None:
    code = ("import sys, kvcheck.plugin.plugin\n"
            "print(sorted(m for m in sys.modules if m.startswith('kvcheck')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['kvcheck', 'kvcheck.plugin', 'kvcheck.plugin.plugin']"


def test_the_entry_modules_constants_are_kvchecks() -> None:
    assert entry._PROFILES == PROFILES
    assert entry._DEFAULT_CALL_TIMEOUT == DEFAULT_CALL_TIMEOUT


def test_the_entry_module_still_exports_the_session_state() -> None:
    assert entry.KV_STATE is state.KV_STATE
    assert entry.KVSessionState is state.KVSessionState


@pytest.mark.parametrize("package", [kvcheck, kvcheck.plugin], ids=["kvcheck", "plugin"])
def test_package_inits_hold_constants_only(package: Any) -> None:
    """``measure_root_package`` runs ``kvcheck/__init__.py`` a second time under coverage,
    which is harmless only while it defines nothing that could be identified (a class, a
    function) and imports nothing."""
    tree = ast.parse(Path(package.__file__).read_text(encoding="utf-8"))
    for node in tree.body:
        assert isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)), ast.dump(node)[:80]
        value = node.value
        assert isinstance(value, (ast.Constant, ast.List, ast.Tuple)), ast.dump(node)[:80]


def coverage_of(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    """A subprocess run (pytest-cov must start before the plugins are imported, as it does
    for a user) with a JSON coverage report."""
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-max-examples=3",
                                           "--cov-report=json:cov.json", *args)
    data = json.loads((pytester.path / "cov.json").read_text(encoding="utf-8"))
    return result, data


def executed(data: dict[str, Any], suffix: str) -> set[int]:
    (name,) = [f for f in data["files"] if f.replace("\\", "/").endswith(suffix)]
    return set(data["files"][name]["executed_lines"])


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def assert_no_coverage_warning(result: pytest.RunResult) -> None:
    out = result.stdout.str() + result.stderr.str()
    assert "CoverageWarning" not in out and "previously imported" not in out, out[-2000:]


def test_cov_kvcheck_measures_the_plugin(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_cov")
    result, data = coverage_of(pytester, make_ref(pytester), "-k", "test_allocation",
                               "--cov=kvcheck")
    assert result.ret == 0
    assert_no_coverage_warning(result)
    plugin_dir = Path(state.__file__).parent
    # Module-level lines run only when a module is imported: measured, so imported under
    # coverage.
    for module, text in (("report.py", "def verdict("), ("state.py", "class KVSessionState"),
                         ("suite.py", "def configure(")):
        assert line_of(plugin_dir / module, text) in executed(data, f"plugin/{module}"), module
    assert executed(data, "kvcheck/__init__.py"), "the root package counts as measured"


ENGINE = """
class Engine:
    def __init__(self, spec):
        from kvcheck.adapters.reference import make_kv_cache_manager
        self._manager = make_kv_cache_manager(spec)

    def __getattr__(self, name):
        return getattr(self._manager, name)
"""

_CAPS = reference_capabilities_source("_ref.IMPL_INFO.capabilities")
ADAPTER = f"""
from dataclasses import replace

import kvcheck.adapters.reference as _ref
from mypkg.engine import Engine

IMPL_INFO = replace(_ref.IMPL_INFO, name="mine", capabilities={_CAPS})
make_block_pool = _ref.make_block_pool


def make_kv_cache_manager(spec):
    return Engine(spec)
"""


def test_cov_of_the_engine_under_test(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_cov")
    pkg = pytester.mkpydir("mypkg")
    (pkg / "engine.py").write_text(textwrap.dedent(ENGINE))
    (pkg / "kv_adapter.py").write_text(textwrap.dedent(ADAPTER))
    result, data = coverage_of(pytester, "--kv-impl=mypkg.kv_adapter", "-k", "test_allocation",
                               "--cov=mypkg")
    assert result.ret == 0, result.stderr.str()
    assert_no_coverage_warning(result)
    engine = executed(data, "mypkg/engine.py")
    assert line_of(pkg / "engine.py", "class Engine") in engine  # imported under coverage
    assert line_of(pkg / "engine.py", "return getattr") in engine  # and called
    assert line_of(pkg / "kv_adapter.py", "IMPL_INFO = ") in executed(data,
                                                                     "mypkg/kv_adapter.py")
