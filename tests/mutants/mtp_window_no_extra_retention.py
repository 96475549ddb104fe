"""Bug: with multi-module MTP (``num_prefill_lookahead`` K > 1) a sliding window frees the
blocks below it as soon as it stops reading them, ignoring ``extra_retained_tokens``.

vLLM 0.33's KV-cache planning sets ``extra_retained_tokens = K - 1`` on every
``SlidingWindowSpec`` and ``SlidingWindowManager.get_num_skipped_tokens`` subtracts it: the
re-prefillable tail's window reaches ``K - 1`` tokens further back, so those blocks stay held
(docs/semantics.md#multi-module-mtp). Freed early, the pool has a block more free and the
request's table a null where vLLM still holds the block.
"""

from __future__ import annotations

from _mtp_mutant_base import build_mtp

from kvcheck.reference_impl.single_type_kv_cache_manager import SlidingWindowManager


class ForgetfulWindow(SlidingWindowManager):
    def get_num_skipped_tokens(self, num_computed_tokens):
        return max(0, num_computed_tokens - self.sliding_window + 1)  # BUG: no extra retention


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_mtp(
    "mtp_window_no_extra_retention", {SlidingWindowManager: ForgetfulWindow})
