"""The ``sizing`` capability's wiring: the protocol's function list, the loader's check of the
module-level functions (and its message when one is missing; an optional one missing loads and
its tests skip with the fix), and the ``sizing`` area run on the reference's functions through
a small module that declares the capability, and on wrong ones it must fail."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvcheck.conformance
from kvcheck.conformance.loader import ImplLoadError, load_impl
from kvcheck.conformance.protocol import CAPABILITIES, KVCacheSpec, protocol_methods
from kvcheck.conformance.sizing_protocol import (
    SIZING_FUNCTIONS,
    SIZING_OPTIONAL_FUNCTIONS,
    SupportsSizing,
)

#: A module declaring ``sizing`` on top of the reference: the five functions re-exported from
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
for _fn in ("kv_page_size_bytes", "kv_sizing_plan", "kv_cache_view_shape", "kv_block_sizes",
            "kv_feature_defaults"):
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
    assert protocol_methods(SupportsSizing) == SIZING_FUNCTIONS + SIZING_OPTIONAL_FUNCTIONS
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


def test_loader_accepts_a_module_without_the_optional_function(folder: Path) -> None:
    """``kv_feature_defaults`` came later: a module written before it keeps loading."""
    _write(folder, "sizing_mod_older", drop=SIZING_OPTIONAL_FUNCTIONS)
    handle = load_impl("sizing_mod_older", search=[folder])
    assert handle.has("sizing") and not hasattr(handle.module, "kv_feature_defaults")


def test_serving_a_module_without_the_optional_function_answers_not_supported(
        folder: Path) -> None:
    """Over the wire (``kvcheck serve``) the missing function is ``not_supported`` (the
    client's ``UnsupportedSpec``: the test is skipped), not an engine failure; with the
    function, the answer is the settings as an object."""
    from kvcheck.wire.serve import Server

    request = {"id": 1, "method": "kv_feature_defaults",
               "params": {"model": {"runner": "pooling", "is_causal": False},
                          "profile": "vllm-0.33"}}
    _write(folder, "sizing_mod_served_older", drop=SIZING_OPTIONAL_FUNCTIONS)
    older = Server(load_impl("sizing_mod_served_older", search=[folder]))
    error = older.answer(request)["error"]
    assert isinstance(error, dict) and error["code"] == "not_supported", error
    _write(folder, "sizing_mod_served")
    served = Server(load_impl("sizing_mod_served", search=[folder]))
    assert served.answer(request)["result"] == {
        "enable_prefix_caching": False, "enable_chunked_prefill": False,
        "reasons": ["encoder_only"]}


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


def _run_area(pytester: pytest.Pytester, module: str, profile: str, *extra: str
              ) -> pytest.RunResult:
    suite = Path(kvcheck.conformance.__file__).parent
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--kv-impl={module}", f"--kv-profile={profile}",
        "--kv-max-examples=25", str(suite / "test_sizing.py"), *extra, timeout=600)


def test_feature_tests_skip_naming_the_missing_function(pytester: pytest.Pytester) -> None:
    """A module declaring ``sizing`` without ``kv_feature_defaults``: the rest of the area
    passes, and every test of the rule is skipped with a reason that names the function and
    how to add it, listed as such in the verdict's summary (not counted as run)."""
    _write(pytester.path, "sizing_mod_nofd", drop=SIZING_OPTIONAL_FUNCTIONS)
    result = _run_area(pytester, "sizing_mod_nofd", "vllm-0.33", "-k", "feature_defaults")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 0, outcomes
    assert outcomes.get("skipped", 0) == 26, outcomes  # 23 + 3 only meaningful under 0.10
    result.stdout.fnmatch_lines([
        "  ran per area: none",
        "*not applicable, skipped by the test itself: 23 tests: sizing 23",
        ("*skipped * (sizing *): sizing_mod_nofd declares 'sizing' without kv_feature_defaults "
         "(an optional sizing function*define kv_feature_defaults(model: KVModelFacts, profile: "
         "str) -> KVFeatureDefaults at module level*"),
    ], consecutive=False)


_KEEPS_PREFIX_CACHING = '''
from dataclasses import replace

def kv_feature_defaults(model, profile):
    """Wrong: turns prefix caching off only for encoder-decoder models, so a non-causal
    (bidirectional) pooling model keeps it."""
    answer = _sizing.kv_feature_defaults(model, profile)
    if model.runner == "pooling" and not model.is_causal:
        return replace(answer, enable_prefix_caching=True, reasons=())
    return answer
'''


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_feature_rule_keeping_prefix_caching_for_non_causal_is_caught(
        pytester: pytest.Pytester, profile: str) -> None:
    """A rule that keeps prefix caching on for a non-causal pooling model fails the golden
    case and the comparison of random model facts with the reference, under both profiles."""
    _write(pytester.path, "sizing_mod_causal")
    with (pytester.path / "sizing_mod_causal.py").open("a") as out:
        out.write(_KEEPS_PREFIX_CACHING)
    result = _run_area(pytester, "sizing_mod_causal", profile, "-k", "feature_defaults")
    result.stdout.fnmatch_lines([
        "FAILED *test_sizing.py::test_feature_defaults_golden*non-causal-pooling*",
        "FAILED *test_sizing.py::test_feature_defaults_match_reference*",
    ], consecutive=False)
    assert "does NOT conform" in result.stdout.str() or "failing areas" in result.stdout.str()
