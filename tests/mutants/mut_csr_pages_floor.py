"""Bug (page_table.py): the FlashInfer CSR conversion counts a request's pages with floor
division (``seq_len // page_size``) instead of ceiling division.

Every request whose length is not a multiple of the page size loses its last, partial page:
``kv_indices`` omits the block holding its newest tokens, and ``kv_last_page_len`` comes out
larger than a page. The attention kernel then reads one page too few (the newest KV is
ignored) or past the page. ``num_pages = ceil(seq_len / P)`` is the conversion in FlashInfer's
own tests (peer-systems §2.3: the page-table conversions a conformance suite needs).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from _mutant_base import MutantManager, build


class FloorPagesCSR(MutantManager):
    def flashinfer_csr(self, block_tables: Sequence[Sequence[int]],
                       seq_lens: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        page = self.spec.block_size
        num_pages = [n // page for n in seq_lens]  # BUG: ceil, -(-n // page)
        indptr = [0, *accumulate(num_pages)]
        indices = [int(b) for row, p in zip(block_tables, num_pages, strict=False)
                   for b in row[:p]]
        last = [n - (p - 1) * page for n, p in zip(seq_lens, num_pages, strict=True)]
        return indptr, indices, last


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_csr_pages_floor", adapter_cls=FloorPagesCSR)
