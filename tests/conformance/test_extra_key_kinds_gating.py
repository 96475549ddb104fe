"""Extra keys by kind (issue 24 item 7): ``lora``, ``multimodal`` and ``cache_salt`` are
capabilities of their own, ``extra_keys`` their union; random workloads and recorded traces
draw only the kinds declared; the scripted suite area ``extra_key_kinds`` runs the declared
kinds only, and catches a design that leaves the LoRA adapter out of its content key under
``--kv-profile=generic`` at the default settings (the random workloads need ~400 examples).

The suite area runs in-process (``pytester.inline_run``, as ``inner_runs.run_area`` does).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from inner_runs import NoShrinkProfile
from kv_helpers import reference_capabilities_source

import kvcheck.conformance
from kvcheck.conformance.differential import Pair
from kvcheck.conformance.loader import ImplHandle, load_impl
from kvcheck.conformance.protocol import (
    DESIGN_CAPABILITIES,
    EXTRA_KEY_KINDS,
    PROFILES,
    ImplInfo,
    KVCacheSpec,
    effective_capabilities,
    extra_key_kinds,
)
from kvcheck.conformance.recorder import record_trace, trace_plan
from kvcheck.conformance.workload_machine import extra_draws, run_workload_machine
from kvcheck.errors import KVCheckInputError

pytest_plugins = ["pytester"]

AREA_FILE = Path(kvcheck.conformance.__file__).resolve().parent / "test_extra_key_kinds.py"
MUTANTS_DIR = Path(__file__).resolve().parents[1] / "mutants"
LORA, MM, SALT = ("test_lora_contexts_never_share_blocks",
                  "test_multimodal_contexts_never_share_blocks",
                  "test_cache_salt_contexts_never_share_blocks")


def _info(*capabilities: str, profile: str = "generic") -> ImplInfo:
    return ImplInfo(name="x", version="0", capabilities=frozenset({"manager", *capabilities}),
                    profile=profile)


# ---------------------------------------------------------------- the capabilities
@pytest.mark.parametrize("profile", PROFILES)
def test_extra_keys_means_all_three_kinds(profile: str) -> None:
    """Declaring extra_keys declares lora, multimodal and cache_salt under every profile;
    declaring the three implies extra_keys; a part of them implies nothing more."""
    kinds = set(EXTRA_KEY_KINDS)
    assert kinds == {"lora", "multimodal", "cache_salt"}
    assert extra_key_kinds({"extra_keys"}) == kinds
    assert kinds | {"extra_keys"} <= effective_capabilities(_info("extra_keys"), profile)
    assert "extra_keys" in effective_capabilities(_info(*kinds), profile)
    partial = effective_capabilities(_info("lora", "multimodal"), profile)
    assert partial & (kinds | {"extra_keys"}) == {"lora", "multimodal"}
    assert extra_key_kinds(partial) == {"lora", "multimodal"}
    design = DESIGN_CAPABILITIES if profile != "generic" else frozenset()
    assert effective_capabilities(_info(), profile) == {"manager"} | design


def test_reference_declares_every_kind_through_extra_keys() -> None:
    """The reference (and the vLLM adapter) declare extra_keys only, which gives every kind:
    nothing changes for them under the vLLM profiles."""
    info = load_impl("reference").info
    assert "extra_keys" in info.capabilities and not info.capabilities & set(EXTRA_KEY_KINDS)
    for profile in PROFILES:
        assert extra_key_kinds(effective_capabilities(info, profile)) == set(EXTRA_KEY_KINDS)


def test_extra_draws_follow_the_declared_kinds() -> None:
    """All kinds (or True) draw what the machine always drew, in the same order, so the
    examples of an extra_keys run are unchanged; no kinds draw the same list, ignored; a part
    draws only its own; a name that is not a kind is refused, named."""
    everything = ("", "salt", "lora", "mm")
    assert extra_draws(True) == extra_draws(set(EXTRA_KEY_KINDS)) == everything
    assert extra_draws(False) == extra_draws(frozenset()) == everything
    assert extra_draws({"lora", "multimodal"}) == ("", "lora", "mm")
    assert extra_draws({"cache_salt"}) == ("", "salt")
    with pytest.raises(KVCheckInputError, match=r"\['extra_keys'\] are not extra-key kinds"):
        extra_draws({"lora", "extra_keys"})


# ---------------------------------------------------------------- random workloads, traces
def _reference_with(kinds: set[str], profile: str = "generic") -> ImplHandle:
    """The reference declaring the extra-key kinds ``kinds`` instead of extra_keys."""
    ref = load_impl("reference")
    caps = ref.info.capabilities - {"extra_keys"} | kinds
    return replace(ref, name="kinds", info=replace(ref.info, name="kinds", capabilities=caps,
                                                  profile=profile))


def _extras_of(ops: list[Any]) -> Counter[str]:
    return Counter(key for op in ops if op["op"] == "add"
                   for key in ("lora", "mm", "salt") if op.get(key))


def test_random_workloads_draw_only_declared_kinds() -> None:
    """A design with LoRA and multimodal keys but no cache salt: its random workloads carry
    LoRA adapters and images, never a salt."""
    impl = _reference_with({"lora", "multimodal"})
    pairs: list[Pair] = []

    def make_pair(**fields: Any) -> Pair:
        pairs.append(Pair(impl, None, KVCacheSpec(profile="generic", **fields)))
        return pairs[-1]

    kinds = extra_key_kinds(effective_capabilities(impl.info, "generic"))
    run_workload_machine(make_pair, settings(max_examples=20, deadline=None, derandomize=True,
                                             database=None,
                                             suppress_health_check=list(HealthCheck)),
                         None, extras=kinds, events=False, impl=impl, profile="generic",
                         random_roots=True)
    drawn = _extras_of([op for pair in pairs for op in pair.ops])
    assert drawn["lora"] and drawn["mm"] and not drawn["salt"], drawn


def test_recorded_traces_draw_only_declared_kinds() -> None:
    """``kvcheck record`` on such a design: its extras trace carries LoRA and images, no
    salt (trace 29: an extras trace without KV events, where LoRA is drawn)."""
    assert trace_plan(29, "vllm-0.33").flavour == "extras"
    trace = record_trace(_reference_with({"lora", "multimodal"}, "vllm-0.33"), "vllm-0.33",
                         29, 0, steps=120)
    drawn = _extras_of([step["op"] for step in trace["steps"]])
    assert drawn["lora"] and drawn["mm"] and not drawn["salt"], drawn


# ---------------------------------------------------------------- the suite area
def _run_area(pytester: pytest.Pytester, impl: str, *args: str,
              path: Path | None = None) -> pytest.HookRecorder:
    """The extra_key_kinds area in-process on ``impl`` (default --kv-max-examples, no
    shrinking, an empty ini, no terminal reporter and no whole-suite count: only the
    outcomes are read)."""
    ini = pytester.makeini("[pytest]\n")
    pytester.syspathinsert(path)
    with pytest.MonkeyPatch.context() as patch:
        # The child pytest counting the whole suite for a partial run's verdict (~3 s):
        # not needed, only the outcomes are read.
        for name, module in list(sys.modules.items()):
            if name.startswith("kvcheck.plugin") and hasattr(module, "inventory_subprocess"):
                patch.setattr(module, "inventory_subprocess", lambda *a, **k: None)
        return pytester.inline_run(f"--kv-impl={impl}", *args, "-p", "no:cacheprovider",
                                   "-p", "no:terminal", "-c", str(ini), str(AREA_FILE),
                                   plugins=[NoShrinkProfile()])


def _functions(reports: Any) -> Counter[str]:
    return Counter(r.nodeid.split("::")[-1].split("[")[0] for r in reports)


def test_area_runs_only_the_declared_kinds(pytester: pytest.Pytester) -> None:
    """Under generic, a design declaring lora alone runs (and passes) the LoRA cases; the
    multimodal and salt cases are not applicable, naming the capability it lacks."""
    caps = reference_capabilities_source("_ref.IMPL_INFO.capabilities", drop=["extra_keys"])
    pytester.makepyfile(lora_only=f"""
