"""nano_kv mutant: a prefix hit on a freed cached block takes a reference but leaves the block
in the free list, so the next allocation hands it to a second request while it is held."""

from __future__ import annotations

from dataclasses import replace

from nano_kv import IMPL_INFO as _NANO_INFO
from nano_kv import NanoManager

from kvcheck.conformance.protocol import KVCacheSpec

IMPL_INFO = replace(_NANO_INFO, name="mut_double_hand_out")


class DoubleHandOutManager(NanoManager):
    def hold_hit(self, block_id: int) -> None:
        self.blocks[block_id].ref_count += 1  # BUG: not removed from the free list when it was free


def make_kv_cache_manager(spec: KVCacheSpec) -> DoubleHandOutManager:
    return DoubleHandOutManager(spec)
