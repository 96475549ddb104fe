"""vLLM 0.33's asynchronous scheduling in the KV-cache manager (capability
``async_scheduling``; docs/semantics.md#asynchronous-scheduling): ``allocate_slots(...,
num_in_flight_tokens=k)`` frees the blocks a sliding window, a finished chunk or a Mamba
"align" group skips on the processed-token basis (``computed - k``), and
``finalize_partial_tail_offloads(request, num_in_flight_tokens=k)`` finalizes no boundary
state while ``k > 0``, as vLLM 0.33.0's own ``KVCacheManager`` did
(``kvcheck.conformance.async_scheduling_golden``). The random workloads of the differential
and law tests schedule asynchronously in some engines for implementations declaring the
capability (``run_workload_machine(features={"async_scheduling", ...})``); the window laws
then judge the tables on the processed basis (``kvcheck.conformance.laws``: a block an
in-flight step reads is never the null block).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.async_scheduling_golden import (
    ASYNC_SCENARIOS,
    MISSING_010,
    AsyncScenario,
)
from kvcheck.conformance.golden_answers import skip_unless_declared
from kvcheck.conformance.laws import check_laws
from kvcheck.conformance.protocol import KIND_CAPABILITIES, VLLM_PROFILES

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle


def _needs(sc: AsyncScenario) -> list[str]:
    """The capabilities a scenario's layout needs besides ``async_scheduling``: its group
    kinds', and a KV producer's tail (a Mamba "align" group larger than the hash block)
    ``fine_grained_hits`` and ``boundary_state_offloads``."""
    needs = {"kv_cache_groups", *(KIND_CAPABILITIES[g.kind] for g in sc.groups)}
    if any(g.kind == "mamba" and (g.block_size or 4) > 4 for g in sc.groups):
        needs |= {"fine_grained_hits", "boundary_state_offloads"}
    return sorted(needs)


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("async_scheduling")
@pytest.mark.parametrize("sc", ASYNC_SCENARIOS, ids=lambda sc: sc.name)
def test_async_scheduling_golden(kv_impl: ImplHandle, kv_pair: PairFactory,
                                 kv_oracle: ImplHandle, kv_profile: str,
                                 sc: AsyncScenario) -> None:
    """Each op's answer and its request's block tables after it (the windows' nulls: which
    blocks were freed on the processed basis), and every partial tail finalized, as vLLM
    0.33.0's ``KVCacheManager`` gave them with the same tokens in flight; the laws hold
    after every op and, when the oracle declares the capability, every answer equals its."""
    if kv_profile == "vllm-0.10":
        pytest.skip(f"{sc.name}: {MISSING_010}")
    skip_unless_declared(kv_impl, _needs(sc))
    pair = kv_pair(num_blocks=sc.num_blocks, block_size=4, kv_cache_groups=sc.groups,
                   with_oracle=kv_oracle.has("async_scheduling"))
    for i, (op, (want, want_tables)) in enumerate(zip(sc.ops, sc.answers, strict=True)):
        got = pair.apply(op)
        rid = op.get("rid")
        tables = (pair.impl.manager.get_block_ids_per_group(rid)
                  if rid in pair.impl.running else None)
        assert (got, tables) == (want, want_tables), (
            f"{sc.name} ({sc.why}), op #{i + 1} {op}: answered {got} with tables {tables}; "
            f"vLLM 0.33 {want} with tables {want_tables} (hits and new block ids per group, "
            "0 the null block; new None: refused)\n" + pair.impl.snippet())
        problems = check_laws(pair.impl)
        assert not problems, (f"{sc.name}, op #{i + 1} {op}: " + "; ".join(problems) + "\n"
                              + pair.impl.snippet())
    assert tuple(pair.impl.finalized_tails) == sc.tails, (
        f"{sc.name} ({sc.why}): partial tails finalized {pair.impl.finalized_tails}, vLLM 0.33 "
        f"{list(sc.tails)}\n" + pair.impl.snippet())
