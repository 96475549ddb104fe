"""The ref-count law under both conventions of ``ImplInfo.ref_cnt_counts_cache`` (issue 24
item 6), with the pins of ``pinning_lookup`` (``kvcheck.conformance.pinning``) counted.

For every ordinary block ``b`` (not reserved, not the null block of a multi-group spec) let
``n(b)`` be the number of live requests holding ``b`` in their block tables plus the number
of outstanding lookups pinning it (``pinning_lookup`` only: a pin is a reference held for the
request that looked the block up).

* ``ref_cnt_counts_cache=False`` (the default, vLLM's convention): ``ref_cnt(b) == n(b)``.
* ``ref_cnt_counts_cache=True`` (radix / trie caches, whose tree holds a reference on each
  node): ``ref_cnt(b)`` is ``n(b)`` or ``n(b) + 1`` where ``b`` *may be cached*, and exactly
  ``n(b)`` everywhere else. A block may be cached when the spec has caching on
  (``enable_caching``) and kvcheck's shadow record of the writes (``WrittenBlocks``) says it
  holds a full block of computed tokens: a block handed out anew and not yet filled, a
  partial last block, a block of speculative slots or one of mixed writes never may. Whether
  the design still keeps such a block cached (it may have evicted it, deduplicated it or not
  inserted it yet) is the design's choice; kvcheck cannot see its tree, hence both values.

Free counts do not depend on the convention: ``num_free_blocks()`` counts every block that no
request holds or pins, cached (evictable) or not, so a cached block nobody holds is free
although its ref_cnt is 1 under ``ref_cnt_counts_cache=True``; conservation
(``kvcheck.conformance.laws.check_pool``) is the same law for both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import TYPE_CHECKING

from kvcheck.conformance.guard import read_ref_cnts

if TYPE_CHECKING:
    from kvcheck.conformance.protocol import ImplInfo
    from kvcheck.conformance.subject import Driven

__all__ = ["allowed_ref_cnts", "may_be_cached", "ref_count_problems"]


def allowed_ref_cnts(info: ImplInfo, n: int, *, cached: bool) -> frozenset[int]:
    """The ``ref_cnt`` values the law accepts for a block with ``n`` holders and pins, as
    ``info``'s convention reads it: ``{n}``, or ``{n, n + 1}`` for a block that may be cached
    (``cached``) when ``ref_cnt`` counts the cache's own reference."""
    if info.ref_cnt_counts_cache and cached:
        return frozenset({n, n + 1})
    return frozenset({n})


def may_be_cached(driver: Driven) -> frozenset[int]:
    """The blocks that may hold the cache's own reference: with caching on, those the
    shadow record shows holding a full block of computed tokens (any KV-cache group's)."""
    if not driver.spec.enable_caching:
        return frozenset()
    full: set[int] = set()
    for written in driver.written:
        full.update(written.full_blocks())
    return frozenset(full)


def ref_count_problems(driver: Driven, holders: Counter[int], pins: Counter[int],
                       exempt: Collection[int]) -> list[str]:
    """The ref-count law over every ordinary block but ``exempt`` (see the module doc):
    ``holders`` counts the live requests holding each block, ``pins`` the outstanding
    lookups pinning it."""
    mgr = driver.manager
    counts_cache = driver.impl.info.ref_cnt_counts_cache
    cached = may_be_cached(driver) if counts_cache else frozenset()
    problems: list[str] = []
    ids = [b for b in driver.ordinary_block_ids if b not in exempt]
    for block_id, rc in zip(ids, read_ref_cnts(mgr, ids), strict=True):
        held, pinned = holders[block_id], pins[block_id]
        n = held + pinned
        if rc == n or (rc == n + 1 and block_id in cached):
            continue
        text = f"block {block_id}: ref_cnt {rc} but {held} request(s) hold it"
        notes = []
        if pinned:
            notes.append(f"{pinned} lookup(s) pin it, and with pinning_lookup each pin is a "
                         f"reference until allocate_slots or release_computed: {n} expected")
        if counts_cache:
            notes.append(_cache_note(driver, block_id in cached, n))
        if notes:
            text += f" ({'; '.join(notes)})"
        problems.append(text)
    return problems


def _cache_note(driver: Driven, cached: bool, n: int) -> str:
    """What ``ref_cnt_counts_cache=True`` allows for a block with ``n`` holders and pins."""
    if cached:
        return (f"ref_cnt_counts_cache: {n} or {n + 1} with the cache's own reference, as it "
                "holds a full block of computed tokens")
    why = ("caching is off (enable_caching=False)" if not driver.spec.enable_caching else
           "it holds no full block of computed tokens, which alone the cache may keep")
    return f"ref_cnt_counts_cache: exactly {n}, as {why}"
