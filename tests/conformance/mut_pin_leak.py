"""Bug: ``release_computed`` forgets a lookup's pins without dropping their references, so a
block looked up by a request that is then not admitted (a refused allocation, a lookup the
scheduler does not follow) stays pinned forever: neither free nor held by any request."""

from __future__ import annotations

from dataclasses import replace

from pinning_kv import IMPL_INFO as _BASE
from pinning_kv import PinningManager

from kvcheck.conformance.protocol import KVCacheSpec

IMPL_INFO = replace(_BASE, name="mut_pin_leak")


class LeakyRelease(PinningManager):
    def release_computed(self, request_id: str) -> None:
        self.pins.pop(request_id, None)  # BUG: the pinned blocks' references are never dropped


def make_kv_cache_manager(spec: KVCacheSpec) -> LeakyRelease:
    return LeakyRelease(spec)
