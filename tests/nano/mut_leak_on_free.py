"""nano_kv mutant: free walks the block table backwards but stops before index 0, so the first
block of every freed request stays referenced forever (a leak)."""

from __future__ import annotations

from dataclasses import replace

from nano_kv import IMPL_INFO as _NANO_INFO
from nano_kv import NanoManager

from kvcheck.conformance.protocol import KVCacheSpec

IMPL_INFO = replace(_NANO_INFO, name="mut_leak_on_free")


class LeakOnFreeManager(NanoManager):
    def free(self, request_id: str) -> None:
        table = self.tables.pop(request_id, None)
        if table is None:
            return
        self.hashes.pop(request_id, None)
        for i in range(len(table) - 1, 0, -1):  # BUG: off by one, table[0] is never released
            self.release(table[i])


def make_kv_cache_manager(spec: KVCacheSpec) -> LeakOnFreeManager:
    return LeakOnFreeManager(spec)
