"""vLLM 0.33.0's own failure on asynchronous scheduling beside a Mamba "align" group with
prefill checkpoint blocks under hash lookahead ``L >= 2`` (docs/semantics.md#not-covered-yet),
on the real vLLM: the evidence behind keeping the random workloads' asynchronous mode off that
layout (``workload_machine.async_keys_stale_checkpoints``), kept as a test so a vLLM release
that fixes it is noticed.

Runs only where vLLM 0.33 is importable (an environment built by scripts/vllm-cpu-env.sh; run
it with that environment's python); vLLM 0.10.2 has no asynchronous scheduling in its manager.
Layout: Mamba "align" (block size 2, one prefill checkpoint block, alignment 1) beside full
attention (block size 1), L = 3, a 24-token prompt computed 4 tokens a step. The chunk
[20, 24) writes its checkpoint, the state after 21 tokens, into Mamba block 7 (column 10,
tokens [20, 22)). Synchronously vLLM frees that column at the skip boundary (24) before
caching; with 4 tokens in flight the boundary is 20, the block survives, and the next decode
step keys it with the full-block key at 22 and hands it to a KV connector as ``(0, 7, 22)``:
a state of 22 tokens it does not hold (found by ``--kv-seed=1`` of the hybrid differential,
whose laws name it; the reference reproduces vLLM's answers).
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest

from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, RequestView

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = pytest.mark.skipif(
    not HAS_VLLM, reason="vLLM is not importable here (build it: scripts/vllm-cpu-env.sh)")

SPEC = KVCacheSpec(
    num_blocks=46, block_size=1, pythonhashseed="0", profile="vllm-0.33",
    num_hash_lookahead_tokens=3,
    kv_cache_groups=(KVCacheGroupSpec("mamba", 2, mamba_cache_mode="align",
                                      num_prefill_checkpoint_blocks=1,
                                      prefill_checkpoint_alignment=1),
                     KVCacheGroupSpec("full_attention", 1)))
PROMPT = (*range(1, 17), *[0] * 8)


def _hand_offs(in_flight: int) -> tuple[list[list[int]], object]:
    """vLLM's own ``KVCacheManager`` (through the adapter): the prompt prefilled 4 tokens a
    step, then one decode step, each step after the first passing ``in_flight`` tokens in
    flight (0: synchronous). Returns the Mamba blocks the last chunk [20, 24) got and the
    boundary-state hand-offs of the decode step."""
    from kvcheck.conformance.loader import load_impl

    manager = load_impl("vllm").make_manager(SPEC)
    kw = {"num_in_flight_tokens": in_flight} if in_flight else {}
    view = RequestView("r0", PROMPT)
    manager.new_step_starts()
    manager.get_computed_blocks(view)
    assert manager.allocate_slots(view, 4, 0, [[], []]) is not None
    new: list[list[int]] = []
    for computed in range(4, 24, 4):
        view = replace(view, num_computed_tokens=computed)
        manager.take_boundary_state_offloads()
        manager.new_step_starts()
        new = manager.allocate_slots(view, 4, 0, [], 0, **kw)
        assert new is not None
    view = replace(view, num_computed_tokens=24)
    manager.take_boundary_state_offloads()
    manager.new_step_starts()
    view = replace(view, output_token_ids=(51222,))
    assert manager.allocate_slots(view, 1, 0, [], 0, **kw) is not None
    return new, manager.take_boundary_state_offloads()


def test_vllm_033_keys_a_stale_checkpoint_with_tokens_in_flight() -> None:
    from kvcheck.adapters.vllm_manager import HAS_IN_FLIGHT_TOKENS

    if not HAS_IN_FLIGHT_TOKENS:
        pytest.skip("this vLLM release has no num_in_flight_tokens (vLLM 0.33's asynchronous "
                    "scheduling)")
    new, hand_offs = _hand_offs(4)
    assert new[0] == [7, 28], new  # block 7: the chunk [20, 24)'s checkpoint, column 10
    assert hand_offs == {"r0": [(0, 7, 22)]}, hand_offs  # keyed as the state after 22
    # Synchronously the chunk's checkpoint block (column 10) is freed before caching:
    # nothing is keyed or handed off on the decode step.
    new, hand_offs = _hand_offs(0)
    assert len(new[0]) == 2 and hand_offs == {}, (new, hand_offs)
