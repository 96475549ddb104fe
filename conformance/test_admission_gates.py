"""vLLM 0.33's admission gates (capability ``admission_gates``;
docs/semantics.md#admission-gates): ``allocate_slots(..., full_sequence_must_fit,
reserved_blocks, has_scheduled_reqs)`` with a spec's ``watermark`` and
``max_in_flight_tokens`` answer as vLLM 0.33.0's own ``KVCacheManager`` did
(``kvcheck.conformance.admission_golden``): the full sequence refused although its first
chunk fits, hits counted, a sliding window's and a chunked-local group's admission cap, the
watermark for a waiting or preempted request only while another is scheduled, and the
reserved blocks. The random workloads of the differential and law tests pass the gates as
vLLM's scheduler does, for implementations declaring the capability
(``run_workload_machine(features={"admission_gates", ...})``); the full-sequence law is
``kvcheck.conformance.laws.check_full_sequence_fit``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.admission_golden import (
    RECORDED,
    SCENARIOS,
    scenario_ops,
    scenario_spec,
)
from kvcheck.conformance.golden_answers import skip_unless_declared
from kvcheck.conformance.protocol import KIND_CAPABILITIES

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("admission_gates")
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_admission_gates_golden(kv_impl: ImplHandle, kv_pair: PairFactory,
                                kv_oracle: ImplHandle, name: str) -> None:
    """Each allocation's hit tokens, new block ids (per group; None: refused) and free blocks
    after it, as vLLM 0.33.0's ``KVCacheManager`` answered them with the same gates; every
    answer also equals the oracle's when it declares ``admission_gates``."""
    spec = scenario_spec(name)
    needs = sorted({KIND_CAPABILITIES[g.kind] for g in spec.kv_cache_groups}
                   | ({"kv_cache_groups"} if spec.kv_cache_groups else set())
                   | ({"dcp"} if spec.dcp_world_size > 1 else set()))
    skip_unless_declared(kv_impl, needs)
    pair = kv_pair(spec, with_oracle=kv_oracle.has("admission_gates"))
    answers = iter(RECORDED[name])
    for i, (op, answers_it) in enumerate(scenario_ops(name)):
        got = pair.apply(op)
        if not answers_it:
            continue
        _, want_hit, want_new, want_free = next(answers)
        num_hit = got["hits"][1] if "hits" in got else 0
        new = got.get("new")
        free_now = pair.impl.manager.num_free_blocks()
        assert (num_hit, new, free_now) == (want_hit, want_new, want_free), (
            f"{name}, op #{i + 1} {op}: answered {num_hit} hit tokens, new blocks {new}, "
            f"{free_now} free; vLLM 0.33.0 {want_hit}, {want_new}, {want_free} (new block ids "
            "per group, None: refused)\n" + pair.impl.snippet())
    assert next(answers, None) is None, f"{name}: fewer allocations than recorded"
