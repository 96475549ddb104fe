"""Bug (kv_cache_manager.py): ``allocate_slots`` caches up to the lookahead (speculative)
slots: ``min(computed + new + lookahead, num_tokens)`` instead of
``min(computed + new, num_tokens)``.

In a one-shot prefill the lookahead slots lie past the prompt, so the cap hides the bug;
during a chunked prefill they cover prompt tokens of the *next* chunk, whose KV has not been
computed yet, and the block holding them is cached (and hit by other requests) before it is
written. vLLM never caches lookahead slots ("drafts and lookahead slots are never cached"):
caching a block before its KV is final is the stale-KV class of kvcached#362
(peer-systems §4 #9) and vllm#37076's cross-request bleed (#2).
"""

from __future__ import annotations

from collections.abc import Sequence

from _mutant_base import build

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request


class LookaheadCachingManager(KVCacheManager):
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: Sequence[Sequence[KVCacheBlock]] | None = None,
                       num_lookahead_tokens: int = 0,
                       delay_cache_blocks: bool = False,
                       ) -> tuple[list[KVCacheBlock], ...] | None:
        new = super().allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                     new_computed_blocks, num_lookahead_tokens,
                                     delay_cache_blocks=True)
        if new is not None and self.enable_caching and not delay_cache_blocks:
            num_computed = request.num_computed_tokens + num_new_computed_tokens
            # BUG: the lookahead slots are counted as computed tokens
            self.coordinator.cache_blocks(request, min(
                num_computed + num_new_tokens + num_lookahead_tokens, request.num_tokens))
        return new


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_lookahead_cached_in_chunked_prefill", manager_cls=LookaheadCachingManager)
