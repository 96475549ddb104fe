"""Hash lookahead (capability ``hash_lookahead``) has teeth: the reference passes the area
(``conformance/test_hash_lookahead.py``) under vllm-0.33, and each hand-written single-bug
mutant (``tests/mutants/hash_lookahead_*.py``: the reference with one bug in its lookahead
hashing or events) fails the tests that own its bug: the golden scenarios recorded from vLLM
0.33.0 and the differential against the reference, whose random workloads draw
``num_hash_lookahead_tokens``.

Each run is in-process (``inner_runs.run_suite_file``) with the mutant-run settings of
``tests/mutants/test_mutants.py``: ``--kv-max-examples=15`` and no shrinking.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from inner_runs import assert_mutant_fails, assert_mutants_listed, run_suite_file

from kvcheck.conformance.differential import Pair
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.conformance.workload_machine import run_workload_machine

PROFILE = "vllm-0.33"

#: (suite file, test function) the mutants must fail.
GOLDEN = ("test_hash_lookahead.py", "test_hash_lookahead_golden")
DIFFERENTIAL = ("test_differential.py", "test_random_workloads_match_reference")

#: mutant -> the suite tests that must each fail under vllm-0.33 (others may too).
MUTANTS: dict[str, set[tuple[str, str]]] = {
    # Hashes differ from the oracle's; a request diverging in the lookahead token hits.
    "hash_lookahead_not_in_key": {GOLDEN, DIFFERENTIAL},
    # A block hashed, cached and hit before its lookahead tokens exist. The lookahead hit cap
    # (a law) catches it too, but only past these 15 examples (at 30 here).
    "hash_lookahead_hashed_early": {GOLDEN, DIFFERENTIAL},
    # BlockStored without lookahead_token_ids (the recorded events, the oracle's events).
    "hash_lookahead_event_without_tokens": {GOLDEN, DIFFERENTIAL},
}



def test_every_hash_lookahead_mutant_is_listed() -> None:
    """Each tests/mutants/hash_lookahead_*.py has an entry in MUTANTS (and vice versa)."""
    assert_mutants_listed("hash_lookahead_", MUTANTS)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_hash_lookahead_tests_fail_each_bug(pytester: pytest.Pytester, mutant: str) -> None:
    assert_mutant_fails(pytester, mutant, MUTANTS[mutant], PROFILE)


def test_reference_passes_hash_lookahead_area(pytester: pytest.Pytester) -> None:
    failed, passed, _ = run_suite_file(pytester, "test_hash_lookahead.py", "reference", PROFILE)
    assert not failed, f"reference fails the hash lookahead area: {sorted(failed)}"
    assert "test_hash_lookahead_golden" in passed


@pytest.mark.parametrize("group_kinds", [(), ("full_attention", "sliding_window", "mamba")],
                         ids=["single", "groups"])
def test_random_workloads_draw_hash_lookahead(group_kinds: tuple[str, ...]) -> None:
    """Derandomized random workloads with ``hash_lookahead`` (the reference on both sides) run
    engines with ``num_hash_lookahead_tokens`` 1 to 3, never with ``use_eagle`` or caching off
    beside it, and engines without it too; without ``hash_lookahead`` none is drawn."""
    reference = load_impl("reference")
    quick = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                     phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                     print_blob=False)

    def run(hash_lookahead: bool) -> list[KVCacheSpec]:
        specs: list[KVCacheSpec] = []

        def make(**fields: Any) -> Pair:
            spec = KVCacheSpec(profile=PROFILE, **fields)
            specs.append(spec)
            return Pair(reference, reference, spec)

        run_workload_machine(make, quick, None, extras=False, events=True, impl=reference,
                             profile=PROFILE, stats=Counter(), group_kinds=group_kinds,
                             features={"eagle", *(("hash_lookahead",) if hash_lookahead else ())})
        return specs

    specs = run(True)
    drawn = {s.num_hash_lookahead_tokens for s in specs}
    # Which of 1..3 a derandomized run reaches is Hypothesis's choice: at least two, and 0.
    assert 0 in drawn and len(drawn - {0}) >= 2 and drawn <= {0, 1, 2, 3}, (
        f"lookahead values drawn: {sorted(drawn)}")
    assert not [s for s in specs if s.num_hash_lookahead_tokens
                and (s.use_eagle or not s.enable_caching)], "L with use_eagle or caching off"
    assert not any(s.num_hash_lookahead_tokens for s in run(False))
