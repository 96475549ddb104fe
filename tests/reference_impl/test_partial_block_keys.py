"""Partial-block keys (docs/semantics.md#partial-block-keys): vLLM 0.33's keys for a prefix
boundary inside a block of a full-attention group larger than the hash block.

The expected values were obtained by running vLLM 0.33.0's own ``BlockPool`` (hash block 2,
cache block 4, four chained hashes ``h0..h3`` of 8 tokens, KV events on) through the same
calls and printing each call's events and each block's keys (primary first), then copied here
as literals. Without fine-grained partial hash hits the pool-level paths (a partial key as
primary, its promotion, a shorter one replaced) are not reachable through a manager: vLLM's
hybrid coordinator caches only up to the scheduler block, so a boundary inside a block is keyed
once the block is full (see ``test_manager_keys_the_boundary_once_the_block_is_full``, and the
golden scenarios of ``conformance/hybrid_partial_keys.py``, replayed on vLLM itself); with them
(a Mamba "align" group larger than the hash block) a manager reaches the primary partial key
and its promotion (``test_fine_grained_hits.py``, scenario ``full_and_mamba_partial_hit``).
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

from kvcheck.reference_impl.block import KVCacheBlock, get_block_hash
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.events import BlockRemoved, BlockStored, KVCacheEvent
from kvcheck.reference_impl.invariants import check_invariants
from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request
from kvcheck.reference_impl.single_type_kv_cache_manager import FullAttentionManager

HASH_BLOCK, BLOCK = 2, 4
TOKENS = list(range(100, 108))
HASHES = [hashlib.sha256(bytes([i])).digest() for i in range(4)]
NAMES = {h: f"h{i}" for i, h in enumerate(HASHES)}

#: An event as the pool-level table shows it: ("S", hashes, parent, token ids, block size)
#: or ("R", hashes), hashes by name, group 0 throughout.
Shown = tuple[object, ...]


def _request() -> SimpleNamespace:
    """What ``BlockPool`` reads of a request: its id, hashes (at the hash block), tokens,
    LoRA and extra-key inputs."""
    return SimpleNamespace(request_id="r", block_hashes=HASHES, all_token_ids=TOKENS,
                           lora_request=None, mm_features=(), cache_salt=None,
                           prompt_embeds=None, num_prompt_tokens=len(TOKENS))


def _shown(event: KVCacheEvent) -> Shown:
    if isinstance(event, BlockStored):
        parent = None if event.parent_block_hash is None else NAMES[event.parent_block_hash]
        return ("S", [NAMES[h] for h in event.block_hashes], parent, list(event.token_ids),
                event.block_size)
    assert isinstance(event, BlockRemoved), event
    return ("R", [NAMES[h] for h in event.block_hashes])


def _keys(pool: BlockPool, block: KVCacheBlock) -> list[str]:
    keys = [NAMES[get_block_hash(k)] for k in pool.cache_keys_of(block)]
    return keys[:1] + sorted(keys[1:])  # vLLM keeps the secondary keys in a set


def test_pool_level_paths_match_vllm() -> None:
    """Every branch of ``cache_partial_block`` and the promotion and eviction of a block
    carrying several keys, call by call as vLLM 0.33.0's ``BlockPool`` answered."""
    pool = BlockPool(6, enable_kv_cache_events=True, profile="vllm-0.33")
    req = _request()
    b0, b1 = pool.get_new_blocks(2)
    (b2,) = pool.get_new_blocks(1)

    def partial(block: KVCacheBlock, num_tokens: int) -> None:
        pool.cache_partial_block(req, block, num_tokens, 0, BLOCK, HASH_BLOCK)  # type: ignore[arg-type]

    steps = [
        # (call, events, keys of b0, b1, b2)
        (lambda: partial(b1, 6), [("S", ["h2"], "h1", [104, 105], 2)], [[], ["h2"], []]),
        (lambda: partial(b1, 6), [], [[], ["h2"], []]),
        # Promotion: the partial primary key is removed before the full keys are stored.
        (lambda: pool.cache_full_blocks(req, [b0, b1], 0, 2, BLOCK, 0,  # type: ignore[arg-type]
                                        block_hashes=HASHES[1::2]),
         [("R", ["h2"]), ("S", ["h1", "h3"], None, TOKENS, 4)], [["h1"], ["h3"], []]),
        (lambda: partial(b1, 6), [("S", ["h2"], "h1", [104, 105], 2)],
         [["h1"], ["h3", "h2"], []]),
        (lambda: partial(b2, 2), [("S", ["h0"], None, [100, 101], 2)],
         [["h1"], ["h3", "h2"], ["h0"]]),
        # A longer boundary replaces a shorter primary partial key.
        (lambda: partial(b2, 6), [("R", ["h0"]), ("S", ["h2"], "h1", [104, 105], 2)],
         [["h1"], ["h3", "h2"], ["h2"]]),
        # A shorter one beside a longer primary is secondary.
        (lambda: partial(b2, 2), [("S", ["h0"], None, [100, 101], 2)],
         [["h1"], ["h3", "h2"], ["h2", "h0"]]),
        (lambda: pool.evict_blocks({b1.block_id}), [("R", ["h3"]), ("R", ["h2"])],
         [["h1"], [], ["h2", "h0"]]),
        (lambda: pool.free_blocks([b2, b1, b0]), [], [["h1"], [], ["h2", "h0"]]),
        (lambda: pool.get_new_blocks(5), [("R", ["h2"]), ("R", ["h0"]), ("R", ["h1"])],
         [[], [], []]),
    ]
    for i, (call, events, keys) in enumerate(steps):
        call()
        assert [_shown(e) for e in pool.take_events()] == events, f"step {i}"
        assert [_keys(pool, b) for b in (b0, b1, b2)] == keys, f"step {i}"
        check_invariants(pool)
    assert len(pool.cached_block_hash_to_block) == 0


