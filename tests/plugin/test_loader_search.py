"""An adapter module in the current folder (or pytest's rootdir) is found by ``--kv-impl`` and
``kvcheck replay``, as pytest's ``pythonpath`` setting would find it, even through the
``pytest`` and ``kvcheck`` console scripts (which, unlike ``python -m``, do not put the current
folder on ``sys.path``); when an import still fails, the message says what was searched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kv_helpers import reference_capabilities_source

from kvcheck.conformance.loader import ImplLoadError, load_impl

_CAPS = reference_capabilities_source("_ref.IMPL_INFO.capabilities")
ADAPTER = f"""
from dataclasses import replace
import kvcheck.adapters.reference as _ref
IMPL_INFO = replace(_ref.IMPL_INFO, name="mine", capabilities={_CAPS})
make_kv_cache_manager = _ref.make_kv_cache_manager
make_block_pool = _ref.make_block_pool
"""
BIN = Path(sys.executable).parent


def script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a console script of this environment from ``cwd`` (no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(BIN / name), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "myimpl_adapter.py").write_text(ADAPTER)
    return tmp_path


def test_pytest_console_script_finds_the_adapter_in_the_current_folder(folder: Path) -> None:
    proc = script("pytest", "-p", "no:cacheprovider", "--kv-impl=myimpl_adapter", "-q",
                  "-k", "test_first_allocation", cwd=folder)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


def test_replay_finds_the_adapter_in_the_current_folder(folder: Path) -> None:
    trace = {"trace_version": 1, "impl": "myimpl_adapter",
             "spec": {"num_blocks": 8, "block_size": 4},
             "ops": [{"op": "add", "rid": "a", "prompt": [1, 2, 3, 4, 5]},
                     {"op": "schedule", "rid": "a", "num_tokens": None},
                     {"op": "free", "rid": "a"}]}
    (folder / "t.json").write_text(json.dumps(trace))
    proc = script("kvcheck", "replay", "t.json", cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_missing_dependency_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "needs_dep.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ImplLoadError) as info:
        load_impl("needs_dep", search=[tmp_path])
    message = str(info.value)
    assert "importing 'needs_dep' failed: No module named 'no_such_dependency_xyz'" in message
    assert "install 'no_such_dependency_xyz'" in message


def test_a_module_found_nowhere_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ImplLoadError) as info:
        load_impl("nowhere_module_xyz", search=[tmp_path])
    message = str(info.value)
    assert "cannot import 'nowhere_module_xyz'" in message
    assert f"searched sys.path and {tmp_path.resolve()}" in message
    assert "PYTHONPATH" in message and "pythonpath = FOLDER" in message
