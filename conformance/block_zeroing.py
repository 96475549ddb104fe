"""vLLM 0.33's worker-side block zeroing (capability ``block_zeroing``;
docs/semantics.md#worker-side-block-zeroing): the harness's ledger of what
``take_new_block_ids`` must drain.

With ``KVCacheConfig.needs_kv_cache_zeroing`` (a Mamba layer or a mixed-precision cache) the
worker zeroes every attention block a request gets fresh before the forward reads it: a stale
NaN in a block a kernel reads whole is a silent corruption. vLLM's managers record those
blocks as they take them from the pool and the scheduler drains them every step
(``KVCacheManager.take_new_block_ids`` into ``SchedulerOutput.new_block_ids_to_zero``).

The law (``ZeroingLedger``, checked by ``GuardedManager.take_new_block_ids``): a drain lists
exactly the blocks the ``allocate_slots`` answers since the last drain handed out in the
groups that record (every kind but ``mamba``: vLLM records ``AttentionSpec`` groups only), a
copy-on-write block included, group by group in group order, each group's in the order they
were handed out; never a cache hit (hits are adopted, not handed out), never a block a refused
allocation did not hand out, and not the external tokens' blocks of a group the allocation
named in ``skip_zeroing_group_ids`` (an asynchronous load writes them: zeroing would race
it). ``record_blocks_for_zeroing(request_id, start_token)`` adds the request's table from
``start_token`` on in every recording group (null blocks included, as vLLM adds them). A
block freed and handed out again is listed again: once per time it was handed out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.errors import KVCheckInputError

__all__ = ["ZeroingLedger", "recording_groups", "truncate_computed_blocks"]


def truncate_computed_blocks(spec: KVCacheSpec, hits: Sequence[Sequence[int]],
                             num_tokens: int) -> list[list[int]]:
    """vLLM 0.33's ``KVCacheManager.truncate_computed_blocks``: a lookup's hits (one list per
    group) sliced at ``num_tokens``, a multiple of every group's block; a Mamba group keeps
    at most what it had (a connector's load may supply the final state). A pure view: the
    scheduler passes the slice to ``allocate_slots`` with ``num_tokens`` hit tokens.

    Raises:
        KVCheckInputError: ``num_tokens`` not a multiple of a group's block size, or past a
            non-Mamba group's hits.
    """
    out: list[list[int]] = []
    for g, group_hits in enumerate(hits):
        size = spec.group_block_size(g)
        count = num_tokens // size
        mamba = spec.groups[g].kind == "mamba"
        if num_tokens % size or (not mamba and count > len(group_hits)):
            raise KVCheckInputError(
                f"truncate at {num_tokens} tokens: group {g} (block size {size}) holds "
                f"{len(group_hits)} hit blocks; the endpoint must be a multiple of every "
                "group's block size within its hits (vLLM asserts both)")
        out.append(list(group_hits[:min(count, len(group_hits)) if mamba else count]))
    return out


def recording_groups(spec: KVCacheSpec) -> tuple[int, ...]:
    """The groups whose fresh blocks are recorded for zeroing: every group but a Mamba one
    (vLLM 0.33 records an ``AttentionSpec`` group's only); none without
    ``needs_kv_cache_zeroing``."""
    if not spec.needs_kv_cache_zeroing:
        return ()
    return tuple(g for g, group in enumerate(spec.groups) if group.kind != "mamba")


class ZeroingLedger:
    """Per recording group, the ``(block id, request id)`` pairs handed out since the last
    drain, in the order they were handed out (see the module doc)."""

    __slots__ = ("_block_sizes", "_groups", "_pending")

    def __init__(self, spec: KVCacheSpec) -> None:
        self._groups = recording_groups(spec)
        self._block_sizes = {g: spec.group_block_size(g) for g in self._groups}
        self._pending: dict[int, list[tuple[int, str]]] = {g: [] for g in self._groups}

    def allocated(self, rid: str, tables: Sequence[Sequence[int]],
                  new: Sequence[Sequence[int]], num_computed_tokens: int,
                  num_external_computed_tokens: int, skip: Collection[int]) -> None:
        """An ``allocate_slots`` of ``rid`` answered ``new`` (one list per group); ``tables``
        are its tables after it. In a group named in ``skip`` (``skip_zeroing_group_ids``,
        with external tokens) the blocks below ``cdiv(num_computed_tokens +
        num_external_computed_tokens, block_size)`` in the table are the load's, not
        recorded (``num_computed_tokens``: computed before the call plus its hit tokens)."""
        for g in self._groups:
            part = new[g] if g < len(new) else ()
            if not part:
                continue
            if g in skip and num_external_computed_tokens:
                size = self._block_sizes[g]
                ext_end = -(-(num_computed_tokens + num_external_computed_tokens) // size)
                table = list(tables[g])
                part = [b for b in part if b in table and table.index(b) >= ext_end]
            self._pending[g].extend((b, rid) for b in part)

    def recorded(self, rid: str, tables: Sequence[Sequence[int]], start_token: int) -> None:
        """``record_blocks_for_zeroing(rid, start_token)``: its table from ``start_token`` on
        in every recording group."""
        for g in self._groups:
            if g < len(tables):
                start = start_token // self._block_sizes[g]
                self._pending[g].extend((b, rid) for b in tables[g][start:])

    def drain(self, got: Sequence[int]) -> str | None:
        """Compare a drain with the ledger and empty it: None when equal, else what differs
        (a fresh block missing, one listed that was not handed out, or the order)."""
        owed = [(b, rid, g) for g in self._groups for b, rid in self._pending[g]]
        for g in self._groups:
            self._pending[g] = []
        want = [b for b, _, _ in owed]
        if list(got) == want:
            return None
        missing = Counter(want) - Counter(got)
        extra = Counter(got) - Counter(want)
        if missing:
            block = next(b for b in want if b in missing)
            rid, g = next((r, g) for b, r, g in owed if b == block)
            return (f"block {block}, handed out fresh to request {rid!r} in group {g} since "
                    f"the last drain, is not listed: the worker would not zero it and its "
                    f"first reader would see stale values (expected {want})")
        if extra:
            block = next(b for b in got if b in extra)
            return (f"block {block} is listed {Counter(got)[block]} time(s) but was handed "
                    f"out fresh {Counter(want)[block]} time(s) since the last drain (a cache "
                    "hit, the external blocks of a group in skip_zeroing_group_ids, or a block "
                    f"already drained is never zeroed again; expected {want})")
        return (f"the blocks come in the order {list(got)}; vLLM drains them group by group, "
                f"each in the order they were handed out: {want}")
