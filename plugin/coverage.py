"""How much a run checked: the tests that ran per area and their block sizes, the suite's tests
per law family that ran and passed, and what was not applicable and why.

The laws (``kvcheck.conformance.laws``) are judged after every op of every test driven through
a ``Pair``, but a law is only *tested* by a workload that reaches the states it is about. The
suite's tests are therefore classified by the law families their workloads exercise
(``LAW_FAMILIES``, docs/generic-profile.md "What the verdict says"):

* **conservation**: blocks are allocated, freed or refused and the free count is judged
  (no leak, no block counted twice, nothing lost by a failed allocation);
* **ownership**: several live requests hold blocks at once, or blocks are reused or reserved
  (no block to two requests unless shared through a hit, none twice in a table, no write
  into a shared block, reserved blocks never handed out, ref counts);
* **hit correctness**: lookups return hits and every hit holds the request's prefix;
* **eviction safety**: cached blocks are freed, evicted or reused under pressure (lazy
  eviction: a freed cached block hits until reused; a cached block in use is never evicted
  or handed out; a failed allocation evicts nothing).

Some tests exercise a family only when the design caches (``prefix_caching``): without a
cache the random workloads never hit and evict nothing. ``Checks.caching`` lists those.

The classification is a table here rather than a marker on each test: it is one place to
review, it is checked against the suite (``unclassified``: every suite test is listed, or its
file checks no law), and it leaves the suite's test files alone.

A verdict of "conforms to generic" needs at least ``MIN_TESTS_PER_FAMILY`` passed tests (test
functions: parametrized cases of one test count once) in each family, for an implementation
with a request-level manager; below it the verdict is "insufficient coverage", naming the
families short and what would add tests (``Coverage.fixes``). The vLLM profiles run the
whole suite (their capabilities are implied), so no minimum binds them; the counts are
shown all the same.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypedDict, cast

import pytest

from kvcheck.conformance.sizes import BLOCK_SIZES_PROPERTY
from kvcheck.results.schema import RecordCoverage

__all__ = ["BLOCK_SIZES_PROPERTY", "CACHING", "FAMILIES", "GATING_PROPERTY", "LAW_FAMILIES",
           "MIN_TESTS_PER_FAMILY", "NOT_APPLICABLE_KINDS", "NO_LAW_FILES", "Checks", "Coverage",
           "GatingFacts", "TestFacts", "collection_properties", "families_of", "function_key",
           "measure", "unclassified"]

CONSERVATION, OWNERSHIP, HITS, EVICTION = FAMILIES = (
    "conservation", "ownership", "hit correctness", "eviction safety")
#: Passed test functions each law family needs for "conforms to generic": one test per
#: family could pass by accident of its workload; three independent workloads rarely all miss
#: a broken law. The shipped nano_kv design (tests/nano) clears it in every family.
MIN_TESTS_PER_FAMILY = 3
#: The capability without which no block is ever cached (so no hit, no eviction).
CACHING = "prefix_caching"
#: Why a suite test did not apply (``TestFacts.not_applicable``), in the summary's order.
NOT_APPLICABLE_KINDS = ("capability", "vllm_only", "profile", "unsupported_spec", "skips_file",
                        "other")
_KIND_TEXT = {
    "capability": "undeclared capabilities",
    "vllm_only": "exact vLLM behaviour, not run under generic",
    "profile": "only meaningful under another profile",
    "unsupported_spec": "spec declined (UnsupportedSpec, or sizes not declared)",
    "skips_file": "listed in --kv-skips-file",
    "other": "skipped by the test itself",
}
#: The user property (``item.user_properties``) the plugin's collection adds to every suite
#: test: the facts of its markers (``collection_properties``).
GATING_PROPERTY = "kv_gating"


class Checks(NamedTuple):
    """The law families one test exercises: ``always``, and ``caching`` only when the design
    declares ``prefix_caching`` (under a vLLM profile it always does)."""

    always: tuple[str, ...] = ()
    caching: tuple[str, ...] = ()


_NONE = Checks()
_CO = Checks((CONSERVATION, OWNERSHIP))
_ALL = Checks((CONSERVATION, OWNERSHIP, HITS, EVICTION))
#: Random workloads and drains: every family when the design caches, else the pool laws.
_WORKLOAD = Checks((CONSERVATION, OWNERSHIP), (HITS, EVICTION))

#: Suite files whose tests check no law family (kernels, sizing arithmetic, batch metadata).
NO_LAW_FILES = frozenset({"test_kernels.py", "test_sizing.py", "test_batch_metadata.py",
                          "test_indexer.py",
                          # The offload tier's own laws (conformance/offload_model.py).
                          "test_offload.py"})

#: ``file::test`` (``function_key``) -> the law families its workload exercises.
LAW_FAMILIES: dict[str, Checks] = {
    # allocation
    "test_allocation.py::test_first_allocation": _CO,
    "test_allocation.py::test_initial_free_count": _CO,
    "test_allocation.py::test_capacity_exact_fit_then_none": _CO,
    "test_allocation.py::test_all_or_nothing": Checks((CONSERVATION, OWNERSHIP),
                                                      (HITS, EVICTION)),
    "test_allocation.py::test_null_block_never_handed_out": _CO,
    "test_allocation.py::test_returns_only_new_blocks": Checks((CONSERVATION, OWNERSHIP),
                                                               (HITS,)),
    "test_allocation.py::test_decode_within_block_allocates_nothing": Checks((CONSERVATION,)),
    "test_allocation.py::test_chunked_prefill_matches": Checks((CONSERVATION,)),
    "test_allocation.py::test_ref_counts_follow_sharing": Checks((CONSERVATION, OWNERSHIP,
                                                                  HITS)),
    "test_allocation.py::test_lookahead_slots": Checks((HITS,)),
    "test_allocation.py::test_a_step_needing_no_block_runs_in_a_full_pool": _CO,
    # block ownership: no write into a shared block; rebinding to an identical block
    "test_block_ownership.py::test_new_tokens_are_written_only_into_blocks_no_other_request_holds":
        Checks((OWNERSHIP, HITS)),
    "test_block_ownership.py::test_block_computed_twice_may_be_rebound_once_computed":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    # differential
    "test_differential.py::test_random_workloads_match_reference": _ALL,
    "test_differential.py::test_random_workloads_with_extra_keys_match_reference": _ALL,
    # edge cases
    "test_edge_cases.py::test_mm_items_at_block_edges": _NONE,
    "test_edge_cases.py::test_evicting_one_of_two_duplicate_blocks_keeps_the_other":
        Checks((HITS, EVICTION)),
    "test_edge_cases.py::test_lookahead_slots_in_a_chunked_prefill_are_not_cached":
        Checks((HITS,)),
    "test_edge_cases.py::test_no_events_while_events_are_disabled": _NONE,
    "test_edge_cases.py::test_hits_with_no_new_tokens": Checks((OWNERSHIP, HITS)),
    # Hybrid layouts' paths mutation testing asked for: golden answers from vLLM 0.33.0 through
    # a Pair (the laws after every op).
    "test_edge_cases.py::test_hybrid_edge_golden": Checks((CONSERVATION, OWNERSHIP, HITS)),
    # events: the event streams themselves are no law; the workloads driven through a Pair are
    "test_events.py::test_prefill_emits_one_block_stored": _NONE,
    "test_events.py::test_chunked_prefill_event_parent_is_previous_block": _NONE,
    "test_events.py::test_decode_filling_a_block_stores_it_with_parent": _NONE,
    "test_events.py::test_stored_after_prefix_hit_chains_to_the_hit": _NONE,
    "test_events.py::test_multi_block_event_parent_chain": _NONE,
    "test_events.py::test_event_hashes_equal_block_hashes": _NONE,
    "test_events.py::test_lora_id_carried": _NONE,
    "test_events.py::test_reallocating_cached_blocks_removes_each_key_then_stores": _NONE,
    "test_events.py::test_reset_prefix_cache_emits_all_blocks_cleared": _NONE,
    "test_events.py::test_no_events_when_events_are_off": _NONE,
    "test_events.py::test_event_stream_matches_reference": _ALL,
    "test_events.py::test_event_stream_with_extra_keys_matches_reference":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    # events_wire: the stream's own laws and the router's index against the engine's hits
    # (judged by the area itself, not by the law families: plain Drivers, no Pair).
    "test_events_wire.py::test_router_index_from_the_stream_equals_the_engines_hits": _NONE,
    "test_events_wire.py::test_a_hash_on_two_blocks_stays_announced_until_both_are_evicted":
        _NONE,
    "test_events_wire.py::test_payload_bytes_equal_the_oracles": _NONE,
    "test_events_wire.py::test_sparse_group_payloads_equal_the_oracles": _NONE,
    "test_events_wire.py::test_partial_key_payloads_equal_the_oracles": _NONE,
    "test_events_wire.py::test_mamba_group_payloads_equal_the_oracles": _NONE,
    "test_events_wire.py::test_fine_grained_hit_payloads_equal_the_oracles": _NONE,
    "test_events_wire.py::test_partial_key_payloads_carry_their_blocks_extra_keys": _NONE,
    "test_events_wire.py::test_eagle_payloads_equal_the_oracles": _NONE,
    "test_events_wire.py::test_mamba_checkpoint_payloads_equal_the_oracles": _NONE,
    # external_kv: a connector's tokens, asynchronous loads, failed loads, evict_blocks
    "test_external_kv.py::test_delayed_load_caches_nothing_until_cache_blocks":
        Checks((CONSERVATION,), (HITS,)),
    "test_external_kv.py::test_sync_load_caches_in_the_same_call":
        Checks((CONSERVATION,), (HITS,)),
    "test_external_kv.py::test_zero_new_tokens_legal_with_external_tokens": Checks((CONSERVATION,)),
    "test_external_kv.py::test_refused_external_allocation_changes_nothing": _WORKLOAD,
    "test_external_kv.py::test_external_blocks_are_fresh_and_counted":
        Checks((CONSERVATION, OWNERSHIP), (HITS,)),
    "test_external_kv.py::test_two_phase_allocation_never_evicts_another_groups_hits": _WORKLOAD,
    "test_external_kv.py::test_evict_blocks_drops_keys_only": Checks((CONSERVATION,),
                                                                     (HITS, EVICTION)),
    "test_external_kv.py::test_failed_load_recovery": Checks((CONSERVATION,), (HITS,)),
    "test_external_kv.py::test_a_table_of_nulls_only_is_freed": _CO,
    "test_external_kv.py::test_external_blocks_of_every_group_come_before_new_blocks": _CO,
    "test_external_kv.py::test_a_window_drops_the_hits_external_tokens_pass":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    "test_external_kv.py::test_hits_a_window_drops_cost_no_block":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    "test_external_kv.py::test_golden_external_kv_scenario": _WORKLOAD,
    "test_external_kv.py::test_golden_external_kv_scenario_with_a_window": _WORKLOAD,
    "test_external_kv.py::test_random_external_kv_workloads_match_reference": _WORKLOAD,
    "test_external_kv.py::test_random_external_kv_workloads_with_groups_match_reference":
        _WORKLOAD,
    # eviction
    "test_eviction.py::test_free_order_golden_test_evict": Checks((CONSERVATION, HITS,
                                                                   EVICTION)),
    "test_eviction.py::test_free_order_golden_test_prefill": Checks((CONSERVATION, OWNERSHIP,
                                                                     EVICTION)),
    "test_eviction.py::test_free_order_golden_caching_off": Checks((CONSERVATION,)),
    "test_eviction.py::test_lru_refresh_on_hit": Checks((HITS, EVICTION)),
    "test_eviction.py::test_lazy_eviction_freed_block_still_hits": Checks((HITS, EVICTION)),
    "test_eviction.py::test_eviction_is_tail_first_within_a_request": Checks((HITS, EVICTION)),
    "test_eviction.py::test_unhashed_blocks_reused_before_cached_ones": Checks((EVICTION,)),
    # extra keys by kind: the same tokens under two contexts never share a block
    "test_extra_key_kinds.py::test_lora_contexts_never_share_blocks": Checks((OWNERSHIP, HITS)),
    "test_extra_key_kinds.py::test_multimodal_contexts_never_share_blocks":
        Checks((OWNERSHIP, HITS)),
    "test_extra_key_kinds.py::test_cache_salt_contexts_never_share_blocks":
        Checks((OWNERSHIP, HITS)),
    # hashing: golden hash bytes are no law; hits across changed blocks are
    "test_hashing.py::test_golden_block_hashes": _NONE,
    "test_hashing.py::test_fixed_seed_root_is_not_random": _NONE,
    "test_hashing.py::test_large_token_ids_hash_losslessly": _NONE,
    "test_hashing.py::test_golden_salted_hashes": _NONE,
    "test_hashing.py::test_golden_lora_hash": _NONE,
    "test_hashing.py::test_changing_block_j_changes_hashes_from_j_on": _NONE,
    "test_hashing.py::test_repeated_block_content_gets_distinct_hashes": _NONE,
    "test_hashing.py::test_changing_block_j_stops_prefix_hit_at_j": Checks((HITS,)),
    "test_hashing.py::test_token_ids_are_not_truncated": Checks((HITS,)),
    "test_hashing.py::test_extra_keys_change_every_block_hash_as_reference": _NONE,
    "test_hashing.py::test_extra_keys_isolate_prefix_hits": Checks((HITS,)),
    "test_hashing.py::test_hashes_identical_across_processes": _NONE,
    "test_hashing.py::test_unset_seed_root_is_random_per_process": _NONE,
    # hybrid (several KV-cache groups)
    "test_hybrid.py::test_hybrid_golden": _CO,
    "test_hybrid.py::test_hybrid_laws_hold_under_random_workloads": _WORKLOAD,
    "test_hybrid.py::test_hybrid_differential": _ALL,
    "test_hybrid.py::test_v010_window_hits_in_the_free_queue_consume_free_blocks":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    "test_hybrid.py::test_v033_window_hits_inside_the_window_consume_free_blocks":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    "test_hybrid.py::test_hit_length_iterates_to_a_fixed_point":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    # vLLM accepting a layout is configuration, no law
    "test_hybrid.py::test_every_layout_vllm_accepts_is_accepted": _NONE,
    "test_hybrid.py::test_groups_of_one_spec_are_searched_together":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    "test_hybrid.py::test_a_window_step_needing_no_block_runs_in_a_full_pool": _CO,
    "test_hybrid.py::test_chunked_local_hits_inside_the_current_chunk":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    "test_hybrid.py::test_sparse_retention_keeps_no_block_without_a_shared_prefix":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    "test_hybrid.py::test_without_full_attention_the_groups_are_searched_in_their_order":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    # encoder-decoder models (caching off: no hits) and 0.33's partial-block keys, replayed
    # with the laws after every op
    "test_hybrid.py::test_cross_attention_golden": _CO,
    "test_hybrid.py::test_cross_attention_with_prefix_caching_is_refused": _NONE,
    # Mamba: tables, nulls and the free queue (conservation, ownership), hits on a cached
    # state and the same-step refusal (hit correctness).
    "test_hybrid.py::test_mamba_golden": Checks((CONSERVATION, OWNERSHIP, HITS)),
    "test_hybrid.py::test_fine_grained_golden": Checks((CONSERVATION, OWNERSHIP, HITS)),
    # Mamba prefill checkpoints and sparse retention: golden answers, the laws after every op
    # (the checkpoint block holds the state at its position: hit correctness).
    "test_hybrid.py::test_mamba_checkpoints_golden": Checks((CONSERVATION, OWNERSHIP, HITS)),
    # Boundary-state hand-offs: the golden drains, with the laws after every op (the hand-off
    # laws check which block holds which state: hit correctness).
    "test_hybrid.py::test_boundary_state_offloads_golden": Checks((CONSERVATION, OWNERSHIP,
                                                                    HITS)),
    "test_hybrid.py::test_mamba_layouts_vllm_refuses_are_refused": _NONE,
    # EAGLE / MTP (capability eagle): golden hits with the last block dropped, the refusal.
    "test_eagle.py::test_eagle_golden": Checks((CONSERVATION, OWNERSHIP, HITS)),
    # vLLM 0.33's admission gates: recorded answers (refusals and free blocks), the laws.
    "test_admission_gates.py::test_admission_gates_golden": Checks(
        (CONSERVATION, OWNERSHIP, HITS)),
    # vLLM 0.33's asynchronous scheduling: recorded answers and tables (the windows' nulls on
    # the processed basis), the laws after every op.
    "test_async_scheduling.py::test_async_scheduling_golden": Checks(
        (CONSERVATION, OWNERSHIP, HITS)),
    # vLLM 0.33's worker-side block zeroing: recorded answers and drains, the laws after
    # every op (the drains judged by the guard's zeroing ledger).
    "test_block_zeroing.py::test_block_zeroing_golden": Checks(
        (CONSERVATION, OWNERSHIP, HITS)),
    "test_block_zeroing.py::test_block_zeroing_is_refused_under_vllm_010": _NONE,
    "test_eagle.py::test_eagle_with_chunked_local_attention_is_refused": _NONE,
    # vLLM 0.33's per-group EAGLE flag (capability eagle_groups): refused under vllm-0.10.
    "test_eagle.py::test_eagle_group_flag_is_refused_under_vllm_010": _NONE,
    # Hash lookahead (capability hash_lookahead): golden hits, events and Mamba boundaries
    # from vLLM 0.33.0, the combinations vLLM never makes refused.
    "test_hash_lookahead.py::test_hash_lookahead_golden": Checks((CONSERVATION, OWNERSHIP,
                                                                 HITS)),
    "test_hash_lookahead.py::test_hash_lookahead_combinations_vllm_never_makes_are_refused":
        _NONE,
    "test_hash_lookahead.py::test_hash_lookahead_past_one_beside_one_window_is_refused": _NONE,
    # Multi-module MTP (capability prefill_lookahead): golden answers and free counts from
    # vLLM 0.33.0 (the tail cached later, windows freeing later), the ValueError's refusal.
    "test_prefill_lookahead.py::test_prefill_lookahead_golden": Checks((CONSERVATION,
                                                                       OWNERSHIP, HITS)),
    "test_prefill_lookahead.py::test_prefill_lookahead_past_scheduler_block_is_refused":
        _NONE,
    # Mamba shared-prefix checkpoint (capability mamba_shared_prefix_checkpoint): golden
    # answers and free counts from vLLM 0.33.0 (the junction keyed and hit; narrowed off).
    "test_shared_prefix_checkpoint.py::test_shared_prefix_checkpoint_golden": Checks((
        CONSERVATION, OWNERSHIP, HITS)),
    "test_hybrid.py::test_partial_block_keys": Checks((CONSERVATION, OWNERSHIP, HITS)),
    # DCP and prefix_match_unit: golden answers and events from vLLM, the refusals.
    "test_hybrid.py::test_dcp_and_prefix_match_unit_golden": Checks((CONSERVATION, OWNERSHIP,
                                                                     HITS)),
    "test_hybrid.py::test_dcp_and_prefix_match_unit_layouts_vllm_refuses_are_refused": _NONE,
    # invariants
    "test_invariants.py::test_laws_hold_under_random_workloads": _WORKLOAD,
    "test_invariants.py::test_laws_hold_through_a_full_drain": _CO,
    "test_invariants.py::test_failed_allocation_leaks_nothing": Checks((CONSERVATION,),
                                                                       (EVICTION,)),
    # lookup styles (pinning_lookup) and ref-count conventions
    "test_lookup_styles.py::test_pinned_hits_are_held_until_released":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    "test_lookup_styles.py::test_refused_admission_releases_its_pins":
        Checks((CONSERVATION, HITS, EVICTION)),
    "test_lookup_styles.py::test_lookup_without_allocation_is_released":
        Checks((CONSERVATION, HITS)),
    "test_lookup_styles.py::test_two_lookups_pin_the_same_blocks":
        Checks((CONSERVATION, OWNERSHIP, HITS)),
    "test_lookup_styles.py::test_pinned_block_is_never_evicted": _ALL,
    "test_lookup_styles.py::test_cached_blocks_nobody_holds_are_free":
        Checks((CONSERVATION, OWNERSHIP)),
    # prefix caching
    "test_prefix_caching.py::test_hit_cap_is_num_tokens_minus_one": Checks((HITS,)),
    "test_prefix_caching.py::test_partial_block_never_hits": Checks((HITS,)),
    "test_prefix_caching.py::test_shared_prefix_is_shared": Checks((CONSERVATION, OWNERSHIP,
                                                                   HITS)),
    "test_prefix_caching.py::test_hits_hold_the_requested_prefix": Checks((OWNERSHIP, HITS,
                                                                          EVICTION)),
    "test_prefix_caching.py::test_own_hits_not_evicted_by_own_allocation": Checks((HITS,
                                                                                  EVICTION)),
    "test_prefix_caching.py::test_skip_reading_prefix_cache_still_writes": Checks((HITS,)),
    "test_prefix_caching.py::test_caching_disabled_never_hits": Checks((HITS,)),
    "test_prefix_caching.py::test_reset_prefix_cache": Checks((HITS, EVICTION)),
    "test_prefix_caching.py::test_duplicates_first_inserted_wins": Checks((HITS,)),
    "test_prefix_caching.py::test_decode_blocks_become_hits": Checks((HITS,)),
    "test_prefix_caching.py::test_preempted_request_readmitted_from_cache": Checks((HITS,
                                                                                   EVICTION)),
    # recorded vLLM traces, replayed with the laws and the oracle
    "test_recorded.py::test_recorded_trace_replays": _ALL,
    # slot mapping: a slot belongs to one live request unless its block is a shared prefix
    "test_slot_mapping.py::test_slot_mapping_matches_block_table": Checks((OWNERSHIP,)),
    "test_slot_mapping.py::test_flashinfer_csr_cross_check": Checks((OWNERSHIP,)),
    "test_slot_mapping.py::test_slots_unique_except_shared_prefix_blocks":
        Checks((OWNERSHIP,), (HITS,)),
    # block pool (vLLM's BlockPool level)
    "test_block_pool.py::test_t1_caching_off_free_order": Checks((CONSERVATION,)),
    "test_block_pool.py::test_t2_hashed_to_tail": Checks((EVICTION,)),
    "test_block_pool.py::test_t3_touch_then_free_refreshes_lru": Checks((EVICTION,)),
    "test_block_pool.py::test_t4_allocate_all_in_queue_order_evicts": Checks((CONSERVATION,
                                                                             EVICTION)),
    "test_block_pool.py::test_t5_duplicates_first_inserted_wins": Checks((HITS,)),
}

_WIDTH = 100  # the summary table's width
_PARAMS_RE = re.compile(r"\[.*\]$")
_CAPABILITY_RE = re.compile(r"does not declare capability ((?:'[A-Za-z0-9_]+'(?:, )?)+)")


def function_key(nodeid: str) -> str:
    """``conformance/test_x.py::test_y[impl-4]`` -> ``test_x.py::test_y`` (the ``LAW_FAMILIES``
    key: one test function, whatever its parameters)."""
    path, sep, rest = nodeid.partition("::")
    return path.replace("\\", "/").rsplit("/", 1)[-1] + sep + _PARAMS_RE.sub("", rest)


def families_of(key: str, capabilities: Iterable[str]) -> tuple[str, ...]:
    """The law families test ``key`` exercises for a design with ``capabilities`` (its
    effective ones), in ``FAMILIES`` order."""
    checks = LAW_FAMILIES.get(key, _NONE)
    found = set(checks.always) | (set(checks.caching) if CACHING in capabilities else set())
    return tuple(f for f in FAMILIES if f in found)


def unclassified(keys: Iterable[str]) -> list[str]:
    """The suite tests (``function_key`` ids) that ``LAW_FAMILIES`` does not classify and whose
    file is not in ``NO_LAW_FILES``: each must be added (with ``Checks()`` if it checks no
    law), or its law families go uncounted."""
    return sorted(k for k in set(keys)
                  if k not in LAW_FAMILIES and k.partition("::")[0] not in NO_LAW_FILES)


class GatingFacts(TypedDict, total=False):
    """The value of a suite test's ``GATING_PROPERTY`` (``collection_properties``)."""

    needs: list[str]
    generic: bool
    profiles: list[str] | None


