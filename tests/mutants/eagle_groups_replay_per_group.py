"""Bug: under sparse retention an unflagged group keeps the tails of the replay boundaries
without EAGLE, as if the boundaries followed the group's own per-group EAGLE flag
(``KVCacheGroupSpec.is_eagle_group``).

vLLM 0.33 computes a request's replay boundaries once, for every group, from whether any group
drops (``replay_boundaries(..., use_eagle=bool(self.drop_eagle_group_ids))`` in
``KVCacheCoordinator.cache_blocks``), so an unflagged window still keeps the tails ending one
block below EAGLE's boundaries (docs/semantics.md#prefix-cache-hits). Following its own flag,
a window of 4 beside a flagged full-attention group keeps the wrong tail, and a resend of a
13-token prompt hits nothing instead of 8 tokens.
"""

from __future__ import annotations

from _eagle_mutant_base import build_eagle

from kvcheck.reference_impl.single_type_kv_cache_manager import SlidingWindowManager


class OwnFlagReplay(SlidingWindowManager):
    def reachable_boundaries(self, request):
        saved, self.replay_eagle = self.replay_eagle, self.use_eagle  # BUG: the group's own flag
        try:
            return super().reachable_boundaries(request)
        finally:
            self.replay_eagle = saved


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_eagle(
    "eagle_groups_replay_per_group", {SlidingWindowManager: OwnFlagReplay}, mamba=True,
    eagle_groups=True)
