"""Profile-independent laws of a multi-group (hybrid) manager, checked after every op of a
``HybridDriver`` (docs/semantics.md#kv-cache-groups-hybrid-models), with or without an oracle.

Block id 0 is the null block: the position of a block a sliding window (or a finished local
chunk) no longer needs. With ``start`` the tokens a request had computed when its last
``allocate_slots`` was called (its new cache hits included) and, per group, ``k =
skipped(start) // block_size`` (``skipped``: ``max(0, n - w + 1)`` for a window ``w``,
``n // c * c`` for a chunk ``c``, 0 for full attention):

* null block: never handed out as a new block, never in the free queue, never in a
  full-attention table or hit list;
* window: a sliding-window or chunked-local table holds no live block below index ``k`` (vLLM
  0.10.2 keeps one more block of a chunked group: its "last cached block") and no null block
  from index ``k`` on (a position the window still needs);
* hit length: ``get_computed_blocks`` answers one list per group covering exactly the hit
  tokens at that group's block size (nulls included), at most ``num_tokens - 1`` tokens; its
  nulls obey the window law for the hit length; every live hit block holds exactly the
  request's tokens of its position (``WrittenBlocks`` per group);
* conservation of the one shared pool: ``num_free_blocks()`` + distinct live blocks held =
  the fresh pool's ``num_free_blocks()``;
* no shared write (``kvcheck.conformance.shared_writes``), per group: the blocks at the
  positions an ``allocate_slots`` makes the forward pass write are held by no other live
  request in any group (the null block is never written, so never judged);
* ownership: a live block id sits in one group of one request, or in several requests at the
  same group and position (shared through a hit), never twice in one request; free and held
  blocks are disjoint; ``ref_cnt`` = holders (``ref_counts``);
* all-or-nothing: a refused ``allocate_slots`` (None) leaves a new request without blocks and
  changes a running one's tables only by nulling skipped positions (``guard`` and the window
  law judge which).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcheck.conformance.laws import WrittenBlocks, check_pool
from kvcheck.conformance.pinning import ledger_of
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, RequestView
from kvcheck.conformance.shared_writes import check_shared_writes

if TYPE_CHECKING:
    from kvcheck.conformance.hybrid_driver import HybridDriver

__all__ = ["NULL_BLOCK", "check_hybrid_hits", "check_hybrid_laws", "null_floor",
           "skipped_tokens"]

NULL_BLOCK = 0


def skipped_tokens(group: KVCacheGroupSpec, num_tokens: int) -> int:
    """vLLM 0.33's ``get_num_skipped_tokens`` of ``group`` after ``num_tokens`` computed
    tokens (docs/semantics.md#skipped-tokens-and-null-blocks)."""
    if group.kind == "sliding_window" and group.sliding_window is not None:
        return max(0, num_tokens - group.sliding_window + 1)
    if group.kind == "chunked_local_attention" and group.attention_chunk_size is not None:
        return num_tokens // group.attention_chunk_size * group.attention_chunk_size
    return 0


def null_floor(spec: KVCacheSpec, group: int, num_tokens: int) -> int:
    """The number of leading positions of ``group`` a request with ``num_tokens`` computed
    tokens no longer needs (its nulls must all lie below it)."""
    return skipped_tokens(spec.groups[group], num_tokens) // spec.group_block_size(group)


def _slack(spec: KVCacheSpec, group: int) -> int:
    """Live blocks below the floor a profile keeps: vLLM 0.10.2's chunked-local removal keeps
    the last cached block (docs/semantics.md#skipped-tokens-and-null-blocks)."""
    kind = spec.groups[group].kind
    return 1 if spec.profile == "vllm-0.10" and kind == "chunked_local_attention" else 0


def check_hybrid_hits(written: Sequence[WrittenBlocks], spec: KVCacheSpec, view: RequestView,
                      hits: Sequence[Sequence[int]], num_hit: int) -> list[str]:
    """The hit laws of one ``get_computed_blocks(view) -> (hits, num_hit)`` answer."""
    rid = view.request_id
    problems: list[str] = []
    if num_hit > max(0, view.num_tokens - 1):
        problems.append(f"hit cap: get_computed_blocks({rid!r}) hit {num_hit} tokens of a "
                        f"{view.num_tokens}-token request; at most num_tokens - 1 = "
                        f"{view.num_tokens - 1} (the last token is always recomputed)")
    for g, ids in enumerate(hits):
        bs = spec.group_block_size(g)
        kind = spec.groups[g].kind
        if len(ids) * bs != num_hit:
            problems.append(
                f"hit length: get_computed_blocks({rid!r}) returned {num_hit} tokens but group "
                f"{g} ({kind}, block size {bs}) has {len(ids)} blocks = {len(ids) * bs} tokens; "
                "every group's list must cover exactly the common hit length, nulls included")
            continue
        floor = null_floor(spec, g, num_hit)
        nulls = [i for i, b in enumerate(ids) if b == NULL_BLOCK]
        if kind == "full_attention" and nulls:
            problems.append(f"null block: get_computed_blocks({rid!r}) put the null block in "
                            f"full-attention group {g} at indices {nulls}")
        elif any(i >= floor for i in nulls):
            problems.append(
                f"window: get_computed_blocks({rid!r}) put the null block in group {g} ({kind}) "
                f"at indices {[i for i in nulls if i >= floor]}, which a {num_hit}-token hit "
                f"still needs (only indices below {floor} are skipped)")
        for index, block_id in enumerate(ids):
            if block_id == NULL_BLOCK:
                continue
            problem = written[g].mismatch(block_id, view, index)
            if problem:
                problems.append(f"hit correctness: get_computed_blocks({rid!r}) returned block "
                                f"{block_id} in group {g} at index {index} (positions "
                                f"{index * bs}..{(index + 1) * bs - 1}): {problem}")
                break
    return problems


def check_hybrid_laws(driver: HybridDriver) -> list[str]:
    """The broken hybrid laws after the last op (empty when all hold); also drains the hit
    problems the driver recorded while running it."""
    problems: list[str] = driver.take_law_problems()
    spec = driver.spec
    tables = driver.group_tables()
    # live id -> [(rid, group, index)]
    where: dict[int, list[tuple[str, int, int]]] = {}
    for rid, groups in tables.items():
        computed = driver.views[rid].num_computed_tokens
        start = driver.last_start.get(rid, computed)
        for g, ids in enumerate(groups):
            bs = spec.group_block_size(g)
            kind = spec.groups[g].kind
            bad = [b for b in ids if not 0 <= b < spec.num_blocks]
            if bad:
                problems.append(f"request {rid!r} group {g} holds out-of-range block ids {bad}")
            if len(ids) < -(-computed // bs):
                problems.append(f"request {rid!r} has {computed} computed tokens but group {g} "
                                f"has only {len(ids)} blocks of {bs}")
            nulls = [i for i, b in enumerate(ids) if b == NULL_BLOCK]
            floor = null_floor(spec, g, start)
            if kind == "full_attention":
                if nulls:
                    problems.append(f"null block: request {rid!r} full-attention group {g} "
                                    f"holds the null block at indices {nulls}")
            else:
                live_low = [i for i, b in enumerate(ids[:max(0, floor - _slack(spec, g))])
                            if b != NULL_BLOCK]
                if live_low:
                    problems.append(
                        f"window: request {rid!r} group {g} ({kind}) still holds live blocks "
                        f"{[ids[i] for i in live_low]} at indices {live_low}, which its "
                        f"window skipped ({start} tokens computed at its last allocate_slots:"
                        f" indices below {floor} must be the null block {NULL_BLOCK})")
                needed = [i for i in nulls if i >= floor]
                if needed:
                    problems.append(
                        f"window: request {rid!r} group {g} ({kind}) holds the null block at "
                        f"indices {needed}, which its window still needs ({start} tokens "
                        f"computed at its last allocate_slots: only indices below {floor} "
                        "are skipped)")
            for i, b in enumerate(ids):
                if b != NULL_BLOCK:
                    where.setdefault(b, []).append((rid, g, i))
    for b, places in where.items():
        rids = [p[0] for p in places]
        if len(set(rids)) != len(rids):
            problems.append(f"block {b} is held twice by one request: {places} "
                            "(request, group, index)")
        elif len({(g, i) for _, g, i in places}) > 1:
            problems.append(f"block {b} is held at different groups or positions {places} "
                            "(request, group, index); only a cache hit (same group, same "
                            "position) may be shared")
    # Holders are requests: one holding a block twice (reported above) counts once.
    holders = Counter(b for b, places in where.items() for _ in {p[0] for p in places})
    # No write into a shared block, group by group (the null block is never written).
    problems += check_shared_writes(driver.write_log, holders, lambda: tables,
                                    ledger_of(driver.manager), grouped=True)
    return problems + check_pool(
        driver, holders, held="live blocks held by live requests in all groups",
        pool="one pool shared by every group; ", null_block=NULL_BLOCK)
