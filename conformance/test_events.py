"""KV events: BlockStored per cache call, its parent chain, BlockRemoved per evicted key,
AllBlocksCleared on reset, LoRA ids, and whole event streams against the reference.

Events are the dicts ``take_events()`` returns (``"type"`` plus vLLM's field names, see
``kvcheck.reference_impl.events``). KV-aware routers (Dynamo, llm-d) rebuild the cache tree from
them, so a wrong parent or a missing removal silently misroutes requests (peer-systems §4 rows
18 and 19; docs/semantics.md#kv-events).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.differential import normalize_events
from kvcheck.conformance.driver import Driver
from kvcheck.conformance.ops import add, decode, free, reset, schedule
from kvcheck.conformance.protocol import KVCacheSpec, KVEvent

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle

pytestmark = pytest.mark.kv_capability("manager", "events")


def _driver(kv_impl: ImplHandle, kv_profile: str, num_blocks: int = 16,
            block_size: int = 4) -> Driver:
    spec = KVCacheSpec(num_blocks=num_blocks, block_size=block_size,
                       enable_kv_cache_events=True, profile=kv_profile)
    return Driver(kv_impl, spec)


def _take(driver: Driver) -> list[KVEvent]:
    return normalize_events(driver.manager.take_events())


def _types(events: list[KVEvent]) -> list[str | None]:
    return [e.get("type") for e in events]


def _hex(value: object) -> object:
    """``value`` with every bytes object shown as hex (readable failure messages)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {k: _hex(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_hex(v) for v in value]
    return value


def _check_stored(driver: Driver, event: KVEvent, parent: bytes | None,
                  tokens: list[int], num_blocks: int) -> list[bytes]:
    """Assert ``event`` is a BlockStored of ``num_blocks`` blocks holding ``tokens`` after
    ``parent``; returns its hashes."""
    bs = driver.spec.block_size
    where = f"event {_hex(event)}\n" + driver.snippet()
    assert event.get("type") == "BlockStored", f"expected a BlockStored; {where}"
    hashes = [bytes(h) for h in event["block_hashes"]]
    assert len(hashes) == num_blocks, f"expected {num_blocks} block hashes; {where}"
    assert len(event["token_ids"]) == bs * len(hashes) and event.get("block_size") == bs, (
        f"len(token_ids) must be block_size ({bs}) x {len(hashes)} hashes; {where}")
    assert list(event["token_ids"]) == list(tokens), f"expected token_ids {tokens}; {where}"
    got_parent = event["parent_block_hash"]
    assert (None if got_parent is None else bytes(got_parent)) == parent, (
        f"expected parent_block_hash {_hex(parent)}; {where}")
    return hashes


# ------------------------------------------------------------------------------ BlockStored
def test_prefill_emits_one_block_stored(kv_impl: ImplHandle, kv_profile: str) -> None:
    """A one-shot prefill of 3 full blocks emits exactly one BlockStored: 3 hashes, 12 tokens,
    parent None."""
    driver = _driver(kv_impl, kv_profile)
    prompt = list(range(1, 14))
    driver.run([add("a", prompt), schedule("a")])
    events = _take(driver)
    assert _types(events) == ["BlockStored"], f"events {_hex(events)}\n" + driver.snippet()
    hashes = _check_stored(driver, events[0], None, prompt[:12], 3)
    assert len(set(hashes)) == 3, f"3 different blocks got hashes {_hex(hashes)}"


def test_chunked_prefill_event_parent_is_previous_block(kv_impl: ImplHandle,
                                                        kv_profile: str) -> None:
    """Each chunk that completes blocks emits one BlockStored whose parent is the hash of the
    block before its first one; a chunk completing no block emits nothing."""
    driver = _driver(kv_impl, kv_profile)
    prompt = list(range(1, 23))  # 22 tokens: 5 full blocks
    driver.apply(add("a", prompt))
    chain: list[bytes] = []
    for chunk, end in ((2, 2), (3, 5), (7, 12), (10, 22)):
        driver.apply(schedule("a", chunk))
        events = _take(driver)
        start_block, end_block = len(chain), end // 4
        if start_block == end_block:
            assert events == [], f"chunk to token {end} completed no block: {_hex(events)}\n" + (
                driver.snippet())
            continue
        assert _types(events) == ["BlockStored"], f"events {_hex(events)}\n" + driver.snippet()
        chain += _check_stored(driver, events[0], chain[-1] if chain else None,
                               prompt[start_block * 4:end_block * 4], end_block - start_block)
    assert len(set(chain)) == 5, f"5 blocks, hashes {_hex(chain)}"


def test_decode_filling_a_block_stores_it_with_parent(kv_impl: ImplHandle, kv_profile: str) -> None:
    """The decode token that fills a block emits a BlockStored whose parent is the previous
    block's hash; decode tokens that leave it partial emit nothing."""
    driver = _driver(kv_impl, kv_profile)
    driver.run([add("a", range(1, 7)), schedule("a")])  # 6 tokens: block 0 full
    (h0,) = _check_stored(driver, _take(driver)[0], None, list(range(1, 5)), 1)
    driver.apply(decode("a"))
    assert _take(driver) == [], "a decode leaving block 1 partial stored something\n" + (
        driver.snippet())
    driver.apply(decode("a"))
    events = _take(driver)
    assert _types(events) == ["BlockStored"], f"events {_hex(events)}\n" + driver.snippet()
    _check_stored(driver, events[0], h0, list(driver.views["a"].token_ids[4:8]), 1)


def test_stored_after_prefix_hit_chains_to_the_hit(kv_impl: ImplHandle, kv_profile: str) -> None:
    """A request that hits 2 cached blocks stores only its new blocks, with the second hit
    block's hash as parent."""
    driver = _driver(kv_impl, kv_profile)
    a = list(range(1, 14))
    driver.run([add("a", a), schedule("a")])
    hashes_a = _check_stored(driver, _take(driver)[0], None, a[:12], 3)
    b = a[:8] + [90, 91, 92, 93, 94, 95, 96, 97, 98]
    driver.run([add("b", b), schedule("b")])
    events = _take(driver)
    assert _types(events) == ["BlockStored"], f"events {_hex(events)}\n" + driver.snippet()
    _check_stored(driver, events[0], hashes_a[1], b[8:16], 2)


def test_multi_block_event_parent_chain(kv_impl: ImplHandle, kv_profile: str) -> None:
    """In a multi-block BlockStored, block i's parent is block i-1: storing the same content one
    block at a time (after a reset) publishes exactly those parents (dynamo#671), and repeated
    block content still gets distinct, non-self-referential hashes (sglang#13488)."""
    driver = _driver(kv_impl, kv_profile)
    prompt = [5] * 16 + [6]  # 4 full blocks of identical content
    driver.run([add("a", prompt), schedule("a")])
    events = _take(driver)
    assert _types(events) == ["BlockStored"], f"events {_hex(events)}\n" + driver.snippet()
    together = _check_stored(driver, events[0], None, prompt[:16], 4)
    assert len(set(together)) == 4, (
        f"repeated content must hash per position: {_hex(together)}\n"
        + driver.snippet())
    driver.run([free("a"), reset()])
    assert _types(_take(driver)) == ["AllBlocksCleared"], driver.snippet()
    driver.apply(add("c", prompt))
    singles: list[bytes] = []
    parents: list[bytes | None] = []
    for _ in range(4):
        driver.apply(schedule("c", 4))
        events = _take(driver)
        assert _types(events) == ["BlockStored"], f"events {_hex(events)}\n" + driver.snippet()
        (h,) = _check_stored(driver, events[0], singles[-1] if singles else None,
                             prompt[len(singles) * 4:len(singles) * 4 + 4], 1)
        parents.append(events[0]["parent_block_hash"])
        singles.append(h)
    assert singles == together and parents == [None] + together[:-1], (
        f"one block at a time: hashes {_hex(singles)}, parents {_hex(parents)}; in one "
        f"event: {_hex(together)}\n" + driver.snippet())


@pytest.mark.kv_capability("block_hashes")
def test_event_hashes_equal_block_hashes(kv_impl: ImplHandle, kv_profile: str) -> None:
    """The hashes BlockStored publishes, in order, are the request's own block_hashes of its
    computed full blocks."""
    driver = _driver(kv_impl, kv_profile)
    driver.run([add("a", range(1, 19)), schedule("a", 6), schedule("a"), decode("a", 3)])
    stored = [bytes(h) for e in _take(driver) if e.get("type") == "BlockStored"
              for h in e["block_hashes"]]
    n_full = driver.views["a"].num_computed_tokens // 4
    own = [bytes(h) for h in driver.manager.block_hashes("a")][:n_full]
    assert stored == own and n_full == 5, (
        f"BlockStored hashes {_hex(stored)}, block_hashes {_hex(own)}"
        "\n" + driver.snippet())


@pytest.mark.kv_capability("extra_keys")
def test_lora_id_carried(kv_impl: ImplHandle, kv_profile: str) -> None:
    """BlockStored carries the request's LoRA int id (and, from 0.31, its name); None without
    LoRA."""
    driver = _driver(kv_impl, kv_profile)
    driver.run([add("a", range(1, 10), lora=("sql", 7, "/adapters/sql")), schedule("a"),
                add("b", range(20, 29)), schedule("b")])
    events = _take(driver)
    assert _types(events) == ["BlockStored", "BlockStored"], f"events {_hex(events)}\n" + (
        driver.snippet())
    with_lora, plain = events
    assert with_lora.get("lora_id") == 7 and plain.get("lora_id") is None, (
        f"lora_id: {with_lora.get('lora_id')!r} with LoRA id 7, {plain.get('lora_id')!r} "
        "without\n" + driver.snippet())
    if kv_profile == "vllm-0.33":
        assert with_lora.get("lora_name") == "sql", f"lora_name {with_lora.get('lora_name')!r}"


# ------------------------------------------------------------------------------ removal, reset
@pytest.mark.parametrize("content", ["same", "other"])
def test_reallocating_cached_blocks_removes_each_key_then_stores(
        kv_impl: ImplHandle, kv_profile: str, content: str) -> None:
    """Reusing 2 cached free blocks (no lookup) emits one BlockRemoved per evicted key, each
    with one hash, then one BlockStored."""
    driver = _driver(kv_impl, kv_profile, num_blocks=4)  # 3 usable blocks
    a = list(range(1, 10))
    driver.run([add("a", a), schedule("a")])
    cached = _check_stored(driver, _take(driver)[0], None, a[:8], 2)
    driver.apply(free("a"))
    assert _take(driver) == [], "freeing emits nothing: eviction is lazy\n" + driver.snippet()
    b = a if content == "same" else list(range(50, 59))
    driver.run([add("b", b, skip_read=True), schedule("b")])  # pops all 3 blocks
    events = _take(driver)
    assert _types(events) == ["BlockRemoved", "BlockRemoved", "BlockStored"], (
        f"events {_hex(events)}\n" + driver.snippet())
    removed = [[bytes(h) for h in e["block_hashes"]] for e in events[:2]]
    assert all(len(r) == 1 for r in removed) and sorted(r[0] for r in removed) == sorted(cached), (
        f"BlockRemoved hashes {_hex(removed)}, cached keys {_hex(cached)}\n" + driver.snippet())
    stored = _check_stored(driver, events[2], None, b[:8], 2)
    if content == "same":
        assert stored == cached, "the same content must be stored under the same hashes"


def test_reset_prefix_cache_emits_all_blocks_cleared(kv_impl: ImplHandle, kv_profile: str) -> None:
    """A failed reset (a block in use) emits nothing; a successful one emits exactly
    [AllBlocksCleared]."""
    driver = _driver(kv_impl, kv_profile)
    driver.run([add("a", range(1, 14)), schedule("a")])
    _take(driver)
    assert driver.apply(reset()) == {"reset": False}, driver.snippet()
    assert _take(driver) == [], "a failed reset emitted events\n" + driver.snippet()
    driver.apply(free("a"))
    assert driver.apply(reset()) == {"reset": True}, driver.snippet()
    events = _take(driver)
    assert _types(events) == ["AllBlocksCleared"], f"events {_hex(events)}\n" + driver.snippet()


def test_no_events_when_events_are_off(kv_impl: ImplHandle, kv_profile: str) -> None:
    """Built with ``enable_kv_cache_events=False``, the manager queues no event: caching,
    eviction and a reset leave ``take_events()`` empty (vLLM's pool returns ``[]`` then)."""
    spec = KVCacheSpec(num_blocks=4, block_size=4, profile=kv_profile)
    driver = Driver(kv_impl, spec)
    a = list(range(1, 10))
    driver.run([add("a", a), schedule("a"), free("a"),
                add("b", range(50, 59), skip_read=True), schedule("b"),  # evicts a's blocks
                free("b"), reset()])
    events = _take(driver)
    assert events == [], (
        f"events off, yet take_events() returned {_hex(events)}\n" + driver.snippet())


# ------------------------------------------------------------------------------ whole streams
def test_event_stream_matches_reference(kv_pair: PairFactory) -> None:
    """A workload with chunked prefill, decode, a shared prefix, eviction under pressure, a
    skip-read request and a reset: the event stream equals the reference's after every op."""
    pair = kv_pair(num_blocks=10, block_size=4, enable_kv_cache_events=True)
    a = list(range(1, 15))
    pair.run([
        add("a", a), schedule("a", 6), schedule("a"), decode("a", 3),
        add("b", a[:8] + list(range(90, 96))), schedule("b"),
        free("a"),
        add("c", range(200, 218)), schedule("c"),        # evicts a's cached blocks
        add("d", a, skip_read=True), schedule("d"),       # pool short: no change
        free("b"), free("c"), schedule("d"),
        decode("d", 2), free("d"), reset(),
        add("e", a), schedule("e", 5), schedule("e"),
    ])


@pytest.mark.kv_capability("extra_keys")
def test_event_stream_with_extra_keys_matches_reference(kv_pair: PairFactory) -> None:
    """LoRA, salted and multimodal requests: BlockStored lora_id / lora_name / extra_keys and
    hashes equal the reference's."""
    pair = kv_pair(num_blocks=24, block_size=4, enable_kv_cache_events=True)
    prompt = list(range(1, 18))
    pair.run([
        add("l", prompt, lora=("sql", 3, "/adapters/sql")), schedule("l", 9), schedule("l"),
        add("s", prompt, salt="tenant-a"), schedule("s"),
        add("m", prompt, mm=[("img0", 2, 3), ("img1", 5, 6)]), schedule("m"), decode("m", 4),
        add("s2", prompt, salt="tenant-a"), schedule("s2"),
        free("l"), free("s"), free("m"), free("s2"), reset(),
    ])
