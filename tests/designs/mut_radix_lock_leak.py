"""radix_kv mutant: ``release_computed`` unlocks only the deepest matched block, as if a lock
on the last node covered the whole path (SGLang's ``dec_lock_ref`` walks up to the root), so
every other block of a lookup the scheduler did not admit stays locked: neither free nor held
by any request (a pinned block leaked)."""

from __future__ import annotations

from dataclasses import replace

from radix_kv import IMPL_INFO as _RADIX_INFO
from radix_kv import RadixManager

from kvcheck.conformance.protocol import KVCacheSpec

# Without radix_kv's own check_invariants: kvcheck's laws must find the bug.
IMPL_INFO = replace(_RADIX_INFO, name="mut_radix_lock_leak",
                    capabilities=_RADIX_INFO.capabilities - {"invariants"})


class DeepestUnlock(RadixManager):
    def release_computed(self, request_id: str) -> None:
        locked = self.locks.pop(request_id, [])
        if locked:
            self._unref(locked[-1])  # BUG: the rest of the path keeps its locks


def make_kv_cache_manager(spec: KVCacheSpec) -> DeepestUnlock:
    return DeepestUnlock(spec)