def collection_properties(item: pytest.Item) -> list[tuple[str, GatingFacts]]:
    """The user property the plugin adds to a suite test when it is collected: the facts of
    its gating markers (``kv_capability`` names, ``kv_generic``, ``kv_profiles``), so the
    record can say why a test did not apply, on the xdist controller too (it sees reports,
    not items)."""
    needs = sorted({str(c) for mark in item.iter_markers("kv_capability") for c in mark.args})
    only = item.get_closest_marker("kv_profiles")
    facts: GatingFacts = {"needs": needs,
                          "generic": item.get_closest_marker("kv_generic") is not None,
                          "profiles": None if only is None else [str(p) for p in only.args]}
    return [(GATING_PROPERTY, facts)]


@dataclass(frozen=True)
class TestFacts:
    """One suite test's final outcome and what its reports said about it.

    Attributes:
        outcome: one of ``kvcheck.results.schema.OUTCOMES``.
        area: the suite area (``allocation``...).
        block_sizes: the block sizes of the managers it built (``kv_block_sizes``; empty when
            not recorded).
        needs: its ``kv_capability`` names; generic: it carries ``kv_generic``; profiles: its
            ``kv_profiles`` (None: any). All three from ``GATING_PROPERTY``.
        skip_reason: why pytest skipped it ("" if it was not skipped).
    """

    __test__ = False  # not a test class, though named like one

    outcome: str
    area: str
    block_sizes: frozenset[int] = frozenset()
    needs: tuple[str, ...] = ()
    generic: bool = True
    profiles: tuple[str, ...] | None = None
    skip_reason: str = ""

    @classmethod
    def from_properties(cls, outcome: str, area: str, props: Iterable[tuple[str, object]],
                        skip_reason: str = "") -> TestFacts:
        """From a report's ``user_properties`` (every entry of ``kv_block_sizes`` counts:
        a test may record it more than once)."""
        sizes: set[int] = set()
        gating: GatingFacts = {}
        for name, value in props:
            if name == BLOCK_SIZES_PROPERTY and isinstance(value, (list, tuple, set, frozenset)):
                sizes.update(v for v in value if isinstance(v, int) and not isinstance(v, bool)
                             and v >= 1)
            elif name == GATING_PROPERTY and isinstance(value, Mapping):
                # kvcheck's own property: a mapping means collection_properties wrote it
                gating = cast(GatingFacts, value)
        profiles = gating.get("profiles")
        return cls(outcome, area, frozenset(sizes), tuple(gating.get("needs") or ()),
                   bool(gating.get("generic", True)),
                   None if profiles is None else tuple(profiles), skip_reason)

    def missing(self, capabilities: frozenset[str]) -> tuple[str, ...]:
        """The capabilities it needs that the design does not have: its ``kv_capability``
        names, or those a skip by the test itself names ("does not declare capability"; not
        the oracle's, which ``--kv-oracle`` decides)."""
        missing = [c for c in self.needs if c not in capabilities]
        for kind in ("indexer", "offload"):
            if kind in missing:
                missing = [kind]  # another kind of implementation's area
        if not missing and self.outcome == "skipped" and "oracle" not in self.skip_reason:
            match = _CAPABILITY_RE.search(self.skip_reason)
            if match:
                missing = [c.strip("'") for c in match.group(1).split(", ")]
        return tuple(missing)

    def not_applicable(self, capabilities: frozenset[str], profile: str) -> str | None:
        """Why it was skipped (a ``NOT_APPLICABLE_KINDS`` entry), in the order the plugin
        gates tests (capabilities, then the generic profile, then ``kv_profiles``); None if
        it was not skipped."""
        if self.outcome != "skipped":
            return None
        if self.missing(capabilities):
            return "capability"
        if profile == "generic" and not self.generic:
            return "vllm_only"
        if self.profiles is not None and profile not in self.profiles:
            return "profile"
        reason = self.skip_reason
        if reason == "listed in --kv-skips-file":
            return "skips_file"
        if "declines" in reason or "does not support this" in reason \
                or "declares none of the" in reason:
            return "unsupported_spec"
        return "other"


