"""The reference adapter's asynchronous-scheduling arguments (``num_in_flight_tokens``;
docs/semantics.md#asynchronous-scheduling): set on the reference ``Request`` for the call
only, refused by name when negative or under vllm-0.10 (whose KV-cache manager reads no
in-flight count). What the count does is checked against vLLM 0.33.0's recorded answers in
``conformance/test_async_scheduling.py``."""

from __future__ import annotations

from typing import Any

import pytest

from kvcheck.adapters.reference import make_kv_cache_manager
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, RequestView
from kvcheck.reference_impl.errors import KVCacheMisuseError

GROUPS = (KVCacheGroupSpec("full_attention", 4),
          KVCacheGroupSpec("sliding_window", 4, sliding_window=8))


# Any: the reference adapter's grouped answers (lists of lists), read as they come.
def _running(profile: str) -> tuple[Any, RequestView]:
    manager = make_kv_cache_manager(KVCacheSpec(num_blocks=24, block_size=4, profile=profile,
                                                kv_cache_groups=GROUPS))
    view = RequestView("a", tuple(range(24)))
    assert manager.allocate_slots(view, 8) is not None
    return manager, RequestView("a", view.prompt_token_ids, num_computed_tokens=8)


def test_in_flight_tokens_hold_for_the_call_only() -> None:
    manager, view = _running("vllm-0.33")
    # As vLLM 0.33.0 answered (async_scheduling_golden's window_in_flight).
    assert manager.allocate_slots(view, 8, num_in_flight_tokens=8) == [[5, 6], [7, 8]]
    view = RequestView("a", view.prompt_token_ids, num_computed_tokens=16)
    # 8 of 16 in flight: the window frees at 8 (nothing); then at 16 without (two blocks).
    assert manager.allocate_slots(view, 8, num_in_flight_tokens=8) is not None
    assert manager.get_block_ids("a")[1][:2] != [0, 0]
    assert manager._requests.sync(view).num_in_flight_tokens == 0


@pytest.mark.parametrize(("profile", "value", "words"), [
    ("vllm-0.33", -1, "num_in_flight_tokens must be an int >= 0, got -1"),
    ("vllm-0.10", 8, "vLLM 0.10.2's KV-cache manager reads no in-flight count"),
])
def test_bad_in_flight_tokens_are_refused_by_name(profile: str, value: int, words: str) -> None:
    manager, view = _running(profile)
    with pytest.raises(KVCacheMisuseError, match=words):
        manager.allocate_slots(view, 8, num_in_flight_tokens=value)
    with pytest.raises(KVCacheMisuseError, match=words):
        manager.finalize_partial_tail_offloads(view, num_in_flight_tokens=value)
