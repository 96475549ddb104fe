"""Fine-grained partial hash hits (capability ``fine_grained_hits``, vLLM 0.33;
docs/semantics.md#fine-grained-partial-hits): which layouts have them, and the copies the
harness drains.

vLLM 0.33 turns them on (``KVCacheCoordinator.enable_partial_hash_hits``,
``kv_cache_utils.partial_hash_hits_enabled``) when prefix caching is on, a Mamba group in mode
"align" has a block larger than the hash block (the gcd of the groups' block sizes), and every
other group either looks hits up at hash-block granularity (full attention, Mamba) or has the
hash block as its block (a sliding window or chunked-local group of another size keeps them
off). Hits then end on hash-block boundaries; a hit ending inside a block is redirected by
``allocate_slots`` to a private copy-on-write (CoW) block, the first of the new ids, which
replaces the hit block at that index of the request's table; a Mamba group also copies a
running request's own partial tail state to a new block (its table unchanged). The copies,
``(src, dst)`` pairs, are drained by ``take_kv_cache_block_copies()``
(``kvcheck.conformance.protocol.SupportsBlockCopies``), which also releases the references
they retained.

The driver (``kvcheck.conformance.driver``) drains them where vLLM's ``schedule()`` does: at
the end of a step's allocations, before the next step starts and before any op that is not
part of a schedule. The guard (``kvcheck.conformance.guard``) follows the CoW tables and
checks each drained pair (``CowLedger``).
"""

from __future__ import annotations

import math

from kvcheck.conformance.protocol import KVCacheSpec

__all__ = ["CAPABILITY", "CowLedger", "block_copies", "fine_grained_hits", "hash_block_size",
           "partial_hit_groups"]

#: The capability that declares the feature (needs ``mamba``).
CAPABILITY = "fine_grained_hits"
#: Group kinds whose lookups go down to the hash block (vLLM's
#: ``supports_fine_grained_hash_lookup``: ``FullAttentionManager`` and ``MambaManager``).
_FINE_KINDS = frozenset({"full_attention", "mamba"})


def hash_block_size(spec: KVCacheSpec) -> int:
    """The hash block of ``spec`` as vLLM 0.33 resolves it (``resolve_kv_cache_block_sizes``):
    one group's block; with several groups and caching on, ``prefix_match_unit`` or else the
    gcd of their block sizes (DCP-scaled: ``group_block_size``), unless a Mamba group is not
    in mode "align" (then the scheduler block, their lcm); with caching off the scheduler
    block."""
    sizes = [spec.group_block_size(g) for g in range(len(spec.groups))]
    if len(sizes) == 1:
        return sizes[0]
    if not spec.enable_caching or any(
            g.kind == "mamba" and g.mamba_cache_mode != "align" for g in spec.groups):
        return math.lcm(*sizes)
    return spec.prefix_match_unit or math.gcd(*sizes)


def fine_grained_hits(spec: KVCacheSpec) -> bool:
    """Whether vLLM 0.33 has fine-grained partial hash hits in ``spec``'s layout (see the
    module doc; never under ``vllm-0.10``, which has no Mamba prefix caching)."""
    if spec.profile == "vllm-0.10" or not spec.enable_caching or len(spec.groups) < 2:
        return False
    hashed = hash_block_size(spec)
    sizes = [spec.group_block_size(g) for g in range(len(spec.groups))]
    # Under DCP a Mamba block equal to the hash block is enough (vLLM scales the attention
    # blocks instead: partial_hash_hits_enabled).
    dcp = spec.dcp_world_size > 1
    if not any(g.kind == "mamba" and g.mamba_cache_mode == "align"
               and (size >= hashed if dcp else size > hashed)
               for g, size in zip(spec.groups, sizes, strict=True)):
        return False
    return all(g.kind in _FINE_KINDS or size == hashed
               for g, size in zip(spec.groups, sizes, strict=True))


def block_copies(spec: KVCacheSpec) -> bool:
    """Whether vLLM 0.33 may make copy-on-write copies in ``spec``'s layout, which its
    ``schedule()`` drains every step: where it has fine-grained hits, and also wherever a
    Mamba "align" group's block is larger than the hash block, fine-grained lookups on or
    not. ``MambaManager._cache_partial_tail_block`` keys a running request's prompt tail state
    inside its block looking at the hash block only (a sliding-window or chunked-local group
    turns the lookups off, not that key), and the request's next ``allocate_slots`` copies
    that block (its table unchanged), the copy retaining both blocks until drained
    (``single_type_kv_cache_manager.py:1878-1912, 2084-2130``)."""
    if fine_grained_hits(spec):
        return True
    if spec.profile == "vllm-0.10" or not spec.enable_caching or len(spec.groups) < 2:
        return False
    hashed = hash_block_size(spec)
    return any(g.kind == "mamba" and g.mamba_cache_mode == "align"
               and spec.group_block_size(i) > hashed for i, g in enumerate(spec.groups))


def partial_hit_groups(spec: KVCacheSpec, hits: list[list[int]], num_hit: int) -> list[int]:
    """The groups whose hit of ``num_hit`` tokens ends inside a block (vLLM's
    ``_has_partial_local_hit``: a non-empty hit list and ``num_hit`` not a multiple of the
    group's block): their last hit block is copied on write by ``allocate_slots``."""
    return [g for g, ids in enumerate(hits)
            if ids and num_hit % spec.group_block_size(g)]


class CowLedger:
    """The copy-on-write blocks the guard saw replace a hit in a table, not yet drained: per
    pair the request, group and index, and the hit block (``src``) it replaced with the new
    block ``dst``."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        #: (rid, group, index, src, dst), in the order the tables showed them.
        self.pending: list[tuple[str, int, int, int, int]] = []

    def record(self, rid: str, group: int, index: int, src: int, dst: int) -> None:
        """``rid``'s table shows ``dst`` in place of its hit block ``src`` at ``index`` of
        group ``group`` (kept until drained, even if ``rid`` is freed first: vLLM keeps the
        copy pending and both blocks retained)."""
        self.pending.append((rid, group, index, src, dst))

    def take(self) -> list[tuple[str, int, int, int, int]]:
        """The replacements seen since the last call (and forget them)."""
        pending, self.pending = self.pending, []
        return pending