@dataclass(frozen=True)
class Coverage:
    """How much one implementation's run checked (``measure``).

    Attributes:
        ran: suite tests that ran (any outcome but skipped).
        areas: area -> (tests that ran, the block sizes they ran at).
        families: law family -> the ``function_key`` ids of its tests that ran and passed.
        minimum: passed tests each family needs for "conforms" (None: no minimum binds this
            run: a vLLM profile, or no request-level manager to check laws on).
        fixes: short family -> what would add tests of it.
        undeclared: capability -> suite tests skipped for lacking it.
        not_applicable: kind (``NOT_APPLICABLE_KINDS``) -> area -> skipped tests.
        manager: the implementation has a request-level manager (the laws apply).
    """

    ran: int
    areas: dict[str, tuple[int, tuple[int, ...]]]
    families: dict[str, tuple[str, ...]]
    minimum: int | None
    fixes: dict[str, list[str]] = field(default_factory=dict)
    undeclared: dict[str, int] = field(default_factory=dict)
    not_applicable: dict[str, dict[str, int]] = field(default_factory=dict)
    manager: bool = True

    @property
    def short(self) -> list[str]:
        """The families with fewer passed tests than ``minimum`` (none without one)."""
        if self.minimum is None:
            return []
        return [f for f in FAMILIES if len(self.families.get(f, ())) < self.minimum]

    @property
    def block_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({s for _, sizes in self.areas.values() for s in sizes}))

    # ------------------------------------------------------------------ text
    def brief(self) -> str:
        """The verdict's parenthesis: ``25 tests ran at block sizes 4, 16; laws: conservation
        14, ownership 10, hit correctness 9, eviction safety 6``."""
        text = f"{self.ran} test{'s' * (self.ran != 1)} ran"
        if self.block_sizes:
            text += f" at {_sizes(self.block_sizes)}"
        if self.manager:
            text += "; laws: " + ", ".join(f"{f} {len(self.families.get(f, ()))}"
                                           for f in FAMILIES)
        return text

    def shortfall(self) -> str:
        """Why the coverage is insufficient, for the verdict: ``fewer than 3 passed tests check
        hit correctness, eviction safety (fix: declare prefix_caching)``."""
        short = self.short
        text = f"fewer than {self.minimum} passed tests check {', '.join(short)}"
        fixes = [self.fixes.get(f, []) for f in short]
        if not any(fixes):
            return text
        if all(f == fixes[0] for f in fixes):
            return f"{text} (fix: {'; '.join(fixes[0])})"
        parts = [f"{'; '.join(fix)} for {f}" for f, fix in zip(short, fixes, strict=True) if fix]
        return f"{text} (fix: {'; '.join(parts)})"

    def summary_lines(self, *, shortfall: bool = True) -> list[str]:
        """The summary's lines below the verdict: per area, per law family, the shortfall
        (``shortfall``: when the verdict is "insufficient coverage"; a failing or incomplete
        run's verdict rests on other grounds) and what was not applicable (the skips per
        reason follow them)."""
        ran = [f"{area} {n}" + (f" ({_sizes(sizes)})" if sizes else "")
               for area, (n, sizes) in self.areas.items() if n]
        lines = _wrap("  ran per area: ", ran or ["none"])
        if self.manager:
            bound = (f"{self.minimum} needed each" if self.minimum is not None
                     else "no minimum under this profile")
            lines += _wrap(f"  law families (passed tests; {bound}): ",
                           [f"{f} {len(self.families.get(f, ()))}" for f in FAMILIES])
        else:
            lines.append("  law families: not applicable (no 'manager' capability)")
        for family in self.short if shortfall else ():
            fix = "; ".join(self.fixes.get(family, [])) or "nothing declared would add tests"
            lines.append(f"  insufficient coverage: {family}: "
                         f"{len(self.families.get(family, ()))} of {self.minimum} ({fix})")
        whole = self.areas_not_run()
        for kind in NOT_APPLICABLE_KINDS:
            areas = self.not_applicable.get(kind)
            if not areas:
                continue
            n = sum(areas.values())
            # Undeclared capabilities are named with the tests each would add (a test lacking
            # two counts under both); the other kinds by area.
            if kind == "capability" and self.undeclared:
                parts = [f"{c} {k}" for c, k in self.undeclared.items()]
            else:
                parts = [f"{a} {k}" + (" (whole area)" if a in whole else "")
                         for a, k in areas.items()]
            lines += _wrap(f"  not applicable, {_KIND_TEXT[kind]}: {n} test{'s' * (n != 1)}: ",
                           parts)
        return lines

    def areas_not_run(self) -> set[str]:
        """Areas none of whose tests ran, for one reason: every test of the area that
        reported was skipped for the same ``NOT_APPLICABLE_KINDS`` entry."""
        return {a for a, (n, _) in self.areas.items()
                if n == 0 and sum(1 for by_area in self.not_applicable.values()
                                  if by_area.get(a)) == 1}

    # ------------------------------------------------------------------ record
    def as_record(self) -> RecordCoverage:
        """The record's ``coverage`` object (``kvcheck.results.schema``)."""
        return {
            "ran": self.ran,
            "block_sizes": list(self.block_sizes),
            "areas": {a: {"ran": n, "block_sizes": list(s)} for a, (n, s) in self.areas.items()},
            "families": ({f: {"passed": len(self.families.get(f, ())),
                              "tests": list(self.families.get(f, ()))} for f in FAMILIES}
                         if self.manager else {}),
            "minimum": self.minimum,
            "short": self.short,
            "fixes": {f: list(self.fixes.get(f, [])) for f in self.short},
            "undeclared_capabilities": dict(self.undeclared),
            "not_applicable": {k: dict(v) for k, v in self.not_applicable.items()},
        }


