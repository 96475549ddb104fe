"""Bug: ``allocate_slots(..., skip_zeroing_group_ids)`` is ignored: the blocks an
asynchronous KV load is writing are recorded for zeroing too, and the worker's zeroing races
the load (vLLM 0.33 leaves them out; docs/semantics.md#worker-side-block-zeroing).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager

from _feature_mutant_base import build_feature

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class SkipIgnored(KVCacheManager):
    @contextmanager
    def zeroing_skipped(self, skip_zeroing_group_ids: Collection[int]) -> Iterator[None]:
        yield  # BUG: no group's external blocks are left out


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_feature(
    "zeroing_skip_ignored", "block_zeroing", SkipIgnored, mamba=True, fine_grained=True)
