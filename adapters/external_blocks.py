"""The blocks an external-KV ``allocate_slots`` added, as the protocol answers them
(``kvcheck.conformance.protocol.SupportsExternalKV``).

vLLM 0.33's ``allocate_slots(..., num_external_computed_tokens=E)`` appends fresh blocks for
the external tokens to the request's tables but returns only the blocks allocated after
them (the scheduler reads the rest with ``get_blocks``). The protocol answers every block the
call added, external ones first, so that a table is always the previous table + the hits +
the answer (with nulls where a window skips): adapters of engines that behave like 0.33 read
the tables before and after the call and answer their difference.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["blocks_added"]


def blocks_added(before: Sequence[Sequence[int]], num_hits: Sequence[int],
                 after: Sequence[Sequence[int]], null: int = 0) -> list[list[int]]:
    """Per group, the real (non-null) block ids of ``after`` past the ``before`` table and
    the ``num_hits`` hits adopted: what one ``allocate_slots`` call added.

    Args:
        before: the tables before the call, one list of ids per group.
        num_hits: the number of hit blocks passed to the call, per group.
        after: the tables after the call.
        null: the null block's id (a window's skipped position).
    """
    return [[b for b in table[len(old) + hits:] if b != null]
            for old, hits, table in zip(before, num_hits, after, strict=True)]