def test_reset_clears_every_key() -> None:
    pool = BlockPool(4, profile="vllm-0.33")
    req = _request()
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, BLOCK, 0,  # type: ignore[arg-type]
                           block_hashes=HASHES[1::2])
    pool.cache_partial_block(req, blocks[1], 6, 0, BLOCK, HASH_BLOCK)  # type: ignore[arg-type]
    pool.free_blocks(reversed(blocks))
    assert pool.reset_prefix_cache()
    assert len(pool.cached_block_hash_to_block) == 0 and not pool.cached_block_hashes_by_block
    assert all(pool.cache_keys_of(b) == [] for b in blocks)
    check_invariants(pool)


def _full4_swa2(**kwargs: object) -> KVCacheManager:
    """Full attention in blocks of 4 beside a 4-token window in blocks of 2: hash block 2,
    scheduler block 4 (the golden scenarios' layout)."""
    return KVCacheManager(16, kv_cache_specs=[FullAttentionSpec(4), SlidingWindowSpec(2, 4)],
                          profile="vllm-0.33", enable_kv_cache_events=True,
                          pythonhashseed="0", **kwargs)  # type: ignore[arg-type]


def _step(m: KVCacheManager, req: Request, n: int) -> None:
    assert m.allocate_slots(req, n) is not None
    req.num_computed_tokens += n


def test_manager_keys_the_boundary_once_the_block_is_full() -> None:
    """A 7-token prompt: its last hash boundary (6) is inside full-attention block 1. The
    prefill caches up to the scheduler block (4 tokens), so block 1 is keyed by the decode
    that fills it: its full key, then the partial key at 6 as a secondary key (vLLM 0.33.0:
    ``S g0 bs4 [H(8)]``, ``S g0 bs2 [H(6)]``, then the window group's ``BlockStored``)."""
    m = _full4_swa2()
    req = m.make_request("a", TOKENS[:7])
    _step(m, req, 7)
    assert [(type(e).__name__, e.group_idx, e.block_size) for e in m.take_events()] == [
        ("BlockStored", 0, 4), ("BlockStored", 1, 2)]
    req.append_output_token_ids(900)
    _step(m, req, 1)
    events = m.take_events()
    assert [(type(e).__name__, e.group_idx, e.block_size) for e in events] == [
        ("BlockStored", 0, 4), ("BlockStored", 0, 2), ("BlockStored", 1, 2)]
    partial = events[1]
    assert isinstance(partial, BlockStored)
    assert partial.block_hashes == (req.block_hashes[2],)
    assert partial.parent_block_hash == req.block_hashes[1]
    assert partial.token_ids == (104, 105)
    block = m.get_blocks("a")[0][1]
    assert [get_block_hash(k) for k in m.block_pool.cache_keys_of(block)] == [
        req.block_hashes[3], req.block_hashes[2]]
    m.check_invariants()
    # Later steps register nothing again; freeing and reusing the block removes both keys.
    req.append_output_token_ids(901)
    _step(m, req, 1)
    assert not [e for e in m.take_events() if e.group_idx == 0 and e.block_size == 2]
    m.free(req)
    assert m.reset_prefix_cache()
    assert not m.block_pool.cached_block_hashes_by_block
    m.check_invariants()


def test_hash_block_sized_full_group_registers_no_partial_key() -> None:
    """Full attention at the hash block size: no partial key, and its instance runs the
    one-group fast path (a coarser group's is bound to the partial-key path)."""
    m = KVCacheManager(16, kv_cache_specs=[FullAttentionSpec(2), SlidingWindowSpec(2, 4)],
                       profile="vllm-0.33", pythonhashseed="0")
    full = m.coordinator.single_type_managers[0]
    assert isinstance(full, FullAttentionManager)
    assert full.cache_blocks.__func__ is FullAttentionManager.cache_blocks  # type: ignore[attr-defined]
    coarse = _full4_swa2().coordinator.single_type_managers[0]
    assert coarse.cache_blocks.__func__ is (  # type: ignore[attr-defined]
        FullAttentionManager.cache_blocks_with_partial_tail_block)
    req = m.make_request("a", TOKENS[:7])
    _step(m, req, 7)
    req.append_output_token_ids(900)
    _step(m, req, 1)
    assert not m.block_pool.cached_block_hashes_by_block
    assert not m.block_pool.partial_block_hash_num_tokens