def _wrap(head: str, items: Iterable[str]) -> list[str]:
    """``head`` and the comma-separated ``items`` as lines of at most ``_WIDTH`` columns,
    broken between items only (continuations indented)."""
    glued = [item.replace(" ", "\xa0") for item in items]  # textwrap keeps \xa0 together
    lines = textwrap.wrap(head + ", ".join(glued), _WIDTH, subsequent_indent="      ",
                          break_long_words=False, break_on_hyphens=False)
    return [line.replace("\xa0", " ") for line in lines] or [head.rstrip()]


def _sizes(sizes: tuple[int, ...]) -> str:
    if len(sizes) == 1:
        return f"block size {sizes[0]}"
    if len(sizes) <= 6:
        return f"block sizes {', '.join(map(str, sizes))}"
    return f"{len(sizes)} block sizes from {sizes[0]} to {sizes[-1]}"


def measure(facts: Mapping[str, TestFacts], capabilities: frozenset[str],
            profile: str) -> Coverage:
    """The coverage of one implementation's run.

    Args:
        facts: suite test node id -> its ``TestFacts``.
        capabilities: the implementation's effective capabilities under ``profile``
            (``kvcheck.conformance.protocol.effective_capabilities``).
        profile: the active profile; a minimum per family binds ``generic`` only.
    """
    manager = "manager" in capabilities
    ran_in: dict[str, int] = {}          # area -> tests that ran
    sizes_in: dict[str, set[int]] = {}   # area -> the block sizes they ran at
    passed: dict[str, set[str]] = defaultdict(set)
    undeclared: Counter[str] = Counter()
    not_applicable: dict[str, Counter[str]] = defaultdict(Counter)
    for nodeid, test in sorted(facts.items()):
        ran_in.setdefault(test.area, 0)
        sizes_in.setdefault(test.area, set())
        kind = test.not_applicable(capabilities, profile)
        if kind is not None:
            not_applicable[kind][test.area] += 1
            undeclared.update(test.missing(capabilities))
            continue
        ran_in[test.area] += 1
        sizes_in[test.area] |= test.block_sizes
        if test.outcome in ("passed", "xpassed"):
            key = function_key(nodeid)
            for family in families_of(key, capabilities):
                passed[family].add(key)
    minimum = MIN_TESTS_PER_FAMILY if profile == "generic" and manager else None
    coverage = Coverage(
        ran=sum(ran_in.values()),
        areas={a: (n, tuple(sorted(sizes_in[a]))) for a, n in sorted(ran_in.items())},
        families={f: tuple(sorted(passed.get(f, ()))) for f in FAMILIES},
        minimum=minimum,
        undeclared=dict(sorted(undeclared.items(), key=lambda kv: (-kv[1], kv[0]))),
        not_applicable={k: dict(not_applicable[k].most_common())
                        for k in NOT_APPLICABLE_KINDS if k in not_applicable},
        manager=manager)
    fixes = {f: _fixes(f, len(coverage.families[f]), facts, capabilities, profile)
             for f in coverage.short}
    return Coverage(coverage.ran, coverage.areas, coverage.families, minimum, fixes,
                    coverage.undeclared, coverage.not_applicable, manager)


