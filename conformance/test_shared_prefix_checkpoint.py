"""vLLM 0.33's Mamba shared-prefix checkpoint (capability ``mamba_shared_prefix_checkpoint``,
``KVCacheSpec.mamba_shared_prefix_checkpoint``; docs/semantics.md#the-shared-prefix-checkpoint):
with an EAGLE group and fine-grained hits, a Mamba "align" group keys its state where a chunk
ends at the request's shared-prefix boundary, and a sibling sharing the prefix hits it; vLLM
drops the flag without an error in the layouts it does not apply to
(``kvcheck.conformance.shared_prefix_golden``, recorded from vLLM 0.33.0's own
``KVCacheManager``). The random workloads of the differential and law tests draw the flag too,
for implementations declaring the capability
(``run_workload_machine(features={"mamba_shared_prefix_checkpoint", ...})``), with a rule
that prefills a sibling a hash block a step so one chunk ends at its junction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.golden_answers import (
    assert_answers,
    assert_free_queue,
    skip_unless_declared,
)
from kvcheck.conformance.shared_prefix_golden import SCENARIOS, SharedPrefixScenario

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle

CAPABILITY = "mamba_shared_prefix_checkpoint"


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability(CAPABILITY, "fine_grained_hits")
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda sc: sc.name)
def test_shared_prefix_checkpoint_golden(kv_impl: ImplHandle, kv_pair: PairFactory,
                                         kv_oracle: ImplHandle,
                                         sc: SharedPrefixScenario) -> None:
    """Each op's answer as vLLM 0.33.0's own ``KVCacheManager`` gave it (the junction state
    keyed and hit through a copy-on-write block where the flag is kept; the hit stopping at
    the block boundary where it is off or narrowed off), the free count after each op and the
    free queue after the last; every op's answers and observables also equal the oracle's
    when it declares the capability."""
    needs = {"eagle"} if sc.use_eagle else set()
    if any(g.is_eagle_group for g in sc.groups):
        needs.add("eagle_groups")
    if sc.prefill_lookahead:
        needs.add("prefill_lookahead")
    skip_unless_declared(kv_impl, needs)
    pair = kv_pair(num_blocks=sc.num_blocks, block_size=4, kv_cache_groups=sc.groups,
                   use_eagle=sc.use_eagle, num_prefill_lookahead=sc.prefill_lookahead,
                   mamba_shared_prefix_checkpoint=sc.flag, with_oracle=kv_oracle.has(CAPABILITY))
    where = f"{sc.name} ({sc.why})"
    assert_answers(pair, where, sc.ops, sc.recorded.answers, sc.recorded.num_free)
    assert_free_queue(pair, where, sc.recorded.free_queue)
