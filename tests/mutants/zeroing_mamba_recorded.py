"""Bug: a Mamba group's new blocks are recorded for zeroing too (vLLM 0.33 records only an
``AttentionSpec`` group's: a Mamba state block is written whole by its first step;
docs/semantics.md#worker-side-block-zeroing). (The grouped form swaps the manager's class
after it was built: the Mamba groups start recording at the first drain.)
"""

from __future__ import annotations

from _feature_mutant_base import build_feature

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.single_type_kv_cache_manager import SingleTypeKVCacheManager


def _record_mamba(manager: SingleTypeKVCacheManager) -> None:
    manager.record_new_block_ids()
    plain = type(manager).allocate_new_blocks_main

    def allocate_new_blocks_main(request_id: str, num_tokens: int,
                                 num_tokens_main_model: int) -> list[KVCacheBlock]:
        new = plain(manager, request_id, num_tokens, num_tokens_main_model)
        manager.new_block_ids.extend(b.block_id for b in new if not b.is_null)  # BUG
        return new

    manager.allocate_new_blocks_main = allocate_new_blocks_main  # type: ignore[method-assign]


class MambaRecorded(KVCacheManager):
    def take_new_block_ids(self) -> list[int]:
        ids = super().take_new_block_ids()
        if self.needs_kv_cache_zeroing:
            for manager in self.coordinator.single_type_managers:
                if not manager.records_new_block_ids:
                    _record_mamba(manager)  # BUG: a Mamba group records as well
        return ids


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_feature(
    "zeroing_mamba_recorded", "block_zeroing", MambaRecorded, mamba=True, fine_grained=True)
