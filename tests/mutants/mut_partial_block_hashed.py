"""Bug (block_hasher.py): the trailing partial block gets a hash too (the loop runs while
``start < num_tokens`` and hashes ``token_ids[start:min(start + block_size, num_tokens)]``).

The partial block's hash is never recomputed when it fills up (hashing resumes after the last
hash), so the full block is keyed by its first few tokens: a later prompt sharing only those
tokens hits KV it does not own. vLLM hashes only full blocks; keying a block before it is final
is the stale-key class of kvcached#362 (peer-systems §4 #9).
"""

from __future__ import annotations

from _mutant_base import build

from kvcheck.reference_impl.block import BlockHash
from kvcheck.reference_impl.block_hasher import RequestBlockHasher, hash_block_tokens
from kvcheck.reference_impl.extra_keys import generate_block_hash_extra_keys
from kvcheck.reference_impl.request import Request


class PartialBlockHasher(RequestBlockHasher):
    def __call__(self, request: Request) -> list[BlockHash]:
        token_ids = request.all_token_ids
        start = len(request.block_hashes) * self.block_size
        hashable_end = request.num_tokens - self.num_lookahead_tokens
        parent: bytes | None = request.block_hashes[-1] if request.block_hashes else None
        mm_idx = 0 if start == 0 else self._incremental_mm_idx
        new_hashes: list[BlockHash] = []
        while start < hashable_end:  # BUG: start + block_size <= hashable_end
            end = min(start + self.block_size, hashable_end)
            extra_keys, mm_idx = generate_block_hash_extra_keys(
                request, start, end, mm_idx, self.profile)
            block_hash = hash_block_tokens(self.hash_fn, parent, token_ids[start:end],
                                           self._with_lookahead(extra_keys, token_ids, end),
                                           none_hash=self.none_hash)
            new_hashes.append(block_hash)
            parent, start = block_hash, start + self.block_size
        return new_hashes


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_partial_block_hashed", hasher_cls=PartialBlockHasher)
