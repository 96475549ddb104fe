"""Bug: ``cache_blocks`` counts the trailing partial block as full and caches it.

The partial block is keyed by the hash of the tokens it holds so far and counted as cached,
so it is never re-keyed when it fills up, and when freed it is treated as a cache entry
(tail of the queue under 0.33) instead of being reused first. vLLM only ever caches full
blocks (``num_full = min(num_tokens, hashed_tokens) // block_size``); caching a block before
it is final is the class of stale-key bug of kvcached#362 (peer-systems §4 #9).
"""

from _mutant_base import build

from kvcheck.reference_impl.block import make_block_hash_with_group_id
from kvcheck.reference_impl.block_hasher import hash_block_tokens
from kvcheck.reference_impl.single_type_kv_cache_manager import FullAttentionManager


class PartialCachingFullAttention(FullAttentionManager):
    def cache_blocks(self, request, num_tokens):
        super().cache_blocks(request, num_tokens)
        # BUG: the partial block after the full ones is cached too (a cdiv instead of a //).
        rid, bs = request.request_id, self.block_size
        idx = self.num_cached_block.get(rid, 0)
        end = min(num_tokens, request.num_tokens)
        blocks = self.req_to_blocks[rid]
        if idx * bs < end < (idx + 1) * bs and idx < len(blocks) and not blocks[idx].is_null:
            hasher = request.block_hasher  # the manager's RequestBlockHasher
            parent = request.block_hashes[idx - 1] if idx else None
            partial = hash_block_tokens(hasher.hash_fn, parent,
                                        request.all_token_ids[idx * bs:end],
                                        none_hash=hasher.none_hash)
            key = make_block_hash_with_group_id(partial, self.kv_cache_group_id)
            blocks[idx].block_hash = key
            self.block_pool.cached_block_hash_to_block.insert(key, blocks[idx])
            self.num_cached_block[rid] = idx + 1


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_partial_block_cached", managers={FullAttentionManager: PartialCachingFullAttention})