def _fixes(family: str, have: int, facts: Mapping[str, TestFacts], capabilities: frozenset[str],
           profile: str) -> list[str]:
    """What would add tests of ``family``: the capabilities whose declaration runs the most of
    its tests (greedily, until the minimum would be met), then the specs its tests declined."""
    gains: dict[frozenset[str], set[str]] = defaultdict(set)
    declined: set[str] = set()
    declined_sizes: set[int] = set()
    for nodeid, test in facts.items():
        key = function_key(nodeid)
        checks = LAW_FAMILIES.get(key, _NONE)
        if (profile == "generic" and not test.generic) or (
                test.profiles is not None and profile not in test.profiles):
            continue  # no capability makes it apply under this profile
        if family in checks.always:
            extra: set[str] = set()
        elif family in checks.caching:
            extra = {CACHING}
        else:
            continue
        missing = frozenset(test.missing(capabilities)) | (extra - capabilities)
        if missing:
            gains[missing].add(key)
        elif test.not_applicable(capabilities, profile) == "unsupported_spec":
            declined.add(key)
            declined_sizes |= test.block_sizes
    fixes: list[str] = []
    chosen: set[str] = set()
    gained: set[str] = set()
    need = MIN_TESTS_PER_FAMILY - have
    for caps, keys in sorted(gains.items(), key=lambda kv: (-len(kv[1]), len(kv[0]),
                                                              sorted(kv[0]))):
        if len(gained) >= need:
            break
        if keys <= gained:
            continue
        chosen |= caps
        gained |= keys
    if chosen:
        fixes.append(f"declare {', '.join(sorted(chosen))}")
    if declined:
        n = len(declined)
        what = (f"block size{'s' * (len(declined_sizes) != 1)} "
                f"{', '.join(map(str, sorted(declined_sizes)))}" if declined_sizes
                else "the specs they ask for")
        fixes.append(f"support {what} ({n} of its test{'s' * (n != 1)} declined "
                     f"{'them' if declined_sizes else 'theirs'})")
    return fixes
