"""Bug (single_type_kv_cache_manager.py): a sliding-window group adopts a request's hits
skipping by the local computed tokens only, not local + external.

vLLM applies the window to everything computed, the external tokens included
(``get_num_skipped_tokens(local + external)``): hits the window no longer reads become null
blocks and are not touched. Skipping by the local tokens alone keeps (and pins) blocks the
window will never read, so the tables, ref counts and free counts differ from vLLM's and a
tight pool refuses requests vLLM admits.
"""

from __future__ import annotations

from collections.abc import Sequence

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.single_type_kv_cache_manager import SlidingWindowManager


class LocalSkipOnly(SlidingWindowManager):
    def add_local_computed_blocks(self, request_id: str,
                                  new_computed_blocks: Sequence[KVCacheBlock],
                                  num_local_computed_tokens: int,
                                  num_external_computed_tokens: int = 0) -> None:
        # BUG: the external tokens are left out of the window's skip.
        super().add_local_computed_blocks(request_id, new_computed_blocks,
                                          num_local_computed_tokens, 0)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "mut_ext_window_skip_ignored", managers={SlidingWindowManager: LocalSkipOnly})