from dataclasses import replace
import kvcheck.adapters.reference as _ref
IMPL_INFO = replace(_ref.IMPL_INFO, name="lora_only", profile="generic",
                    capabilities=({caps}) | {{"lora"}})
make_kv_cache_manager = _ref.make_kv_cache_manager
make_block_pool = _ref.make_block_pool
""")
    rec = _run_area(pytester, "lora_only", path=pytester.path)
    passed, skipped, failed = rec.listoutcomes()
    assert not failed and _functions(passed) == {LORA: 3}, (_functions(passed), failed)
    assert _functions(skipped) == {MM: 3, SALT: 3}
    reasons = {str(r.longrepr) for r in skipped}
    assert any("does not declare capability 'multimodal'" in r for r in reasons), reasons
    assert any("does not declare capability 'cache_salt'" in r for r in reasons), reasons


def test_generic_catches_lora_left_out_of_key_at_default_settings(
        pytester: pytest.Pytester) -> None:
    """tests/mutants/mut_lora_left_out_of_key.py (the LoRA adapter is not in its block
    hashes) fails every LoRA case under generic at the default --kv-max-examples, with the
    hit-correctness law naming the other adapter; its multimodal and salt cases pass."""
    rec = _run_area(pytester, "mut_lora_left_out_of_key", "--kv-profile=generic",
                    path=MUTANTS_DIR)
    passed, _, failed = rec.listoutcomes()
    assert _functions(failed) == {LORA: 3}, _functions(failed)
    assert _functions(passed) == {MM: 3, SALT: 3}, _functions(passed)
    text = "\n".join(str(r.longrepr) for r in failed)
    assert "hit correctness: get_computed_blocks('other')" in text, text[-3000:]
    assert "under another context (lora=('adapter-a', 1, '/lora/adapter-a')" in text, (
        text[-3000:])
