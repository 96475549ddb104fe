"""The ``sizing`` capability's wiring: the protocol's function list, the loader's check of the
module-level functions (and its message when one is missing), and the ``sizing`` area run on
the reference's functions through a small module that declares the capability."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvcheck.conformance
from kvcheck.conformance.loader import ImplLoadError, load_impl
from kvcheck.conformance.protocol import CAPABILITIES, KVCacheSpec, protocol_methods
from kvcheck.conformance.sizing_protocol import SIZING_FUNCTIONS, SupportsSizing

#: A module declaring ``sizing`` on top of the reference: the four functions re-exported from
#: adapters/reference_sizing.py, minus those named in DROP.
_MODULE = '''
from dataclasses import replace

import kvcheck.adapters.reference as _ref
import kvcheck.adapters.reference_sizing as _sizing

IMPL_INFO = replace(_ref.IMPL_INFO, name="{name}",
                    capabilities=(_ref.IMPL_INFO.capabilities | {{"sizing"}}) - {{"offload"}})
make_kv_cache_manager = _ref.make_kv_cache_manager
make_block_pool = _ref.make_block_pool
kernels = _ref.kernels
DROP = {drop!r}
for _fn in ("kv_page_size_bytes", "kv_sizing_plan", "kv_cache_view_shape", "kv_block_sizes"):
    if _fn not in DROP:
        globals()[_fn] = getattr(_sizing, _fn)
'''


def _write(folder: Path, module: str, drop: tuple[str, ...] = ()) -> None:
    (folder / f"{module}.py").write_text(_MODULE.format(name=module, drop=drop))


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("sizing_mod_")]:
        del sys.modules[name]


def test_function_list_is_the_protocol() -> None:
    assert protocol_methods(SupportsSizing) == SIZING_FUNCTIONS
    assert "sizing" in CAPABILITIES


def test_loader_accepts_a_module_with_the_functions(folder: Path) -> None:
    _write(folder, "sizing_mod_ok")
    handle = load_impl("sizing_mod_ok", search=[folder])
    assert handle.has("sizing")


def test_loader_names_the_missing_function_and_the_fix(folder: Path) -> None:
    _write(folder, "sizing_mod_missing", drop=("kv_block_sizes",))
    with pytest.raises(ImplLoadError) as info:
        load_impl("sizing_mod_missing", search=[folder])
    message = str(info.value)
    assert message.startswith("kvcheck: --kv-impl=sizing_mod_missing: capability 'sizing' is "
                              "declared but module 'sizing_mod_missing' lacks the "
                              "module-level function(s) kv_block_sizes")
    assert "Fix: define kv_block_sizes at module level in sizing_mod_missing" in message
    assert "sizing_protocol.SupportsSizing" in message
    assert "or remove 'sizing' from IMPL_INFO.capabilities" in message
    assert "Traceback" not in message


def test_loader_does_not_look_for_sizing_on_the_manager(folder: Path) -> None:
    """The functions are module-level: a manager without them is fine."""
    _write(folder, "sizing_mod_manager")
    manager = load_impl("sizing_mod_manager", search=[folder]).make_manager(
        KVCacheSpec(num_blocks=8, block_size=4))
    assert not hasattr(manager, "kv_sizing_plan")


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_sizing_area_passes_on_the_reference(pytester: pytest.Pytester, profile: str) -> None:
    """conformance/test_sizing.py through the reference's functions, both profiles."""
    _write(pytester.path, "sizing_mod_area")
    suite = Path(kvcheck.conformance.__file__).parent
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kv-impl=sizing_mod_area", f"--kv-profile={profile}",
        "--kv-max-examples=25", str(suite / "test_sizing.py"), timeout=600)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 20, (
        outcomes, result.stdout.str()[-3000:])


_WRONG_GROUPING = '''
import kvcheck.adapters.reference_sizing as _sizing

def kv_sizing_plan(layers, available_memory, profile, num_gpu_blocks_override=None):
    """0.10.2's consecutive chunks whatever the profile."""
    return _sizing.kv_sizing_plan(layers, available_memory, "vllm-0.10",
                                  num_gpu_blocks_override)
'''


def test_sizing_area_fails_a_wrong_grouping(pytester: pytest.Pytester) -> None:
    """0.10.2's grouping answered under vllm-0.33: the worked example and the property test
    against the reference fail."""
    _write(pytester.path, "sizing_mod_wrong")
    with (pytester.path / "sizing_mod_wrong.py").open("a") as out:
        out.write(_WRONG_GROUPING)
    suite = Path(kvcheck.conformance.__file__).parent
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kv-impl=sizing_mod_wrong", "--kv-profile=vllm-0.33",
        "--kv-max-examples=25", str(suite / "test_sizing.py"), timeout=600)
    result.stdout.fnmatch_lines([
        "FAILED *test_sizing.py::test_worked_example_full_swa_2_to_4*",
        "FAILED *test_sizing.py::test_sizing_plan_matches_reference_and_invariants*",
    ], consecutive=False)
