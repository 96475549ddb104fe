"""nano_kv mutant: a block handed out again keeps its old key in the hash map, so a later
lookup of the old tokens hits the block although it now holds other tokens (or nothing)."""

from __future__ import annotations

from dataclasses import replace

from nano_kv import IMPL_INFO as _NANO_INFO
from nano_kv import NanoManager

from kvcheck.conformance.protocol import KVCacheSpec

IMPL_INFO = replace(_NANO_INFO, name="mut_stale_hit")


class StaleHitManager(NanoManager):
    def take_free_block(self) -> int:
        block_id = self.free_ids.popleft()
        block = self.blocks[block_id]
        block.hash = None  # BUG: hash_to_block_id still maps the old key to block_id
        block.ref_count = 1
        return block_id


def make_kv_cache_manager(spec: KVCacheSpec) -> StaleHitManager:
    return StaleHitManager(spec)
