"""Multi-module MTP (capability ``prefill_lookahead``) has teeth: the reference passes the area
(``conformance/test_prefill_lookahead.py``), and each hand-written single-bug mutant
(``tests/mutants/mtp_*.py``: the reference with one bug in its re-prefillable tail or a
window's extra retention) fails the tests that own its bug: the golden scenarios recorded from
vLLM 0.33.0, and where the first random examples reach it, the laws (a hit block no request
computed ``K - 1`` tokens past) and the differentials against the reference, whose random
workloads draw ``num_prefill_lookahead``.

Each run is in-process (``inner_runs.run_suite_file``) with the mutant-run settings of
``tests/mutants/test_mutants.py``: ``--kv-max-examples=15`` and no shrinking. vLLM 0.10.2 has
no multi-module MTP: everything runs under ``vllm-0.33``.
"""

from __future__ import annotations

import pytest
from inner_runs import assert_mutant_fails, assert_mutants_listed, run_suite_file

PROFILE = "vllm-0.33"

#: (suite file, test function) the mutants must fail.
GOLDEN = ("test_prefill_lookahead.py", "test_prefill_lookahead_golden")
LAWS = ("test_invariants.py", "test_laws_hold_under_random_workloads")
DIFFERENTIAL = ("test_differential.py", "test_random_workloads_match_reference")
HYBRID_DIFFERENTIAL = ("test_hybrid.py", "test_hybrid_differential")

#: mutant -> the suite tests that must each fail under vllm-0.33 (others may too).
MUTANTS: dict[str, set[tuple[str, str]]] = {
    # A 12-token prompt's third block hits at once (12 tokens, not 8); the MTP hit law.
    "mtp_tail_cached": {GOLDEN, LAWS, DIFFERENTIAL},
    # K tokens held back, not K - 1: the recorded hit of 12 tokens is 8.
    "mtp_tail_off_by_one": {GOLDEN, DIFFERENTIAL},
    # The recorded free counts (14 free, not 13) and the multi-group oracle's tables.
    "mtp_window_no_extra_retention": {GOLDEN, HYBRID_DIFFERENTIAL},
    # One Mamba "align" group alone keying its state without the lag: the recorded sibling
    # hit (12 tokens, not none).
    "mtp_mamba_alone_no_lag": {GOLDEN},
}



def test_every_mtp_mutant_is_listed() -> None:
    """Each tests/mutants/mtp_*.py has an entry in MUTANTS (and vice versa)."""
    assert_mutants_listed("mtp_", MUTANTS)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_prefill_lookahead_tests_fail_each_bug(pytester: pytest.Pytester, mutant: str) -> None:
    assert_mutant_fails(pytester, mutant, MUTANTS[mutant], PROFILE)


def test_reference_passes_prefill_lookahead_area(pytester: pytest.Pytester) -> None:
    failed, passed, _ = run_suite_file(pytester, "test_prefill_lookahead.py", "reference", PROFILE)
    assert not failed, f"reference fails the multi-module MTP area: {sorted(failed)}"
    assert {"test_prefill_lookahead_golden",
            "test_prefill_lookahead_past_scheduler_block_is_refused"} <= passed
