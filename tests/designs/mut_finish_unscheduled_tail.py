"""finish_kv mutant: ``allocate_slots`` records the request's whole token list, not the tokens
computed through this call, so ``free`` of a request preempted in the middle of a chunked
prefill caches its last, partly computed block under the key of prompt tokens never
scheduled: a later lookup of that prompt hits a block holding only part of them (caught by
hit correctness: "a partial block")."""

from __future__ import annotations

from dataclasses import replace

from finish_kv import IMPL_INFO as _FINISH_INFO
from finish_kv import FinishManager

from kvcheck.conformance.protocol import KVCacheSpec, RequestView

IMPL_INFO = replace(_FINISH_INFO, name="mut_finish_unscheduled_tail")


class UnscheduledTail(FinishManager):
    def record_computed(self, request: RequestView, end: int) -> None:
        # BUG: the view holds prompt tokens of chunks still to come; only [0, end) are computed.
        self.computed[request.request_id] = request.token_ids


def make_kv_cache_manager(spec: KVCacheSpec) -> UnscheduledTail:
    return UnscheduledTail(spec)
