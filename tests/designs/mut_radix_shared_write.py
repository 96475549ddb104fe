"""radix_kv mutant: ``match_prefix`` aligns the match to the pages of all the request's tokens
(SGLang's ``max_prefix_len`` left at ``len(fill_ids)``, not ``len(fill_ids) - 1``) and caps
only the token count, so a page-aligned prompt keeps its last matched page as a hit and the
forward pass recomputes the last token into it while another request holds it (a write into
a shared block; the hit cap is broken too)."""

from __future__ import annotations

from dataclasses import replace

from radix_kv import IMPL_INFO as _RADIX_INFO
from radix_kv import RadixManager

from kvcheck.conformance.protocol import KVCacheSpec, RequestView

# Without radix_kv's own check_invariants: kvcheck's laws must find the bug.
IMPL_INFO = replace(_RADIX_INFO, name="mut_radix_shared_write",
                    capabilities=_RADIX_INFO.capabilities - {"invariants"})


class WholePromptMatch(RadixManager):
    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        blocks: list[int] = []
        if self.caching and not request.skip_reading_prefix_cache:
            # BUG: radix_kv matches (num_tokens - 1) // page_size pages.
            pages = self._pages(request.token_ids, 0, request.num_tokens // self.page_size)
            blocks = self._match_prefix(self._context(request), pages)
        for block_id in blocks:
            self.ref[block_id] += 1
        self.locks[request.request_id] = blocks
        # The last token's logits are needed: it is recomputed, inside the last matched page.
        return list(blocks), min(len(blocks) * self.page_size, max(0, request.num_tokens - 1))


def make_kv_cache_manager(spec: KVCacheSpec) -> WholePromptMatch:
    return WholePromptMatch(spec)
