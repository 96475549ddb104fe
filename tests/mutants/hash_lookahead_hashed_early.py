"""Bug: with hash lookahead (``num_hash_lookahead_tokens=L``) a block is hashed as soon as it
is full, with the lookahead tokens that exist so far, instead of once all ``L`` exist.

vLLM 0.33's ``get_request_block_hasher`` stops at ``num_tokens - L``
(docs/semantics.md#request-block-hashes): a block whose next token is not known yet has no
hash, so it is neither cached nor hit. Hashed early, an 8-token prompt caches its second block
and a longer request hits 8 tokens where vLLM hits 4.
"""

from __future__ import annotations

from _mutant_base import build

from kvcheck.reference_impl.block_hasher import (
    RequestBlockHasher,
    _rewind_mm_idx,
    hash_block_tokens,
)
from kvcheck.reference_impl.extra_keys import generate_block_hash_extra_keys


class HashedEarly(RequestBlockHasher):
    def __call__(self, request):
        lookahead = self.num_lookahead_tokens
        if not lookahead:
            return super().__call__(request)
        start = len(request.block_hashes) * self.block_size
        token_ids = request.all_token_ids
        parent = request.block_hashes[-1] if request.block_hashes else None
        mm_idx = 0
        hashes = []
        # BUG: every full block now (not only up to num_tokens - L), keyed by whatever
        # lookahead tokens exist so far.
        while start + self.block_size <= request.num_tokens:
            end = start + self.block_size
            extra, mm_idx = generate_block_hash_extra_keys(request, start, end + lookahead,
                                                           mm_idx, self.profile)
            mm_idx = _rewind_mm_idx(request, mm_idx, end)
            parent = hash_block_tokens(self.hash_fn, parent, token_ids[start:end],
                                       self._with_lookahead(extra, token_ids, end),
                                       none_hash=self.none_hash)
            hashes.append(parent)
            start = end
        return hashes


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "hash_lookahead_hashed_early", hasher_cls=HashedEarly, keep=frozenset({"hash_lookahead"}))
