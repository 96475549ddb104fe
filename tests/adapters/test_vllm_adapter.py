"""The vLLM adapter module: its clean failure without vLLM, and (only where vLLM is importable,
e.g. in an environment built by scripts/vllm-cpu-env.sh) a short suite run on it."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from typing import Any

import pytest

from kvcheck.conformance.loader import ImplLoadError, load_impl

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make vLLM look uninstalled and the adapter not yet imported."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None if name == "vllm" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.delitem(sys.modules, "kvcheck.adapters.vllm", raising=False)


def test_import_without_vllm_names_the_recipe(no_vllm: None) -> None:
    with pytest.raises(ImportError, match=r"vLLM is not installed.*scripts/vllm-cpu-env\.sh"):
        importlib.import_module("kvcheck.adapters.vllm")


def test_kv_impl_vllm_without_vllm_is_a_clean_usage_error(no_vllm: None) -> None:
    with pytest.raises(ImplLoadError) as info:
        load_impl("vllm")
    message = str(info.value)
    assert "--kv-impl=vllm: cannot import 'kvcheck.adapters.vllm'" in message
    assert "scripts/vllm-cpu-env.sh" in message
    assert "Traceback" not in message


def test_kv_oracle_vllm_without_vllm_is_a_usage_error(no_vllm: None,
                                                      pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference",
                                "--kv-oracle=vllm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kv-oracle=vllm: cannot import*scripts/vllm-cpu-env.sh*"])


# ------------------------------------------------------------------------------ with vLLM
needs_vllm = pytest.mark.skipif(
    not HAS_VLLM, reason="vLLM is not importable here (build it: scripts/vllm-cpu-env.sh)")

_SUBSET = ("test_first_allocation or test_free_order_golden or test_golden_block_hashes "
           "or test_prefill_emits_one_block_stored or test_slot_mapping_matches_block_table "
           "or test_t2_hashed_to_tail or test_random_workloads_match_reference")

_FACTS = """
import json
import kvcheck.adapters.vllm as a
print(json.dumps({"version": a.VERSION, "profile": a.IMPL_INFO.profile,
                  "xfails": None if a.XFAILS_FILE is None else str(a.XFAILS_FILE)}))
"""


@pytest.fixture(scope="module")
def vllm_facts() -> dict[str, Any]:
    """What the adapter says about the installed vLLM, asked in a child process (vLLM and
    torch are never imported into this one, whose pytester runs drop and re-import modules)."""
    proc = subprocess.run([sys.executable, "-c", _FACTS], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_vllm
def test_short_suite_on_vllm(pytester: pytest.Pytester, vllm_facts: dict[str, Any]) -> None:
    """A subset of every area, in a subprocess."""
    args = ["-p", "no:cacheprovider", "--kv-impl=vllm", "--kv-max-examples=5", "-k", _SUBSET]
    if vllm_facts["xfails"]:
        args.append(f"--kv-xfails-file={vllm_facts['xfails']}")
    result = pytester.runpytest_subprocess(*args, timeout=900)
    result.stdout.fnmatch_lines([
        (f"kvcheck: vllm {vllm_facts['version']} (kvcheck.adapters.vllm) "
         f"profile={vllm_facts['profile']}*"),
        "  note: vLLM*",
    ])
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 10, outcomes


@needs_vllm
def test_vllm_as_oracle_agrees_with_reference(pytester: pytest.Pytester,
                                              vllm_facts: dict[str, Any]) -> None:
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kv-impl=reference", "--kv-oracle=vllm",
        f"--kv-profile={vllm_facts['profile']}", "--kv-max-examples=5", "-k",
        "test_random_workloads_match_reference or test_free_order_golden", timeout=900)
    result.stdout.fnmatch_lines([f"kvcheck: oracle vllm {vllm_facts['version']} *"])
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 3, outcomes


# A vLLM general plugin, installed the way pip would (a dist-info with an entry point), whose
# "patch" frees a request's blocks first-to-last instead of last-to-first.
_PLUGIN = '''
def register():
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.free_blocks
    if getattr(original, "_kvcheck_test_patch", False):
        return

    def free_blocks(self, ordered_blocks):
        return original(self, list(reversed(list(ordered_blocks))))

    free_blocks._kvcheck_test_patch = True
    BlockPool.free_blocks = free_blocks
'''


@needs_vllm
def test_patched_vllm_plugin_is_checked(pytester: pytest.Pytester,
                                        vllm_facts: dict[str, Any]) -> None:
    """A plugin loaded by the adapter (as vLLM's engine loads it) is what gets checked: its
    wrong free order fails the golden free-order tests."""
    pytester.makepyfile(kvcheck_test_patch=_PLUGIN)
    info = pytester.mkdir("kvcheck_test_patch-0.1.dist-info")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvcheck-test-patch\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nfree_forward = kvcheck_test_patch:register\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kv-impl=vllm", f"--kv-profile={vllm_facts['profile']}",
        "-k", "test_free_order_golden_test_evict or test_first_allocation", timeout=900)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 1 and outcomes.get("passed", 0) == 1, outcomes
    result.stdout.fnmatch_lines([
        ("*ConformanceMismatch: after op #5 {'op': 'free', 'rid': '0'}: free queue (head "
         "first) differs*"),
        # -k selects 2 tests: the failure is proof, and the line says the run was partial.
        ("verdict: vllm does NOT conform to *: failing areas: eviction (incomplete run: ran 2 "
         "of * applicable tests; *)")])
