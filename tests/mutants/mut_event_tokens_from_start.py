"""Bug (block_pool.py): ``BlockStored.token_ids`` holds the request's tokens from position 0
to the last stored block instead of only the stored blocks' tokens.

A one-shot prefill is unaffected; every later event of the request (the next chunk of a
chunked prefill, a block filled by decode, the blocks after a prefix hit) carries tokens of
blocks stored earlier, so ``len(token_ids) != block_size * len(block_hashes)`` and a consumer
rebuilding blocks from events assigns the wrong tokens to each hash.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.events import BlockStored


class TokensFromStartPool(BlockPool):
    def _block_stored_event(self, request: Any, blocks: Any, num_cached_blocks: int,
                            num_full_blocks: int, block_size: int, *args: Any) -> BlockStored:
        event = super()._block_stored_event(request, blocks, num_cached_blocks,
                                            num_full_blocks, block_size, *args)
        # BUG: should start at num_cached_blocks * block_size
        return replace(event,
                       token_ids=tuple(request.all_token_ids[:num_full_blocks * block_size]))


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_event_tokens_from_start", pool_cls=TokensFromStartPool)
