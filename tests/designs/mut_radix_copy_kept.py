"""radix_kv mutant: the dedup rebinds a duplicate entry to the tree's block but never frees
the request's copy (the table forgets it, the allocator still counts its reference), so the
copy is neither held nor free: a block lost at every rebinding."""

from __future__ import annotations

from dataclasses import replace

from radix_kv import IMPL_INFO as _RADIX_INFO
from radix_kv import RadixManager

from kvcheck.conformance.protocol import KVCacheSpec

# Without radix_kv's own check_invariants: kvcheck's laws must find the bug.
IMPL_INFO = replace(_RADIX_INFO, name="mut_radix_copy_kept",
                    capabilities=_RADIX_INFO.capabilities - {"invariants"})


class CopyKept(RadixManager):
    def _rebind(self, table: list[int], index: int, cached: int) -> None:
        self._take(cached)
        table[index] = cached  # BUG: the copy's reference is never dropped


def make_kv_cache_manager(spec: KVCacheSpec) -> CopyKept:
    return CopyKept(spec)
