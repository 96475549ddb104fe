"""EAGLE / MTP speculative decoding (capability ``eagle``, ``KVCacheSpec.use_eagle``;
docs/semantics.md#prefix-cache-hits): a prefix-cache hit drops the last block it matched, in
one group and in several, as vLLM 0.33.0's and 0.10.2's own ``KVCacheManager`` do
(``kvcheck.conformance.eagle_golden``), and the layouts vLLM fails on with EAGLE (a chunked
local attention group whose hits drop, with caching on) are refused. The random workloads of
the differential and law tests draw ``use_eagle`` too, for implementations declaring the
capability (``run_workload_machine(features={"eagle", ...})``); the EAGLE hit cap is a law
(``kvcheck.conformance.laws``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.eagle_golden import EAGLE_SCENARIOS, EagleScenario
from kvcheck.conformance.errors import UnsupportedSpec
from kvcheck.conformance.fine_grained import CAPABILITY as FINE_GRAINED
from kvcheck.conformance.fine_grained import fine_grained_hits
from kvcheck.conformance.golden_answers import (
    assert_answers,
    assert_free_queue,
    skip_unless_declared,
)
from kvcheck.conformance.protocol import (
    KIND_CAPABILITIES,
    VLLM_PROFILES,
    KVCacheGroupSpec,
    KVCacheSpec,
)

#: vLLM 0.33's per-group EAGLE flag (``KVCacheGroupSpec.is_eagle_group``).
EAGLE_GROUPS = "eagle_groups"

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle


def _needs(sc: EagleScenario, spec: KVCacheSpec) -> list[str]:
    """The capabilities ``sc``'s layout needs beyond ``eagle``."""
    if not sc.groups:
        return []
    needs = ["kv_cache_groups", *(KIND_CAPABILITIES[g.kind] for g in sc.groups)]
    if fine_grained_hits(spec):
        needs.append(FINE_GRAINED)
    if any(g.is_eagle_group for g in sc.groups):
        needs.append(EAGLE_GROUPS)
    return sorted(set(needs))


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("eagle")
@pytest.mark.parametrize("sc", EAGLE_SCENARIOS, ids=lambda sc: sc.name)
def test_eagle_golden(kv_impl: ImplHandle, kv_pair: PairFactory, kv_oracle: ImplHandle,
                      kv_profile: str, sc: EagleScenario) -> None:
    """Each op's answer with ``use_eagle=True`` as vLLM's own ``KVCacheManager`` gave it (the
    hit's last block dropped; a window's run one block longer first; 0.33's widened search,
    single drop and one cached block past the aligned boundary; 0.10.2's drop in both of its
    searches; Mamba's partial tail at EAGLE's replay boundary), the copies drained and the
    free queue after the last op; every op's answers and observables also equal the
    oracle's when it declares ``eagle``."""
    recorded = sc.recorded.get(kv_profile)
    if recorded is None:
        pytest.skip(f"{sc.name}: vLLM of {kv_profile} refuses this layout (under vllm-0.10: "
                    "one block size with prefix caching, no Mamba prefix caching, no "
                    "is_eagle_group)")
    spec = KVCacheSpec(num_blocks=sc.num_blocks, block_size=4, profile=kv_profile,
                       use_eagle=True, kv_cache_groups=sc.groups,
                       prefix_cache_retention_interval=sc.retention)
    skip_unless_declared(kv_impl, _needs(sc, spec))
    pair = kv_pair(num_blocks=sc.num_blocks, block_size=4, use_eagle=True,
                   kv_cache_groups=sc.groups, prefix_cache_retention_interval=sc.retention,
                   with_oracle=all(kv_oracle.has(c) for c in ("eagle", *_needs(sc, spec))))
    assert_answers(pair, f"{sc.name} ({sc.why})", sc.ops, recorded.answers)
    assert tuple(pair.impl.drained) == recorded.copies, (
        f"{sc.name} ({sc.why}): copies drained {pair.impl.drained}, vLLM "
        f"{list(recorded.copies)} ((src, dst) pairs of take_kv_cache_block_copies, in order)\n"
        + pair.impl.snippet())
    assert_free_queue(pair, sc.name, recorded.free_queue)


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("eagle", "chunked_local_attention")
def test_eagle_with_chunked_local_attention_is_refused(kv_impl: ImplHandle,
                                                       kv_profile: str) -> None:
    """EAGLE with prefix caching beside a chunked local attention group whose hits drop is
    declined (``UnsupportedSpec``) naming the rule: vLLM's ``ChunkedLocalAttentionManager``
    asserts 'Hybrid KV cache is not supported for eagle + chunked local attention' on the
    first lookup (0.33 and 0.10.2) when its search gets ``drop_eagle_block``: every group's
    does when none is flagged ``is_eagle_group``, and under vLLM 0.33 (``eagle_groups``) a
    flagged chunked group's, and an unflagged one's whose spec a flagged group shares (one
    search). With caching off the layout runs (no lookup ever asserts); an unflagged chunked
    group beside a flagged group of another spec runs too (its hits:
    ``test_eagle_golden``)."""
    full = KVCacheGroupSpec("full_attention", 4)
    chunked = KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=8)
    flagged = dataclasses.replace(chunked, is_eagle_group=True)
    refused_layouts: list[tuple[KVCacheGroupSpec, ...]] = [(full, chunked)]
    if kv_profile == "vllm-0.33" and kv_impl.has(EAGLE_GROUPS):
        refused_layouts += [(full, flagged), (full, flagged, chunked)]
    for groups in refused_layouts:
        spec = KVCacheSpec(num_blocks=25, block_size=4, profile=kv_profile, use_eagle=True,
                           kv_cache_groups=groups)
        with pytest.raises(UnsupportedSpec) as refused:
            kv_impl.make_manager(spec)
        assert "chunked local" in str(refused.value) and "eagle" in str(refused.value).lower(), (
            f"{kv_impl.name} declined EAGLE beside chunked local attention ({groups}) without "
            f"naming the rule (eagle + chunked local attention): {refused.value}")
    if kv_impl.has("caching_off"):
        off = KVCacheSpec(num_blocks=17, block_size=4, profile=kv_profile, use_eagle=True,
                          enable_caching=False, kv_cache_groups=(full, chunked))
        kv_impl.make_manager(off)  # must not raise
    if kv_profile == "vllm-0.33" and kv_impl.has(EAGLE_GROUPS):
        runs = KVCacheSpec(num_blocks=17, block_size=4, profile=kv_profile, use_eagle=True,
                           kv_cache_groups=(dataclasses.replace(full, is_eagle_group=True),
                                            chunked))
        kv_impl.make_manager(runs)  # vLLM 0.33 runs it: must not raise


@pytest.mark.kv_profiles("vllm-0.10")
@pytest.mark.kv_capability("eagle", EAGLE_GROUPS)
def test_eagle_group_flag_is_refused_under_vllm_010(kv_impl: ImplHandle,
                                                     kv_profile: str) -> None:
    """A group flagged ``is_eagle_group`` is declined (``UnsupportedSpec``) under vllm-0.10,
    naming the field: vLLM 0.10.2's ``KVCacheGroupSpec`` has no per-group flag (with
    ``use_eagle`` every group drops there)."""
    groups = (KVCacheGroupSpec("full_attention", 4, is_eagle_group=True),
              KVCacheGroupSpec("sliding_window", 4, sliding_window=4))
    spec = KVCacheSpec(num_blocks=17, block_size=4, profile=kv_profile, use_eagle=True,
                       kv_cache_groups=groups)
    with pytest.raises(UnsupportedSpec) as refused:
        kv_impl.make_manager(spec)
    assert "is_eagle_group" in str(refused.value), (
        f"{kv_impl.name} declined is_eagle_group under {kv_profile} without naming the "
        f"field: {refused.value}")
