"""Bug (offload_manager.py): a pending chunk readable: ``lookup`` answers ``HIT`` for a key
whose store is still in flight (``ref_cnt == -1``), checking presence instead of readiness.

The scheduler then counts the chunk as external tokens and loads it before its write has
landed: the request reads a half-written slot. vLLM's manager answers ``HIT_PENDING`` for
such a chunk (``manager.py`` ``lookup``), and the connector waits for ``complete_store``.
"""

from __future__ import annotations

from _offload_mutant_base import build_offload

from kvcheck.reference_impl.offload_manager import CPUOffloadingManager, LookupResult
from kvcheck.reference_impl.offload_policy import OffloadKey, ReqContext


class PresenceIsReady(CPUOffloadingManager):
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._check_keys((key,), "lookup")
        chunk = self._policy.get(key)
        # BUG: present means readable, even while the write is pending
        return LookupResult.MISS if chunk is None else LookupResult.HIT


IMPL_INFO, make_kv_cache_manager, make_block_pool, make_offloading_manager = build_offload(
    "mut_off_pending_readable", manager_cls=PresenceIsReady)
