"""vLLM 0.33's worker-side block zeroing (capability ``block_zeroing``;
docs/semantics.md#worker-side-block-zeroing): with ``needs_kv_cache_zeroing`` every
attention block handed out fresh is drained once by ``take_new_block_ids`` before its first
use (``kvcheck.conformance.block_zeroing``, judged by the guard at every drain), never a hit
nor a Mamba group's block, nor the external blocks an asynchronous load writes in the groups
named in ``skip_zeroing_group_ids``; a failed load's blocks are recorded again
(``record_blocks_for_zeroing``). The answers of vLLM 0.33.0's ``KVCacheManager``
(``kvcheck.conformance.block_zeroing_golden``) are replayed here; the random workloads of the
differential and law tests draw the spec knob for implementations declaring the capability
(``run_workload_machine(features={"block_zeroing", ...})``), and the external-KV random
workloads draw it with skipped groups on asynchronous loads (``test_external_kv.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.block_zeroing_golden import (
    RECORDED,
    SCENARIOS,
    scenario_ops,
    scenario_spec,
)
from kvcheck.conformance.fine_grained import fine_grained_hits
from kvcheck.conformance.golden_answers import skip_unless_declared
from kvcheck.conformance.protocol import group_capabilities

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("block_zeroing")
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_block_zeroing_golden(kv_impl: ImplHandle, kv_pair: PairFactory,
                              kv_oracle: ImplHandle, name: str) -> None:
    """Each allocation's new block ids (per group; None: refused) and the ids
    ``take_new_block_ids`` drained right after it, as vLLM 0.33.0's ``KVCacheManager``
    answered them; every answer also equals the oracle's when it declares
    ``block_zeroing``."""
    spec = scenario_spec(name)
    needs = sorted(group_capabilities(spec)
                   | ({"external_kv"} if any(op.get("external")
                                             for op, _ in scenario_ops(name)) else set())
                   | ({"fine_grained_hits"} if fine_grained_hits(spec) else set()))
    skip_unless_declared(kv_impl, needs)
    pair = kv_pair(spec, with_oracle=kv_oracle.has("block_zeroing"))
    answers = iter(RECORDED[name])
    for i, (op, answers_it) in enumerate(scenario_ops(name)):
        drained = len(pair.impl.zeroed)
        got = pair.apply(op)
        if not answers_it:
            continue
        want_new, want_zeroed = next(answers)
        zeroed = pair.impl.zeroed[-1] if len(pair.impl.zeroed) > drained else None
        assert (got.get("new"), zeroed) == (want_new, want_zeroed), (
            f"{name}, op #{i + 1} {op}: answered new blocks {got.get('new')}, drained "
            f"{zeroed}; vLLM 0.33.0 {want_new}, {want_zeroed} (new block ids per group, None: "
            "refused; then take_new_block_ids())\n" + pair.impl.snippet())
    assert next(answers, None) is None, f"{name}: fewer allocations than recorded"


@pytest.mark.kv_profiles("vllm-0.10")
@pytest.mark.kv_capability("block_zeroing")
def test_block_zeroing_is_refused_under_vllm_010(kv_impl: ImplHandle) -> None:
    """vLLM 0.10.2 has no worker-side zeroing: an implementation declaring ``block_zeroing``
    under several profiles refuses a spec with ``needs_kv_cache_zeroing`` under ``vllm-0.10``
    (``UnsupportedSpec`` or a misuse error naming the field), never runs it as if zeroing
    were off."""
    spec = scenario_spec("single_group", profile="vllm-0.10")
    with pytest.raises(Exception) as refused:  # noqa: PT011 - the message is checked below
        kv_impl.make_manager(spec)
    text = str(refused.value)
    assert "needs_kv_cache_zeroing" in text, (
        f"{kv_impl.name} refused needs_kv_cache_zeroing under vllm-0.10 without naming it: "
        f"{type(refused.value).__name__}: {text}")
