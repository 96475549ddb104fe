"""vLLM 0.33's asynchronous scheduling in the KV-cache manager (capability
``async_scheduling``) has teeth: the reference passes the area
(``conformance/test_async_scheduling.py``) under vllm-0.33, and each hand-written single-bug
mutant (``tests/mutants/async_*.py``) fails the tests that own its bug: the golden scenarios
recorded from vLLM 0.33.0 (with the laws after every op) and the random workloads' window
laws, which judge the tables on the processed basis. Random workloads schedule
asynchronously only for an implementation declaring the capability, under vllm-0.33.

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
from kvcheck.conformance.ops import Op
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.conformance.workload_machine import run_workload_machine

PROFILE = "vllm-0.33"

#: (suite file, test function) the mutants must fail.
GOLDEN = ("test_async_scheduling.py", "test_async_scheduling_golden")
HYBRID_LAWS = ("test_hybrid.py", "test_hybrid_laws_hold_under_random_workloads")

#: mutant -> the suite tests that must each fail under vllm-0.33 (others may too).
MUTANTS: dict[str, set[tuple[str, str]]] = {
    # Windows freed at the optimistic count: the recorded tables, the window law (a block
    # the window still needs on the processed basis is the null block).
    "async_free_optimistic": {GOLDEN, HYBRID_LAWS},
    # A producer's tail finalized with tokens in flight: the recorded tails, the law.
    "async_finalize_in_flight": {GOLDEN},
}


def test_every_async_mutant_is_listed() -> None:
    """Each tests/mutants/async_*.py has an entry in MUTANTS (and vice versa)."""
    assert_mutants_listed("async_", MUTANTS)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_async_tests_fail_each_bug(pytester: pytest.Pytester, mutant: str) -> None:
    assert_mutant_fails(pytester, mutant, MUTANTS[mutant], PROFILE)


def test_reference_passes_async_area(pytester: pytest.Pytester) -> None:
    failed, passed, _ = run_suite_file(pytester, "test_async_scheduling.py", "reference",
                                       PROFILE)
    assert not failed, f"reference fails the async-scheduling area: {sorted(failed)}"
    assert "test_async_scheduling_golden" in passed


def test_random_workloads_schedule_asynchronously() -> None:
    """Derandomized random workloads with ``async_scheduling`` (the reference on both sides)
    run engines with and without it; with it a running request's steps pass the previous
    step's tokens as ``num_in_flight_tokens`` (never more than it has computed) and frees
    pass them as ``in_flight``; under vllm-0.10 (as without the capability) none does."""
    reference = load_impl("reference")
    quick = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                     phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                     print_blob=False)

    def run(on: bool, profile: str = PROFILE) -> list[Op]:
        pairs: list[Pair] = []

        def make(**fields: Any) -> Pair:
            pairs.append(Pair(reference, reference, KVCacheSpec(profile=profile, **fields)))
            return pairs[-1]

        run_workload_machine(make, quick, None, extras=False, events=False, impl=reference,
                             profile=profile, stats=Counter(),
                             group_kinds=("full_attention", "sliding_window"),
                             features={"async_scheduling"} if on else ())
        return [op for p in pairs for op in p.ops]

    ops = run(True)
    steps = [op for op in ops if op["op"] in ("schedule", "decode") and "gates" in op
             and "num_in_flight_tokens" in op["gates"]]  # type: ignore[typeddict-item]
    assert steps, "no step passed num_in_flight_tokens"
    assert any(op["op"] == "decode" for op in steps)
    assert any(op["op"] == "free" and op.get("in_flight") for op in ops)
    without = run(True, "vllm-0.10")  # as without the capability: never drawn
    assert not any("num_in_flight_tokens" in op.get("gates", {})  # type: ignore[attr-defined]
                   or op.get("in_flight") for op in without)
