"""Bug: with ``use_eagle`` a chunked local attention group drops the last block of its hit
even when it is not flagged ``is_eagle_group``, as if every chunked group were EAGLE's.

vLLM 0.33 drops only in the groups of ``drop_eagle_group_ids`` (the flagged ones, and every
group of a flagged group's spec); an unflagged chunked local group beside a flagged group of
another spec searches as without EAGLE (a dropping one is refused: vLLM asserts against it,
docs/semantics.md#prefix-cache-hits). Dropping there, full attention flagged beside chunks of
24 tokens, the sibling of a 21-token prompt hits 12 tokens instead of 16.
"""

from __future__ import annotations

from _eagle_mutant_base import build_eagle

from kvcheck.reference_impl.single_type_kv_cache_manager import ChunkedLocalAttentionManager


class DropsUnflagged(ChunkedLocalAttentionManager):
    def find_longest_cache_hit(self, block_hashes, max_length, group_ids, alignment_tokens,
                               drop_eagle_block=False):
        hits, length = super().find_longest_cache_hit(block_hashes, max_length, group_ids,
                                                      alignment_tokens, drop_eagle_block)
        if self.replay_eagle and length:  # BUG: EAGLE's drop, flagged or not
            for blocks in hits:
                blocks.pop()
            length -= self.block_size
        return hits, length


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_eagle(
    "eagle_groups_unflagged_chunked_local_drops",
    {ChunkedLocalAttentionManager: DropsUnflagged}, mamba=True, eagle_groups=True)
