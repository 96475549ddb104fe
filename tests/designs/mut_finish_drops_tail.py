"""finish_kv mutant: ``free`` bounds the blocks it caches by the lookup's cap, ``(num_tokens -
1) // block_size`` (the last token is always recomputed, so its block was taken for one that
never needs caching), not by the full computed blocks: a request whose computed tokens end on
a block boundary never caches its last full block, and a later request with the same prompt
misses it (caught by the tests that look up a finished request's blocks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from finish_kv import IMPL_INFO as _FINISH_INFO
from finish_kv import FinishManager

from kvcheck.conformance.protocol import KVCacheSpec

IMPL_INFO = replace(_FINISH_INFO, name="mut_finish_drops_tail")


class DropsTail(FinishManager):
    def num_full_blocks(self, tokens: Sequence[int], table: Sequence[int]) -> int:
        # BUG: the lookup's cap; the insert must cache len(tokens) // block_size blocks.
        return min(max(0, len(tokens) - 1) // self.block_size, len(table))


def make_kv_cache_manager(spec: KVCacheSpec) -> DropsTail:
    return DropsTail(spec)
