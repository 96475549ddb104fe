"""Profile-independent laws checked on an implementation after every op, with or without
an oracle (they are all that ``--kv-profile=generic`` checks besides its scripted tests).

One law set for one and many KV-cache groups (docs/semantics.md#kv-cache-groups-hybrid-models):
the driver hands every answer over as one list of block ids per group
(``kvcheck.conformance.groups``), a single-group spec being the one-group case, whose messages
name no group. With ``start`` the tokens a request had computed when its last
``allocate_slots`` was called (its new cache hits included) and, per group, ``k =
skipped(start) // block_size`` (``skipped``: ``max(0, n - w + 1)`` for a window ``w``,
``n // c * c`` for a chunk ``c``, 0 for full attention):

* conservation: ``num_free_blocks()`` + distinct blocks held by live requests (in all groups:
  one pool) equals the ``num_free_blocks()`` of the fresh pool;
* ownership: a request holds enough blocks for its computed tokens in every group, none
  twice, none of the reserved ids (``reserved_block_ids``: vLLM's null block 0; none under
  ``generic`` unless declared); with several groups a live id sits in one group of one
  request, or in several requests at the same group and position (shared through a hit);
  free and held blocks are disjoint (``free_queue_order``); ``ref_cnt`` equals the number of
  holders for every other id (``ref_counts``; with ``ImplInfo.ref_cnt_counts_cache`` one more
  where the cache may hold the block: ``kvcheck.conformance.cache_refs``);
* null block (several groups): id 0 is never in the free queue, never in a full-attention
  table or hit list (the guard keeps it out of new blocks);
* window: a sliding-window or chunked-local table holds no live block below index ``k``
  (vLLM 0.10.2 keeps one more block of a chunked group: its "last cached block") and no null
  block from index ``k`` on (a position the window still needs);
* all-or-nothing: a refused ``allocate_slots`` (None) leaves a new request without blocks
  (conservation and ``ref_cnt`` see a block it kept; with several groups the guard reads the
  tables back) and changes a running one's tables only by nulling skipped positions (the
  guard and the window law judge which);
* pins (``pinning_lookup``, ``kvcheck.conformance.pinning``): a block pinned by a lookup not
  yet followed by ``allocate_slots`` or ``release_computed`` counts as held by the request
  that looked it up (conservation, the free queue, ``ref_cnt``);
* no shared write (``kvcheck.conformance.shared_writes``), per group: the blocks an
  ``allocate_slots`` makes the forward pass write (its new tokens' positions) are held by no
  other live request and pinned by no other lookup (the null block is never written);
* rebinding (``dedup_on_insert``, ``kvcheck.conformance.rebinding``; one group): a table entry
  the guard accepted as rebound to an identical block released its old block (held by another
  request, or free);
* hit caps: ``get_computed_blocks`` returns whole blocks covering exactly the hit tokens in
  every group (nulls included), at most ``num_tokens - 1`` tokens; with EAGLE
  (``KVCacheSpec.use_eagle``) at most ``num_tokens // H * H - H`` (``H`` the hash block: the
  hit drops its last block); with hash lookahead ``L`` (``KVCacheSpec.
  num_hash_lookahead_tokens``) at most ``(num_tokens - L) // H * H`` (only blocks whose ``L``
  next tokens exist are hashed); its nulls obey the window law for the hit length;
* hit correctness: every live block ``get_computed_blocks`` returns at index ``i`` of a group
  holds exactly the request's tokens ``[0, (i + 1) * block_size)`` under the same LoRA / salt
  / multimodal context. ``WrittenBlocks`` (``kvcheck.conformance.written``, one per group) is
  the shadow record of what the suite's scheduler wrote into each block, so the law holds
  whatever the hashing scheme (stale hits after reuse, content-only hashes and broken chains
  all fail it);
* multi-module MTP (``KVCacheSpec.num_prefill_lookahead`` K > 1, one group, or several with
  EAGLE): a full block a hit returns (Mamba groups aside) is *final*: some request computed
  ``K - 1`` tokens past its end while holding it (``WrittenBlocks.is_final``), as vLLM 0.33
  caches nothing of the re-prefillable tail (docs/semantics.md#multi-module-mtp);
* fine-grained partial hits (``kvcheck.conformance.fine_grained``; vLLM 0.33 beside a Mamba
  "align" group larger than the hash block): a hit ends on a hash-block boundary and may end
  inside a block, whose first ``num_hit % block_size`` tokens (a Mamba group: the state after
  exactly them) must then be the request's, after its own prefix; the block is copied on write
  by ``allocate_slots``, and the copy-on-write law is the no-shared-write law above (a request
  never writes into a shared block); the copy-on-write block is private and the copies are
  drained once (the guard: ``kvcheck.conformance.guard``). Between a step's allocations and
  the drain of its copies (``Driver.copies_pending``) the pool laws (conservation, the free
  queue, ``ref_cnt``) wait: the blocks a copy retains are neither free nor held until then;
* full sequence (vLLM 0.33's admission gate ``full_sequence_must_fit``, capability
  ``admission_gates``; ``check_full_sequence_fit``): in a layout of full-attention groups, an
  admission it let through leaves free at least what the rest of the request's full sequence
  needs, ``sum_g (cdiv(min(num_tokens, max_model_len), bs_g) - len(table_g))``, plus the
  watermark when it applied (``int(watermark * num_blocks)``, a request that held no blocks
  with ``has_scheduled_reqs``). A refused gate changes nothing: the all-or-nothing law.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcheck.conformance.cache_refs import ref_count_problems
from kvcheck.conformance.fine_grained import hash_block_size
from kvcheck.conformance.groups import NULL_BLOCK, null_floor, null_of, window_slack
from kvcheck.conformance.mamba_checkpoints import checkpoint_groups
from kvcheck.conformance.pinning import ledger_of
from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.conformance.rebinding import check_rebindings
from kvcheck.conformance.shared_writes import check_shared_writes
from kvcheck.conformance.written import WrittenBlocks

if TYPE_CHECKING:
    from kvcheck.conformance.subject import Driven

__all__ = ["check_hits", "check_laws", "check_pool", "eagle_drop_groups", "mtp_lag"]


def eagle_drop_groups(spec: KVCacheSpec) -> frozenset[int]:
    """The groups whose hits drop EAGLE's block (vLLM 0.33's ``drop_eagle_group_ids``, widened
    to spec groups): none without ``use_eagle``; with it the groups flagged
    ``is_eagle_group`` and every group of an equal spec (searched together, vLLM's
    ``SpecGroup.use_eagle``), or every group when none is flagged (vLLM's fallback)."""
    if not spec.use_eagle:
        return frozenset()
    groups = spec.groups
    # A group's spec without its flag, its block size resolved (None means the spec's).
    bare = [dataclasses.replace(g, is_eagle_group=False,
                                block_size=spec.group_spec_block_size(i))
            for i, g in enumerate(groups)]
    flagged = {bare[i] for i, g in enumerate(groups) if g.is_eagle_group}
    return frozenset(i for i in range(len(groups)) if not flagged or bare[i] in flagged)


def mtp_lag(spec: KVCacheSpec, group: int | None = None) -> int:
    """The re-prefillable tokens vLLM 0.33 leaves uncached for ``spec``'s multi-module MTP
    (``num_prefill_lookahead - 1``), where it does: caching on, one group (its unitary
    coordinator, any ``use_eagle``) or EAGLE's groups of several (its hybrid coordinator
    lags only those: with ``group``, only a group of ``eagle_drop_groups``); 0 otherwise."""
    if spec.num_prefill_lookahead < 2 or not spec.enable_caching:
        return 0
    if len(spec.groups) == 1:
        return spec.num_prefill_lookahead - 1
    if not spec.use_eagle or (group is not None and group not in eagle_drop_groups(spec)):
        return 0
    return spec.num_prefill_lookahead - 1


def check_laws(driver: Driven) -> list[str]:
    """The broken laws (empty when all hold). Each message names its terms.

    Also drains the hit-correctness problems the driver recorded while running the last op
    (they are judged when ``get_computed_blocks`` answers, before the op writes anything).
    """
    problems: list[str] = driver.take_law_problems()
    spec = driver.spec
    tables = driver.tables()
    grouped = bool(spec.kv_cache_groups)
    # live id -> [(rid, group, index)] (several groups: ownership is judged by place)
    where: dict[int, list[tuple[str, int, int]]] = {}
    holders: Counter[int] = Counter()
    for rid, groups in tables.items():
        computed = driver.views[rid].num_computed_tokens
        for g, ids in enumerate(groups):
            problems += _table_problems(driver, rid, g, ids, computed)
            if grouped:
                problems += _window_problems(spec, rid, g, ids,
                                             driver.last_start.get(rid, computed), computed)
                for i, b in enumerate(ids):
                    if b != NULL_BLOCK:
                        where.setdefault(b, []).append((rid, g, i))
            else:
                holders.update(ids)
    if grouped:
        # A prefill checkpoint sits at its producer's column and at a hit's state index:
        # vLLM 0.33 places them apart (docs/semantics.md#mamba-prefill-checkpoints).
        problems += _placement_problems(where, checkpoint_groups(spec))
        # Holders are requests: one holding a block twice (reported above) counts once.
        holders = Counter(b for b, places in where.items() for _ in {p[0] for p in places})
    # No write into a shared block (group by group: the null block is never written), and
    # rebindings that released their old block (the modules say why).
    problems += check_shared_writes(driver.write_log, holders, lambda: tables,
                                    ledger_of(driver.manager), grouped=grouped)
    if grouped:
        if not driver.copies_pending:
            problems += check_pool(driver, holders,
                                   held="live blocks held by live requests in all groups",
                                   pool="one pool shared by every group; ",
                                   null_block=NULL_BLOCK)
    else:
        problems += check_pool(driver, holders)
    return problems + check_rebindings(
        driver.rebindings, holders, manager=driver.manager,
        free_queue="free_queue_order" in driver.capabilities, initial_free=driver.initial_free)


def _table_problems(driver: Driven, rid: str, g: int, ids: list[int],
                    computed: int) -> list[str]:
    """Range and length of request ``rid``'s table of group ``g``; with one group also no id
    twice and no reserved id (several groups: ``_placement_problems``, the guard)."""
    spec = driver.spec
    grouped = bool(spec.kv_cache_groups)
    who = f"request {rid!r} group {g}" if grouped else f"request {rid!r}"
    problems: list[str] = []
    bad = [b for b in ids if not 0 <= b < spec.num_blocks]
    if bad:
        problems.append(f"{who} holds out-of-range block ids {bad}")
    if not grouped:
        if len(set(ids)) != len(ids):
            dup = sorted(b for b, n in Counter(ids).items() if n > 1)
            problems.append(f"{who} holds blocks {dup} more than once")
        held_reserved = [b for b in ids if b in driver.reserved]
        if held_reserved:
            problems.append(f"reserved blocks: {who} holds {held_reserved}, which the design "
                            f"reserves (reserved_block_ids {list(driver.reserved)})")
    bs = spec.group_block_size(g)
    if grouped and spec.groups[g].kind == "cross_attention":
        # Sized by the request's encoder tokens, whatever the decoder computed.
        encoder = driver.encoder_tokens.get(rid, 0)
        if len(ids) != -(-encoder // bs):
            problems.append(
                f"cross attention: request {rid!r} group {g} holds {len(ids)} blocks of {bs} "
                f"for its {encoder} encoder tokens (num_encoder_tokens at its admission); "
                f"a cross-attention table holds exactly cdiv({encoder}, {bs}) = "
                f"{-(-encoder // bs)} blocks until the request is freed")
        return problems
    if grouped and spec.groups[g].kind == "mamba":
        # A state block per computed block position, plus the speculative blocks: their
        # slots at the group's own block size, which only vLLM 0.10.2 under DCP scales (its
        # MambaManager divides them by the DCP-scaled block; else cdiv(computed, bs) + extra).
        extra = spec.groups[g].num_speculative_blocks
        slots = computed + extra * spec.group_spec_block_size(g)
        if len(ids) < -(-slots // bs):
            problems.append(
                f"mamba: request {rid!r} group {g} holds {len(ids)} entries of {bs} tokens for "
                f"{computed} computed tokens and {extra} speculative blocks of "
                f"{spec.group_spec_block_size(g)} slots; a Mamba table has at least "
                f"cdiv({slots}, {bs}) = {-(-slots // bs)} entries (nulls included)")
        return problems
    if len(ids) < -(-computed // bs):
        has = f"but group {g} has only" if grouped else "but only"
        problems.append(f"request {rid!r} has {computed} computed tokens {has} {len(ids)} "
                        f"blocks of {bs}")
    return problems


def _window_problems(spec: KVCacheSpec, rid: str, g: int, ids: list[int],
                     start: int, computed: int) -> list[str]:
    """The null-block and window laws of request ``rid``'s table of group ``g``, ``start``
    tokens computed at its last ``allocate_slots`` (``computed`` now)."""
    group = spec.groups[g]
    kind = group.kind
    nulls = [i for i, b in enumerate(ids) if b == NULL_BLOCK]
    if kind in ("full_attention", "cross_attention") or (
            kind == "mamba" and spec.profile == "vllm-0.10"):  # nothing is ever skipped
        return [(f"null block: request {rid!r} {kind.replace('_', '-')} group {g} holds the "
                 f"null block at indices {nulls}")] if nulls else []
    floor = null_floor(spec, g, start)
    if kind == "mamba" and group.mamba_cache_mode == "align":
        return _mamba_align_problems(rid, g, ids, nulls, floor, start, computed,
                                     spec.group_block_size(g))
    problems: list[str] = []
    live_low = [i for i, b in enumerate(ids[:max(0, floor - window_slack(spec, g))])
                if b != NULL_BLOCK]
    if live_low:
        problems.append(
            f"window: request {rid!r} group {g} ({kind}) still holds live blocks "
            f"{[ids[i] for i in live_low]} at indices {live_low}, which its window skipped "
            f"({start} tokens computed at its last allocate_slots: indices below {floor} "
            f"must be the null block {NULL_BLOCK})")
    # Multi-module MTP: the positions a window retains below it may be live or null (a hit
    # brings none), so nulls are judged against the floor of the window itself.
    reads = null_floor(spec, g, start, retained=False)
    needed = [i for i in nulls if i >= reads]
    if needed:
        problems.append(
            f"window: request {rid!r} group {g} ({kind}) holds the null block at indices "
            f"{needed}, which its window still needs ({start} tokens computed at its last "
            f"allocate_slots: only indices below {reads} are skipped)")
    return problems


def _mamba_align_problems(rid: str, g: int, ids: list[int], nulls: list[int], floor: int,
                          start: int, computed: int, bs: int) -> list[str]:
    """A Mamba "align" table (docs/semantics.md#mamba-groups): no live block below the
    skipped boundary of ``start`` (``(start - 1) // bs``: the states of two steps ago are
    freed and nulled), and no null from the block holding the last computed token's state
    (index ``(computed - 1) // bs``) on: that state and the speculative blocks after it.
    Between the two the table may hold nulls (the positions a step skipped over)."""
    problems: list[str] = []
    live_low = [i for i in range(min(floor, len(ids))) if ids[i] != NULL_BLOCK]
    if live_low:
        problems.append(
            f"mamba: request {rid!r} group {g} still holds live blocks "
            f"{[ids[i] for i in live_low]} at indices {live_low}, states its Mamba group no "
            f"longer reads ({start} tokens computed at its last allocate_slots: indices below "
            f"{floor} must be the null block {NULL_BLOCK})")
    state = (computed - 1) // bs if computed else len(ids)
    needed = [i for i in nulls if i >= state]
    if needed:
        problems.append(
            f"mamba: request {rid!r} group {g} holds the null block at indices {needed}, at "
            f"or after the block of its last computed token's state (index {state}, "
            f"{computed} tokens computed): that state and the speculative blocks after it "
            "are live")
    return problems


def _placement_problems(where: dict[int, list[tuple[str, int, int]]],
                        checkpoint_groups: frozenset[int] = frozenset()) -> list[str]:
    """Several groups: a live id sits in one request once, or in several at one place. In a
    group of ``checkpoint_groups`` (Mamba "align" with prefill checkpoint blocks) a block
    shared within the group may sit at different indices: a checkpoint holds the state after
    its position ``p``, written at its producer's column ``cdiv(end, block_size) - 2``, and
    a later request hits it at ``p // block_size - 1``, lower where ``p`` ends before that
    column (hash lookahead ``L >= 2``: ``p = end - L``; a coarser hit alignment rounding
    ``p`` down). Hit correctness judges its content (``WrittenBlocks.write_state``)."""
    problems: list[str] = []
    for b, places in where.items():
        rids = [p[0] for p in places]
        if len(set(rids)) != len(rids):
            problems.append(f"block {b} is held twice by one request: {places} "
                            "(request, group, index)")
        elif len({g for _, g, _ in places}) == 1 and places[0][1] in checkpoint_groups:
            continue
        elif len({(g, i) for _, g, i in places}) > 1:
            problems.append(f"block {b} is held at different groups or positions {places} "
                            "(request, group, index); only a cache hit (same group, same "
                            "position) may be shared")
    return problems


def check_pool(driver: Driven, holders: Counter[int], *,
               held: str = "blocks held by live requests", pool: str = "",
               null_block: int | None = None) -> list[str]:
    """The laws of the one block pool every request draws from, given ``holders`` (each live
    block id, with its number of holders): conservation, the free queue
    (``free_queue_order``), ``ref_cnt`` (``ref_counts``) and the implementation's own
    ``check_invariants()`` (``invariants``).

    A multi-group spec words the conservation terms its way (``held``, and ``pool`` before
    the verdict) and passes its ``null_block``: never in the free queue, never counted by
    ``ref_cnt``.
    """
    problems: list[str] = []
    mgr, caps = driver.manager, driver.capabilities
    num_free = mgr.num_free_blocks()
    initial = driver.initial_free
    ledger = ledger_of(mgr)
    pins: Counter[int] = Counter() if ledger is None else ledger.holders()
    live = holders.keys() | pins.keys()  # pinned: held by the request that looked it up
    total = num_free + len(live)
    if total != initial:
        pinned = (f" or pinned by a lookup ({len(live)}, {len(live - holders.keys())} of them "
                  "pinned only)" if pins else f" ({len(holders)})")
        problems.append(
            f"conservation: num_free_blocks() ({num_free}) + distinct {held}{pinned} "
            f"= {total} != {initial}, the num_free_blocks() of the fresh pool "
            f"({pool}a block was {'lost' if total < initial else 'counted twice'})"
            + _pin_hint(driver, live, total < initial, bool(pins)))
    exempt = set() if null_block is None else {null_block}
    if "free_queue_order" in caps:
        queue = list(mgr.free_block_ids())
        if len(queue) != num_free:
            problems.append(f"free queue holds {len(queue)} blocks but num_free_blocks() "
                            f"is {num_free}")
        if null_block is not None and null_block in queue:
            problems.append(f"null block: the null block {null_block} is in the free queue "
                            f"at position {queue.index(null_block)}")
        queue_set = set(queue)
        held_and_free = sorted(queue_set.intersection(holders))
        if held_and_free:
            problems.append(f"blocks {held_and_free} are both free and held by a request")
        pinned_and_free = sorted(queue_set.intersection(pins) - holders.keys())
        if pinned_and_free and ledger is not None:
            problems.append(
                f"blocks {pinned_and_free} are both free and pinned by the lookup of request(s) "
                f"{sorted({r for b in pinned_and_free for r in ledger.pinners(b)})} "
                "(pinning_lookup: a pinned block is held until allocate_slots or "
                "release_computed, never free)")
        if len(queue_set) != len(queue):
            problems.append("the free queue lists a block twice")
        free_reserved = sorted(queue_set.intersection(driver.reserved) - exempt)
        if free_reserved:
            problems.append(f"reserved blocks {free_reserved} are in the free queue")
    if "ref_counts" in caps:
        problems += ref_count_problems(driver, holders, pins, exempt)
    if "invariants" in caps:
        try:
            mgr.check_invariants()
        except AssertionError as exc:
            problems.append(f"the implementation's own check_invariants(): {exc}")
    return problems


def _pin_hint(driver: Driven, live: set[int], lost: bool, pinned: bool) -> str:
    """What a conservation failure may owe to ``pinning_lookup``: for a lost block, the
    blocks whose pins ended and that nobody holds or pins now (free ones left out when the
    free queue shows them); for a block counted twice, that pinned blocks are not free."""
    ledger = ledger_of(driver.manager)
    if ledger is None:
        return ""
    if not lost:
        return ("; pinning_lookup: a block pinned by a lookup counts as held by the request "
                "that looked it up, so num_free_blocks() must not count it" if pinned else "")
    free_known = "free_queue_order" in driver.capabilities
    free = set(driver.manager.free_block_ids()) if free_known else set()
    return ledger.leak_hint(live | free, free_known=free_known)


def check_hits(written: Sequence[WrittenBlocks], spec: KVCacheSpec, view: RequestView,
               hits: Sequence[Sequence[int]], num_hit: int, *, fine_hash: int = 0) -> list[str]:
    """Hit caps, nulls and hit correctness of one ``get_computed_blocks(view) -> (hits,
    num_hit)`` answer (one list per group), judged against what was written into each block
    so far (``written``: one record per group). ``fine_hash``: the hash block of a layout
    with fine-grained partial hits (0: none), where a hit ends on a hash-block boundary and
    may end inside a block."""
    rid = view.request_id
    grouped = bool(spec.kv_cache_groups)
    null = null_of(spec)
    problems: list[str] = []
    cap: list[str] = []
    if num_hit > max(0, view.num_tokens - 1):
        cap.append(f"hit cap: get_computed_blocks({rid!r}) hit {num_hit} tokens of a "
                   f"{view.num_tokens}-token request; at most num_tokens - 1 = "
                   f"{view.num_tokens - 1} (the last token is always recomputed)")
    if not cap and spec.use_eagle:
        cap += _eagle_cap(spec, rid, view.num_tokens, num_hit)
    if not cap and spec.num_hash_lookahead_tokens:
        cap += _lookahead_cap(spec, rid, view.num_tokens, num_hit)
    if grouped:
        problems += cap
    if fine_hash and num_hit % fine_hash:
        problems.append(f"fine-grained hit: get_computed_blocks({rid!r}) hit {num_hit} tokens, "
                        f"not a multiple of the hash block ({fine_hash} tokens): a "
                        "fine-grained hit ends on a hash-block boundary")
    for g, ids in enumerate(hits):
        bs = spec.group_block_size(g)
        kind = spec.groups[g].kind
        partial = num_hit % bs if fine_hash and len(ids) == -(-num_hit // bs) else 0
        if len(ids) * bs != num_hit and not partial:
            if grouped:
                problems.append(
                    f"hit length: get_computed_blocks({rid!r}) returned {num_hit} tokens but "
                    f"group {g} ({kind}, block size {bs}) has {len(ids)} blocks = "
                    f"{len(ids) * bs} tokens; every group's list must cover exactly the "
                    "common hit length, nulls included")
                continue
            problems.append(f"hit cap: get_computed_blocks({rid!r}) returned {len(ids)} "
                            f"blocks of {bs} tokens but num_computed_tokens {num_hit} (whole "
                            "blocks only)")
        if not grouped:
            problems += cap
        else:
            problems += _hit_nulls(spec, rid, g, ids, num_hit)
        where = f" in group {g}" if grouped else ""
        for index, block_id in enumerate(ids):
            if block_id == null:
                continue
            if partial and index == len(ids) - 1:  # the hit ends inside this block
                problem = written[g].partial_mismatch(block_id, view, index, partial)
                if problem:
                    problems.append(
                        f"hit correctness: get_computed_blocks({rid!r}) returned block "
                        f"{block_id}{where} at index {index} for a hit ending inside it "
                        f"({num_hit} tokens: positions {index * bs}..{num_hit - 1}): "
                        f"{problem}")
                break
            problem = written[g].mismatch(block_id, view, index)
            if problem:
                problems.append(f"hit correctness: get_computed_blocks({rid!r}) returned block "
                                f"{block_id}{where} at index {index} (positions {index * bs}.."
                                f"{(index + 1) * bs - 1}): {problem}")
                break  # later blocks of a wrong chain say nothing new
            if written[g].lag and not written[g].is_final(block_id):
                lag = written[g].lag
                problems.append(
                    f"multi-module MTP: get_computed_blocks({rid!r}) returned block "
                    f"{block_id}{where} at index {index} (positions {index * bs}.."
                    f"{(index + 1) * bs - 1}), but no request computed {lag} tokens past it "
                    f"(num_prefill_lookahead {lag + 1}: the last {lag} computed tokens may be "
                    "re-prefilled, so vLLM 0.33 caches a block only once a request computed "
                    f"through position {(index + 1) * bs + lag - 1}; "
                    "docs/semantics.md#multi-module-mtp)")
                break
    return problems


def check_full_sequence_fit(spec: KVCacheSpec, view: RequestView, num_hit: int,
                            tables: Sequence[Sequence[int]], num_free: int,
                            watermarked: bool) -> list[str]:
    """The full-sequence law (module docstring) after an ``allocate_slots(...,
    full_sequence_must_fit=True)`` that answered blocks: ``tables`` the request's tables and
    ``num_free`` the free blocks after it. Whatever the gate counted (hits already held or in
    the free queue, each group's unclamped need), it admitted only if the free blocks covered
    the full sequence's need before the step, and the step took exactly the table's new
    entries and the hits it took out of the free queue: so what stays free covers the rest.
    Only layouts of full-attention groups (a window's admission cap and skipped blocks, and
    Mamba's state blocks, are judged by the golden scenarios and the oracle)."""
    if any(g.kind != "full_attention" for g in spec.groups):
        return []
    full = view.num_tokens if spec.max_model_len is None else min(view.num_tokens,
                                                                  spec.max_model_len)
    rest = sum(-(-full // spec.group_block_size(g)) - len(table)
               for g, table in enumerate(tables))
    watermark = int(spec.watermark * spec.num_blocks) if watermarked else 0
    if num_free >= rest + watermark:
        return []
    return [f"allocate_slots({view.request_id!r}, ..., full_sequence_must_fit=True) admitted a "
            f"request whose full sequence ({full} tokens, {num_hit} of them hit) does not fit: "
            f"{num_free} blocks are free after it but the rest of the sequence needs {rest}"
            + (f" plus the watermark's {watermark}" if watermark else "")
            + " (vLLM 0.33 refuses such an admission, returning None: "
            "docs/semantics.md#admission-gates)"]


def _eagle_cap(spec: KVCacheSpec, rid: str, num_tokens: int, num_hit: int) -> list[str]:
    """EAGLE's hit cap (``KVCacheSpec.use_eagle``): a hit drops the last block its search
    matched, at least one hash block, and the search never reads past the request's hashed
    tokens, so a hit is at most ``num_tokens // H * H - H`` tokens (``H``: the hash block).
    Only where some group drops (full attention or a sliding window of
    ``eagle_drop_groups``; a Mamba group's search never drops)."""
    if not any(spec.groups[g].kind in ("full_attention", "sliding_window")
               for g in eagle_drop_groups(spec)):
        return []
    hashed = hash_block_size(spec)
    most = max(0, num_tokens // hashed * hashed - hashed)
    if num_hit <= most:
        return []
    return [(f"EAGLE hit cap: get_computed_blocks({rid!r}) hit {num_hit} tokens of a "
             f"{num_tokens}-token request with use_eagle; a hit drops its last block (at "
             f"least one hash block of {hashed} tokens) of what the request's hashed tokens "
             f"match, so at most {most} (docs/semantics.md#prefix-cache-hits)")]


def _lookahead_cap(spec: KVCacheSpec, rid: str, num_tokens: int, num_hit: int) -> list[str]:
    """Hash lookahead's hit cap (``KVCacheSpec.num_hash_lookahead_tokens`` ``L``): a block is
    hashed only once the ``L`` tokens after it exist, and a hit covers hashed blocks only, so
    it is at most ``(num_tokens - L) // H * H`` tokens (``H``: the hash block)."""
    lookahead = spec.num_hash_lookahead_tokens
    hashed = hash_block_size(spec)
    most = max(0, (num_tokens - lookahead) // hashed * hashed)
    if num_hit <= most:
        return []
    return [(f"hash lookahead hit cap: get_computed_blocks({rid!r}) hit {num_hit} tokens of a "
             f"{num_tokens}-token request with num_hash_lookahead_tokens={lookahead}; a block "
             f"of {hashed} tokens is hashed only once the {lookahead} tokens after it exist, so "
             f"at most {most} (docs/semantics.md#request-block-hashes)")]


def _hit_nulls(spec: KVCacheSpec, rid: str, g: int, ids: Sequence[int],
               num_hit: int) -> list[str]:
    """The null-block and window laws of group ``g``'s hits, ``num_hit`` tokens long."""
    kind = spec.groups[g].kind
    nulls = [i for i, b in enumerate(ids) if b == NULL_BLOCK]
    if kind == "full_attention":
        return [(f"null block: get_computed_blocks({rid!r}) put the null block in "
                f"full-attention group {g} at indices {nulls}")] if nulls else []
    floor = null_floor(spec, g, num_hit, retained=False)  # a hit brings no retained block
    needed = [i for i in nulls if i >= floor]
    return [(f"window: get_computed_blocks({rid!r}) put the null block in group {g} ({kind}) "
            f"at indices {needed}, which a {num_hit}-token hit still needs (only indices "
            f"below {floor} are skipped)")] if needed else []
