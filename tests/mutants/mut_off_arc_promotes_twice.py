"""Bug (offload_arc.py): ARC promotion twice per request: a request's own store and its end
count as two uses, so a chunk seen by one request only (inserted, never reused) is promoted to
T2 when the request finishes.

ARC's T2 is for chunks used by more than one request; with this bug every stored chunk lands
there, so one long prompt (a scan) floods T2 and pushes out the shared prefixes ARC exists to
keep, and T1/T2 sizing no longer means anything. vLLM's ARC promotes a ready chunk a request
reused, once, at the request's end, and moves chunks it only inserted to the newest end of
their own list (``arc.py`` ``on_request_finished``; spec kv-connector-and-offload.md §3).
"""

from __future__ import annotations

from collections.abc import Sequence

from _offload_mutant_base import build_offload

from kvcheck.reference_impl.offload_arc import ARCCachePolicy
from kvcheck.reference_impl.offload_policy import OffloadKey, ReqContext


class InsertCountsAsReuse(ARCCachePolicy):
    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]],
                            insertion_only_keys: set[OffloadKey], reused_keys: set[OffloadKey],
                            req_context: ReqContext) -> None:
        # BUG: the request's own inserts are promoted as if another request had reused them
        super().on_request_finished(key_groups, set(), reused_keys | insertion_only_keys,
                                    req_context)


IMPL_INFO, make_kv_cache_manager, make_block_pool, make_offloading_manager = build_offload(
    "mut_off_arc_promotes_twice", arc=InsertCountsAsReuse)
