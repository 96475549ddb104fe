"""Bug: a Mamba "align" group beside fine-grained partial hits (vLLM 0.33,
docs/semantics.md#fine-grained-partial-hits) rounds its hits down to whole blocks: the state
cached at a hash boundary inside a block (a prompt's last hash boundary) is never a hit, as if
the feature were off for Mamba.

Requests sharing a prompt up to a boundary inside a Mamba block recompute it all: the hits,
the copies and the tables differ from vLLM's; every hit is still correct data.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class WholeBlocks(MambaManager):
    def find_longest_partial_cache_hit(self, block_hashes, max_length, group_ids,
                                       hash_block_size):
        while True:
            computed, hit_length = super().find_longest_partial_cache_hit(
                block_hashes, max_length, group_ids, hash_block_size)
            if hit_length % self.block_size == 0:
                return computed, hit_length
            max_length = hit_length - 1  # BUG: only a whole block's state is a hit


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_fine_hits_whole_blocks", mamba=True, fine_grained=True,
    managers={MambaManager: WholeBlocks})
