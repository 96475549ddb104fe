"""The hybrid area (``conformance/test_hybrid.py``) has teeth: the reference passes it under
both vLLM profiles, and each hand-written single-bug hybrid mutant
(``tests/mutants/hybrid_*.py``: the reference with one per-group manager or coordinator bug)
fails the tests that own its bug: the golden scenarios, the hybrid laws of random workloads
(no oracle), the differential against the reference.

The area runs in-process (``inner_runs.run_area``) with the mutant-run settings of
``tests/mutants/test_mutants.py``: ``--kv-max-examples=15`` and no shrinking (only the verdict
matters; shrinking a multi-group workload takes minutes); a mutant's run selects only the
tests that must fail it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from inner_runs import AreaOutcome, run_area

import kvcheck.conformance

AREA_FILE = Path(kvcheck.conformance.__file__).resolve().parent / "test_hybrid.py"
MUTANTS_DIR = Path(__file__).resolve().parents[1] / "mutants"
MAX_EXAMPLES = 15

GOLDEN, LAWS, DIFFERENTIAL = ("test_hybrid_golden", "test_hybrid_laws_hold_under_random_workloads",
                              "test_hybrid_differential")
BOUNDARY_033 = "test_v033_window_hits_inside_the_window_consume_free_blocks"
BOUNDARY_010 = "test_v010_window_hits_in_the_free_queue_consume_free_blocks"
FIXED_POINT = "test_hit_length_iterates_to_a_fixed_point"
#: 0.33's partial-block keys (skipped under 0.10: one block size with caching).
PARTIAL = "test_partial_block_keys"
CROSS = "test_cross_attention_golden"
#: Encoder-decoder layouts (both profiles).
CROSS_ATTENTION = {CROSS, "test_cross_attention_with_prefix_caching_is_refused"}
MAMBA = "test_mamba_golden"
#: Mamba layouts (both profiles: 0.10.2's mode-"none" scenarios and refusals).
MAMBA_TESTS = {MAMBA, "test_mamba_layouts_vllm_refuses_are_refused"}
#: 0.33's fine-grained partial hits (skipped under 0.10: no Mamba prefix caching).
FINE = "test_fine_grained_golden"
#: DCP and prefix_match_unit: the recorded scenarios and the refusals (both profiles).
KNOBS = "test_dcp_and_prefix_match_unit_golden"
KNOB_REFUSALS = "test_dcp_and_prefix_match_unit_layouts_vllm_refuses_are_refused"
#: 0.33's boundary-state hand-offs (skipped under 0.10: no Mamba prefix caching).
OFFLOADS = "test_boundary_state_offloads_golden"
#: 0.33's Mamba prefill checkpoints and sparse Mamba retention (skipped under 0.10).
CHECKPOINTS = "test_mamba_checkpoints_golden"
#: Scenario tests both profiles run (each names the rule it checks).
SCENARIOS = {"test_every_layout_vllm_accepts_is_accepted",
             "test_groups_of_one_spec_are_searched_together",
             "test_a_window_step_needing_no_block_runs_in_a_full_pool",
             "test_chunked_local_hits_inside_the_current_chunk"}
#: 0.33's sparse retention (``prefix_cache_retention_interval``) and shared-prefix boundary.
RETENTION_033 = {"test_sparse_retention_keeps_no_block_without_a_shared_prefix",
                 "test_without_full_attention_the_groups_are_searched_in_their_order"}

#: (mutant, profile) -> the area's test functions that must each fail (others may too).
MUTANTS: dict[tuple[str, str], set[str]] = {
    # The guard refuses the null block as a new block; the golden prefills show it at once.
    ("hybrid_null_handed_out", "vllm-0.33"): {GOLDEN, LAWS, DIFFERENTIAL},
    # Window law: a null block where the window still reads (G1 row 3 frees 4 blocks).
    ("hybrid_window_off_by_one", "vllm-0.33"): {GOLDEN, LAWS, DIFFERENTIAL},
    ("hybrid_window_off_by_one", "vllm-0.10"): {GOLDEN, LAWS},
    # Hits are correct data, so no 0.33 law breaks; G2 row 4 and the oracle show the bug.
    ("hybrid_swa_hit_left_to_right", "vllm-0.33"): {GOLDEN, DIFFERENTIAL},
    # 0.10.2 keeps hits as returned: the live blocks below the window break the window law.
    ("hybrid_swa_hit_left_to_right", "vllm-0.10"): {GOLDEN, LAWS},
    # Only the free-queue order shows it (G1 row 3: 8, 7, 6).
    ("hybrid_skipped_forward_free", "vllm-0.33"): {GOLDEN, DIFFERENTIAL},
    # Hit length law (per-group lists of different lengths).
    ("hybrid_hit_length_not_common", "vllm-0.33"): {LAWS, DIFFERENTIAL},
    # One round over three or more kinds: the shrunk fixed-point scenarios, and the random
    # workloads (their layouts of three or more kinds and window_rehit rule reach it early).
    ("hybrid_hit_length_one_round", "vllm-0.33"): {FIXED_POINT, LAWS, DIFFERENTIAL},
    # Two rounds: only the scenarios whose fixed point needs a third round.
    ("hybrid_hit_length_two_rounds", "vllm-0.33"): {FIXED_POINT},
    # Window law for chunked-local groups (G4 row 4 nulls the finished chunk).
    ("hybrid_chunk_keeps_finished", "vllm-0.33"): {GOLDEN, LAWS},
    # Cross attention: the table-length law (cdiv(encoder tokens, block size) blocks) and
    # the recorded answers.
    ("hybrid_cross_sized_by_decoder", "vllm-0.33"): {CROSS, LAWS, DIFFERENTIAL},
    ("hybrid_cross_sized_by_decoder", "vllm-0.10"): {CROSS, LAWS},
    # Only a step at a full pool shows it (the recorded refusal raises instead).
    ("hybrid_cross_need_unclamped", "vllm-0.33"): {CROSS},
    # The null-block law of a cross-attention group (it skips nothing).
    ("hybrid_cross_window_nulls", "vllm-0.33"): {CROSS, LAWS, DIFFERENTIAL},
    ("hybrid_cross_window_nulls", "vllm-0.10"): {CROSS, LAWS},
    # Partial-block keys show in the KV events only: the recorded scenarios and the
    # differential (events on; the random layouts include coarse full-attention groups).
    ("hybrid_partial_every_boundary", "vllm-0.33"): {PARTIAL, DIFFERENTIAL},
    ("hybrid_partial_key_kept_on_eviction", "vllm-0.33"): {PARTIAL, DIFFERENTIAL},
    # The differential's first 15 examples show no difference (its first 30 do); the
    # recorded scenarios show the order of the two keys' events.
    ("hybrid_partial_before_full", "vllm-0.33"): {PARTIAL},
    # Mamba: the same-step refusal shows in the recorded scenario (the random workloads rarely
    # hit a state cached in the same step in their first 15 examples).
    ("hybrid_mamba_no_same_step_refusal", "vllm-0.33"): {MAMBA},
    # The align-mode law (no live state below the skipped boundary) and the recorded answers.
    ("hybrid_mamba_states_kept", "vllm-0.33"): {MAMBA, LAWS, DIFFERENTIAL},
    # Mode "none": the recorded tables (both releases); 0.10's differential draws the
    # caching-off Mamba layouts with speculative blocks in its first 15 examples.
    ("hybrid_mamba_speculative_uncounted", "vllm-0.33"): {MAMBA},
    ("hybrid_mamba_speculative_uncounted", "vllm-0.10"): {MAMBA, DIFFERENTIAL},
    # Fine-grained partial hits: the recorded scenarios (the refusal one block short, the
    # copies, the free queue after the retained blocks' release; the copy-on-write law when
    # the hit block is written into). The differential reaches each bug with random
    # workloads too, but only Mamba's whole-block hits within this run's first 15 examples
    # (a quarter of them Mamba draws, fewer fine-grained ones).
    ("hybrid_fine_no_reservation", "vllm-0.33"): {FINE},
    ("hybrid_fine_hits_whole_blocks", "vllm-0.33"): {FINE, DIFFERENTIAL},
    ("hybrid_fine_no_copy_on_write", "vllm-0.33"): {FINE},
    ("hybrid_fine_retained_reversed", "vllm-0.33"): {FINE},
    # Boundary-state hand-offs: the recorded drains; a hand-off at the wrong boundary or of a
    # block holding a later state breaks the content law of the random workloads (and the
    # golden scenarios' laws); a missing copy is a correct but short drain: the recorded
    # drains and the oracle's show it.
    ("hybrid_offload_boundary_at_block_start", "vllm-0.33"): {OFFLOADS, LAWS, DIFFERENTIAL},
    ("hybrid_offload_source_not_copy", "vllm-0.33"): {OFFLOADS, LAWS, DIFFERENTIAL},
    ("hybrid_offload_copy_not_offered", "vllm-0.33"): {OFFLOADS, DIFFERENTIAL},
    # The checkpoint keyed at its block's end: golden hits (16, not 20; the hit law alone
    # catches it too: tests/conformance/test_mamba_checkpoint_laws.py).
    ("hybrid_checkpoint_keyed_at_block_end", "vllm-0.33"): {CHECKPOINTS},
    # Sparse Mamba retention ignored: golden hits (12, not 8).
    ("hybrid_retention_keeps_every_state", "vllm-0.33"): {CHECKPOINTS},
    # Retention 0's prefill end ignored: the first chunk's answer has one block more.
    ("hybrid_checkpoint_on_every_chunk", "vllm-0.33"): {CHECKPOINTS},
    # DCP ignored: the recorded answers (5 blocks for 10 tokens, not 3), the laws (the guard
    # counts a block as block_size * dcp_world_size tokens) and the oracle, both releases.
    ("hybrid_dcp_ignored", "vllm-0.33"): {KNOBS, LAWS, DIFFERENTIAL},
    ("hybrid_dcp_ignored", "vllm-0.10"): {KNOBS, LAWS, DIFFERENTIAL},
    # prefix_match_unit ignored: the recorded events and hits (no partial-block key at the
    # unit, no fine-grained hit at 10) and the refusals (a unit vLLM rejects is taken); under
    # 0.10.2 only the refusal (no such knob there). The differential reaches it at the default
    # 40 examples, not at this file's 15 (measured on the draws of a mutant without EAGLE).
    ("hybrid_prefix_match_unit_ignored", "vllm-0.33"): {KNOBS, KNOB_REFUSALS},
    ("hybrid_prefix_match_unit_ignored", "vllm-0.10"): {KNOB_REFUSALS},
    # A Mamba group under DCP: scaled like attention under 0.33 (the recorded answers: Mamba
    # blocks of 4, no fine-grained hit at 10), fine-grained hits off at a Mamba block equal to
    # the hash block (hit 8, not 10), 0.10.2's speculative slots counted at the scaled block
    # (4 Mamba blocks, not 3).
    ("hybrid_mamba_dcp_sharded", "vllm-0.33"): {KNOBS},
    ("hybrid_mamba_dcp_no_fine_hits_at_equality", "vllm-0.33"): {KNOBS},
    ("hybrid_mamba_dcp_010_speculative_scaled", "vllm-0.10"): {KNOBS},
}

def _run_area(pytester: pytest.Pytester, impl: str, profile: str,
              only: set[str] | None = None) -> AreaOutcome:
    """Run the hybrid area on ``impl`` under ``profile`` (the mutants import as top-level
    modules of ``MUTANTS_DIR``); ``only``: just these test functions (``-k``)."""
    select = ("-k", " or ".join(sorted(only))) if only else ()
    return run_area(pytester, AREA_FILE, impl, f"--kv-profile={profile}",
                    f"--kv-max-examples={MAX_EXAMPLES}", *select, path=MUTANTS_DIR)


def test_every_hybrid_mutant_is_listed() -> None:
    """Each tests/mutants/hybrid_*.py has an entry in MUTANTS (and vice versa)."""
    files = {p.stem for p in MUTANTS_DIR.glob("hybrid_*.py")}
    assert files == {name for name, _ in MUTANTS}, (sorted(files), sorted(MUTANTS))


@pytest.mark.parametrize(("mutant", "profile"), sorted(MUTANTS))
def test_hybrid_area_fails_each_bug(pytester: pytest.Pytester, mutant: str,
                                    profile: str) -> None:
    # Only the tests that must fail run: a test the bug does not reach would spend all its
    # random examples passing, and its outcome is not asserted.
    must_fail = MUTANTS[mutant, profile]
    failed, _, _ = _run_area(pytester, mutant, profile, only=must_fail)
    assert must_fail <= failed, (
        f"{mutant} under {profile}: failing tests {sorted(failed)}; each of "
        f"{sorted(must_fail)} must fail")


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_reference_passes_hybrid_area(pytester: pytest.Pytester, profile: str) -> None:
    failed, passed, _ = _run_area(pytester, "reference", profile)
    assert not failed, failed
    # Each profile's own free-block boundary test runs (the other profile's is skipped), and
    # the fixed-point scenarios under 0.33 only (0.10.2 hybrids have two kinds).
    own = {"vllm-0.33": {BOUNDARY_033, FIXED_POINT, PARTIAL, FINE, CHECKPOINTS, OFFLOADS,
                         *RETENTION_033},
           "vllm-0.10": {BOUNDARY_010}}[profile]
    assert passed == ({GOLDEN, LAWS, DIFFERENTIAL, KNOBS, KNOB_REFUSALS} | SCENARIOS
                      | CROSS_ATTENTION | MAMBA_TESTS | own), passed
