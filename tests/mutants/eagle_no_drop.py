"""Bug: with EAGLE (``use_eagle=True``) a full-attention hit keeps its last matched block.

vLLM's ``FullAttentionManager.find_longest_cache_hit`` drops it (``drop_eagle_block``: 0.10.2
pops the block, 0.33 subtracts one alignment unit before rounding) so the drafting head's
hidden state at the hit's end is recomputed (docs/semantics.md#prefix-cache-hits). Kept, a
13-token resend of a cached prompt hits 12 tokens instead of 8, beyond EAGLE's hit cap.
"""

from __future__ import annotations

from _eagle_mutant_base import build_eagle

from kvcheck.reference_impl.single_type_kv_cache_manager import FullAttentionManager, cdiv


class KeepingFullAttention(FullAttentionManager):
    def _drop_eagle_block(self, computed, hit_length, alignment_tokens):
        if self.v033 and hit_length > 0:  # BUG: no drop, only 0.33's rounding
            hit_length -= hit_length % alignment_tokens
            for out in computed:
                del out[cdiv(hit_length, self.block_size):]
        return computed, hit_length


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_eagle(
    "eagle_no_drop", {FullAttentionManager: KeepingFullAttention})
