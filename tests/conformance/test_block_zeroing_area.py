"""vLLM 0.33's worker-side block zeroing (capability ``block_zeroing``) has teeth: the
reference passes the area (``conformance/test_block_zeroing.py``; the shared complete
reference run of ``tests/kv_helpers.py`` shows it), and each hand-written single-bug mutant
(``tests/mutants/zeroing_*.py``: the reference with one bug in what it records for zeroing)
fails the tests that own its bug: the golden scenarios recorded
from vLLM 0.33.0 and, for a bug the random workloads reach, the differential, where the
guard's zeroing ledger judges every drain. Random workloads draw ``needs_kv_cache_zeroing``
only for an implementation declaring the capability, under vllm-0.33.

Each run is in-process (``inner_runs.run_suite_file``) with the mutant-run settings of
``tests/mutants/test_mutants.py``: ``--kv-max-examples=15`` and no shrinking.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, settings
from inner_runs import assert_mutant_fails, assert_mutants_listed

from kvcheck.conformance.block_zeroing import ZeroingLedger
from kvcheck.conformance.differential import Pair
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec
from kvcheck.conformance.workload_machine import run_workload_machine

PROFILE = "vllm-0.33"

#: (suite file, test function) the mutants must fail.
GOLDEN = ("test_block_zeroing.py", "test_block_zeroing_golden")
DIFFERENTIAL = ("test_differential.py", "test_random_workloads_match_reference")

#: mutant -> the suite tests that must each fail under vllm-0.33 (others may too).
MUTANTS: dict[str, set[tuple[str, str]]] = {
    # The recorded drains list b's hits; the guard's ledger rejects a hit in random drains.
    "zeroing_hits_recorded": {GOLDEN, DIFFERENTIAL},
    # The recorded asynchronous loads' blocks drained although their groups were skipped.
    "zeroing_skip_ignored": {GOLDEN},
    # The recorded Mamba layouts drain the Mamba group's blocks too.
    "zeroing_mamba_recorded": {GOLDEN},
}


def test_every_zeroing_mutant_is_listed() -> None:
    """Each tests/mutants/zeroing_*.py has an entry in MUTANTS (and vice versa)."""
    assert_mutants_listed("zeroing_", MUTANTS)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_zeroing_tests_fail_each_bug(pytester: pytest.Pytester, mutant: str) -> None:
    assert_mutant_fails(pytester, mutant, MUTANTS[mutant], PROFILE)


def test_ledger_names_what_a_drain_gets_wrong() -> None:
    """The guard's ledger (``ZeroingLedger``): a window group and a Mamba group beside full
    attention; only the attention groups owe their new blocks, a skipped group not its
    external ones; a drain missing a block, listing one more, or out of group order is named;
    every drain empties the ledger."""
    spec = KVCacheSpec(num_blocks=32, block_size=4, needs_kv_cache_zeroing=True,
                       kv_cache_groups=(KVCacheGroupSpec("full_attention", 4),
                                        KVCacheGroupSpec("sliding_window", 4, sliding_window=8),
                                        KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")))
    ledger = ZeroingLedger(spec)
    # An admission with 8 external tokens (2 blocks per attention group) and 4 new tokens.
    tables = [[1, 2, 3], [4, 5, 6], [7, 8]]
    ledger.allocated("a", tables, tables, 0, 8, skip=[0])
    assert ledger.drain([3, 4, 5, 6]) is None
    assert ledger.drain([]) is None  # drained once
    ledger.allocated("a", [[1, 2, 3, 9], [0, 5, 6, 10], [7, 8]], [[9], [10], []], 12, 0, [])
    missing = ledger.drain([9])
    assert missing is not None and "block 10" in missing and "'a'" in missing
    ledger.allocated("b", [[11]], [[11], [], []], 0, 0, [])
    extra = ledger.drain([11, 1])
    assert extra is not None and "block 1 is listed 1 time(s)" in extra
    ledger.allocated("b", [[11, 12], [13]], [[12], [13], []], 4, 0, [])
    order = ledger.drain([13, 12])
    assert order is not None and "group by group" in order
    ledger.recorded("a", [[1, 2, 3, 9], [0, 5, 6, 10], [7, 8]], 8)
    assert ledger.drain([3, 9, 6, 10]) is None  # from token 8 on, nulls included


def test_random_workloads_draw_zeroing_only_when_declared() -> None:
    """Derandomized random workloads with ``block_zeroing`` (the reference on both sides) run
    engines with and without ``needs_kv_cache_zeroing``, and with it drain after every
    allocation, some drains non-empty; without the capability, or under vllm-0.10, no engine
    asks for zeroing."""
    reference = load_impl("reference")
    quick = settings(max_examples=10, deadline=None, derandomize=True, database=None,
                     phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                     print_blob=False)

    def run(zeroing: bool, profile: str = PROFILE) -> list[Pair]:
        pairs: list[Pair] = []

        def make(**fields: object) -> Pair:
            pairs.append(Pair(reference, reference, KVCacheSpec(profile=profile,
                                                                **fields)))  # type: ignore[arg-type]
            return pairs[-1]

        run_workload_machine(make, quick, None, extras=False, events=False, impl=reference,
                             profile=profile, stats=Counter(),
                             group_kinds=("full_attention", "sliding_window", "mamba"),
                             features={"block_zeroing"} if zeroing else ())
        return pairs

    pairs = run(True)
    zeroing = [p for p in pairs if p.spec.needs_kv_cache_zeroing]
    assert zeroing and len(zeroing) < len(pairs)
    assert any(d for p in zeroing for d in p.impl.zeroed)
    assert not any(p.impl.zeroed for p in pairs if not p.spec.needs_kv_cache_zeroing)
    for without in (run(False), run(True, "vllm-0.10")):
        assert not any(p.spec.needs_kv_cache_zeroing for p in without)
