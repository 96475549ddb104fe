"""vLLM 0.33's admission gates (capability ``admission_gates``) have teeth: the reference
passes the area (``conformance/test_admission_gates.py``) under vllm-0.33, and each
hand-written single-bug mutant (``tests/mutants/admission_*.py``: the reference with one bug
in its gates) fails the tests that own its bug: the golden scenarios recorded from vLLM
0.33.0, the full-sequence law, and the differentials against the reference, whose random
workloads pass the gates as vLLM's scheduler does. Random workloads draw the gates only for
an implementation declaring the capability, under vllm-0.33.

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
GOLDEN = ("test_admission_gates.py", "test_admission_gates_golden")
LAWS = ("test_invariants.py", "test_laws_hold_under_random_workloads")
DIFFERENTIAL = ("test_differential.py", "test_random_workloads_match_reference")
HYBRID_DIFFERENTIAL = ("test_hybrid.py", "test_hybrid_differential")

#: mutant -> the suite tests that must each fail under vllm-0.33 (others may too).
MUTANTS: dict[str, set[tuple[str, str]]] = {
    # The recorded window admissions refused; the oracle admits them (windows: groups only).
    "admission_no_cap": {GOLDEN, HYBRID_DIFFERENTIAL},
    # The recorded decode steps refused beside the watermark; the oracle's answers.
    "admission_watermark_on_running": {GOLDEN, DIFFERENTIAL, HYBRID_DIFFERENTIAL},
    # The recorded refusals with reserved blocks admitted; the oracle's answers.
    "admission_reserved_ignored": {GOLDEN, DIFFERENTIAL, HYBRID_DIFFERENTIAL},
    # The full sequence not checked: the recorded refusals, the full-sequence law, the oracle.
    "admission_first_chunk_only": {GOLDEN, LAWS, DIFFERENTIAL, HYBRID_DIFFERENTIAL},
}



def test_every_admission_mutant_is_listed() -> None:
    """Each tests/mutants/admission_*.py has an entry in MUTANTS (and vice versa)."""
    assert_mutants_listed("admission_", MUTANTS)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_admission_tests_fail_each_bug(pytester: pytest.Pytester, mutant: str) -> None:
    assert_mutant_fails(pytester, mutant, MUTANTS[mutant], PROFILE)


def test_reference_passes_admission_area(pytester: pytest.Pytester) -> None:
    failed, passed, _ = run_suite_file(pytester, "test_admission_gates.py", "reference", PROFILE)
    assert not failed, f"reference fails the admission-gate area: {sorted(failed)}"
    assert "test_admission_gates_golden" in passed


@pytest.mark.parametrize("group_kinds", [(), ("full_attention", "sliding_window",
                                              "chunked_local_attention")],
                         ids=["single", "groups"])
def test_random_workloads_pass_the_gates(group_kinds: tuple[str, ...]) -> None:
    """Derandomized random workloads with ``admission_gates`` (the reference on both sides)
    run engines with and without the gates; with them every admission (a request holding no
    blocks) passes ``full_sequence_must_fit=True`` and ``has_scheduled_reqs`` False exactly
    when no other request runs, and watermarks and ``max_in_flight_tokens`` are drawn;
    without the capability, or under vllm-0.10, no gate and no such field is drawn."""
    reference = load_impl("reference")
    quick = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                     phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                     print_blob=False)

    def run(gates: bool, profile: str = PROFILE) -> tuple[list[KVCacheSpec], list[Op]]:
        specs: list[KVCacheSpec] = []
        pairs: list[Pair] = []

        def make(**fields: Any) -> Pair:
            spec = KVCacheSpec(profile=profile, **fields)
            specs.append(spec)
            pairs.append(Pair(reference, reference, spec))
            return pairs[-1]

        run_workload_machine(make, quick, None, extras=False, events=True, impl=reference,
                             profile=profile, stats=Counter(), group_kinds=group_kinds,
                             features={"admission_gates"} if gates else ())
        return specs, [op for p in pairs for op in p.ops]

    specs, ops = run(True)
    gated = [op for op in ops if op["op"] == "schedule" and "gates" in op]
    assert gated and all(op["gates"]["full_sequence_must_fit"] is True  # type: ignore[typeddict-item]
                         for op in gated), "no admission passed full_sequence_must_fit"
    assert any("reserved_blocks" in op["gates"] for op in gated)  # type: ignore[typeddict-item]
    assert any(op["gates"].get("has_scheduled_reqs") is False  # type: ignore[typeddict-item]
               for op in gated)
    assert any(s.watermark for s in specs) and any(s.max_in_flight_tokens for s in specs)
    assert any(not s.watermark and s.max_in_flight_tokens is None for s in specs)
    for without in (run(False), run(True, "vllm-0.10")):
        assert not any("gates" in op for op in without[1])
        assert not any(s.watermark or s.max_in_flight_tokens for s in without[0])
