"""The reference refuses external-KV calls that no scheduler makes, naming the rule
(docs/bad-input.md#kv-from-outside-the-pool), and changes nothing."""

from __future__ import annotations

import pytest

from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


def _manager(profile: str = "vllm-0.33", **kwargs: object) -> KVCacheManager:
    return KVCacheManager(16, 4, profile=profile, enable_kv_cache_events=True, **kwargs)


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
@pytest.mark.parametrize(("external", "words"), [
    (-1, "num_external_computed_tokens must be >= 0, got -1"),
    (11, "exceed the request's 10 tokens"),
])
def test_external_tokens_outside_the_request_are_refused(profile: str, external: int,
                                                         words: str) -> None:
    m = _manager(profile)
    r = m.make_request("a", list(range(10)))
    free = m.num_free_blocks
    with pytest.raises(KVCacheMisuseError, match=words):
        m.allocate_slots(r, 0, num_external_computed_tokens=external)
    assert m.num_free_blocks == free and m.get_block_ids("a") == ([],)


def test_external_tokens_past_max_model_len_are_refused() -> None:
    m = _manager(max_model_len=8)
    r = m.make_request("a", list(range(12)))
    with pytest.raises(KVCacheMisuseError, match=r"exceed max_model_len \(8\)"):
        m.allocate_slots(r, 1, num_external_computed_tokens=9)


def test_nothing_to_adopt_and_nothing_new_is_refused() -> None:
    m = _manager()
    r = m.make_request("a", list(range(10)))
    with pytest.raises(KVCacheMisuseError, match="no prefix-cache hits or external tokens"):
        m.allocate_slots(r, 0)


@pytest.mark.parametrize(("rid", "n", "words"), [
    ("ghost", 4, "the request holds no blocks"),
    ("a", 13, r"must be in \[0, 8\] \(the request has 10 tokens and slots for 8\)"),
    ("a", -1, r"num_computed_tokens must be in \[0, 8\]"),
])
def test_cache_blocks_misuse(rid: str, n: int, words: str) -> None:
    m = _manager()
    r = m.make_request("a", list(range(10)))
    m.allocate_slots(r, 0, num_external_computed_tokens=8, delay_cache_blocks=True)
    m.take_events()
    target = r if rid == "a" else m.make_request(rid, list(range(10)))
    with pytest.raises(KVCacheMisuseError, match=words):
        m.cache_blocks(target, n)
    assert m.take_events() == [], "a refused cache_blocks caches nothing"


def test_cache_blocks_stops_at_the_slots_the_request_has() -> None:
    m = _manager()
    r = m.make_request("a", list(range(20)))
    m.allocate_slots(r, 0, num_external_computed_tokens=8, delay_cache_blocks=True)
    with pytest.raises(KVCacheMisuseError, match="slots for 8"):
        m.cache_blocks(r, 12)


def test_evict_blocks_out_of_the_pool_changes_nothing() -> None:
    m = _manager()
    r = m.make_request("a", list(range(10)))
    m.allocate_slots(r, 10)
    m.take_events()
    with pytest.raises(KVCacheMisuseError, match=r"block ids \[16\] outside \[0, 16\)"):
        m.evict_blocks([1, 16])
    assert m.take_events() == []
    assert m.get_computed_blocks(m.make_request("b", list(range(10))))[1] == 8


def test_evict_blocks_does_not_exist_in_0_10() -> None:
    m = _manager("vllm-0.10")
    with pytest.raises(KVCacheMisuseError, match=r"0\.10\.2's KVCacheManager has no evict_blocks"):
        m.evict_blocks([1])
