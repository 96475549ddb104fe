"""The random workloads keep asynchronous scheduling off the layouts where vLLM 0.33.0 keys a
stale Mamba checkpoint state (``workload_machine.async_keys_stale_checkpoints``: a Mamba
"align" group with prefill checkpoint blocks under hash lookahead ``L >= 2``;
docs/semantics.md#not-covered-yet), and only there: deciding it after the draws moves no
other engine's examples."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

from kvcheck.conformance import workload_machine
from kvcheck.conformance.differential import Pair
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec
from kvcheck.conformance.workload_machine import (
    async_keys_stale_checkpoints,
    run_workload_machine,
)

CHECKPOINTED = KVCacheGroupSpec("mamba", 2, mamba_cache_mode="align",
                                num_prefill_checkpoint_blocks=1,
                                prefill_checkpoint_alignment=1)
FULL = KVCacheGroupSpec("full_attention", 1)


def test_the_refused_combination_is_exactly_checkpoints_with_lookahead_of_two() -> None:
    both = (CHECKPOINTED, FULL)
    plain = (KVCacheGroupSpec("mamba", 2, mamba_cache_mode="align"), FULL)
    assert async_keys_stale_checkpoints({"num_blocks": 46, "block_size": 1,
                                         "kv_cache_groups": both,
                                         "num_hash_lookahead_tokens": 2})
    assert async_keys_stale_checkpoints({"num_blocks": 46, "block_size": 1,
                                         "kv_cache_groups": both,
                                         "num_hash_lookahead_tokens": 3})
    assert not async_keys_stale_checkpoints({"num_blocks": 46, "block_size": 1,
                                             "kv_cache_groups": both,
                                             "num_hash_lookahead_tokens": 1})
    assert not async_keys_stale_checkpoints({"num_blocks": 46, "block_size": 1,
                                             "kv_cache_groups": both})
    assert not async_keys_stale_checkpoints({"num_blocks": 46, "block_size": 1,
                                             "kv_cache_groups": plain,
                                             "num_hash_lookahead_tokens": 3})


def _is_async(pair: Pair) -> bool:
    return any(op.get("in_flight") or "num_in_flight_tokens" in op.get("gates", {})
               for op in pair.ops)  # type: ignore[attr-defined]


def test_random_workloads_never_schedule_the_refused_layout_asynchronously(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Derandomized workloads (the reference on both sides) with checkpoints, hash lookahead
    and asynchronous scheduling declared, every layout of them a checkpoint one (rare in the
    suite's draws: ``layout_for`` is patched to the next draw that has one), run the refused
    layout synchronously only, and the others asynchronously too."""
    original = workload_machine.layout_for

    def checkpoint_layout(profile: str, kinds: Any, block_size: int, draw: int,
                          *args: Any, **kwargs: Any) -> Any:
        for nearby in range(draw, draw + 64):
            got = original(profile, kinds, block_size, nearby, *args, **kwargs)
            if any(g.num_prefill_checkpoint_blocks for g in got[0]):
                return got
        return original(profile, kinds, block_size, draw, *args, **kwargs)

    monkeypatch.setattr(workload_machine, "layout_for", checkpoint_layout)
    reference = load_impl("reference")
    quick = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                     phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                     print_blob=False)
    pairs: list[Pair] = []

    def make(**fields: Any) -> Pair:
        pairs.append(Pair(reference, reference, KVCacheSpec(profile="vllm-0.33", **fields)))
        return pairs[-1]

    run_workload_machine(make, quick, None, extras=False, events=False, impl=reference,
                         profile="vllm-0.33", stats=Counter(),
                         group_kinds=("mamba", "full_attention"),
                         features={"fine_grained_hits", "mamba_checkpoints", "hash_lookahead",
                                   "async_scheduling"})
    refused = [p for p in pairs if async_keys_stale_checkpoints(
        {"num_blocks": p.spec.num_blocks, "block_size": p.spec.block_size,
         "kv_cache_groups": p.spec.kv_cache_groups,
         "num_hash_lookahead_tokens": p.spec.num_hash_lookahead_tokens})]
    assert len(refused) >= 5, f"the workloads drew the refused layout {len(refused)} times"
    assert not [p.spec for p in refused if _is_async(p)]
    assert any(_is_async(p) for p in pairs if p not in refused
               and any(g.num_prefill_checkpoint_blocks for g in p.spec.kv_cache_groups))
