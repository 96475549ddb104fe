"""radix_kv mutant: the insert's key match trusts a child found by its first page for all of
the child's pages (it compares only the first one, as if a node held a single page), so a
request whose prompt leaves a node after its first page takes the node's later pages for
duplicates of its own, and at its next call rebinds its entries to blocks of other content
(caught as a rebinding that is not one: "the content differs")."""

from __future__ import annotations

from dataclasses import replace

from radix_kv import IMPL_INFO as _RADIX_INFO
from radix_kv import Page, RadixManager

from kvcheck.conformance.protocol import KVCacheSpec

# Without radix_kv's own check_invariants: kvcheck's laws must find the bug.
IMPL_INFO = replace(_RADIX_INFO, name="mut_radix_rebind_mismatch",
                    capabilities=_RADIX_INFO.capabilities - {"invariants"})


class TrustingInsert(RadixManager):
    def _key_match(self, key: list[Page], pages: list[Page], start: int) -> int:
        # BUG: the child was found by pages[start], so the rest of its key is taken as equal.
        return min(len(key), len(pages) - start)


def make_kv_cache_manager(spec: KVCacheSpec) -> TrustingInsert:
    return TrustingInsert(spec)
