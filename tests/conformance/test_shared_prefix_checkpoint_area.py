"""The Mamba shared-prefix checkpoint (capability ``mamba_shared_prefix_checkpoint``) has teeth:
each hand-written single-bug mutant (``tests/mutants/shared_prefix_*.py``: the reference with
one bug in the constructor's narrowing or in the Mamba group's junction key) fails the golden
scenarios recorded from vLLM 0.33.0 (``conformance/test_shared_prefix_checkpoint.py``) that own
its bug. The reference passes that file in the suite's own run; the random workloads' rule
``junction_share`` catches ``shared_prefix_junction_ignored`` too, outside this file's budget
(an inner differential run costs far more than the golden one).

Each run is in-process (``inner_runs.run_suite_file``) with the mutant-run settings of
``tests/mutants/test_mutants.py``. vLLM 0.10.2 has no such flag: everything runs under
``vllm-0.33``.
"""

from __future__ import annotations

import pytest
from inner_runs import assert_mutant_fails, assert_mutants_listed

PROFILE = "vllm-0.33"

#: (suite file, test function) the mutants must fail.
GOLDEN = ("test_shared_prefix_checkpoint.py", "test_shared_prefix_checkpoint_golden")

#: mutant -> the suite tests that must each fail under vllm-0.33 (others may too).
MUTANTS: dict[str, set[tuple[str, str]]] = {
    # Kept without an EAGLE group: the next sibling hits 12 tokens, not 8.
    "shared_prefix_not_narrowed": {GOLDEN},
    # Narrowed on use_eagle: a flagged group without it loses the junction (8, not 12).
    "shared_prefix_use_eagle_only": {GOLDEN},
    # The junction never keyed: the next sibling hits 8 tokens, not 12.
    "shared_prefix_junction_ignored": {GOLDEN},
}


def test_every_shared_prefix_mutant_is_listed() -> None:
    """Each tests/mutants/shared_prefix_*.py has an entry in MUTANTS (and vice versa)."""
    assert_mutants_listed("shared_prefix_", MUTANTS)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_shared_prefix_tests_fail_each_bug(pytester: pytest.Pytester, mutant: str) -> None:
    assert_mutant_fails(pytester, mutant, MUTANTS[mutant], PROFILE)
