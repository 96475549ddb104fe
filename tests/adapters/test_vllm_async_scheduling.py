"""The vLLM adapter on vLLM 0.33's asynchronous scheduling (``allocate_slots(...,
num_in_flight_tokens=k)``, ``finalize_partial_tail_offloads(request,
num_in_flight_tokens=k)``; docs/semantics.md#asynchronous-scheduling), on the real vLLM.

Runs only where vLLM is importable (an environment built by scripts/vllm-cpu-env.sh; run it
with that environment's python). Under vLLM 0.33 the adapter sets vLLM's
``Request.num_in_flight_tokens`` for the call only (the view carries the count per call);
vLLM 0.10.2's manager reads no such count: the capability is undeclared and the argument
declined by name. The recorded scenarios themselves run through the protocol in
``conformance/test_async_scheduling.py``.
"""

from __future__ import annotations

import importlib.util

import pytest

from kvcheck.conformance.protocol import (
    KVCacheGroupSpec,
    KVCacheSpec,
    RequestView,
    UnsupportedSpec,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = pytest.mark.skipif(
    not HAS_VLLM, reason="vLLM is not importable here (build it: scripts/vllm-cpu-env.sh)")

SPEC = KVCacheSpec(num_blocks=24, block_size=4, kv_cache_groups=(
    KVCacheGroupSpec("full_attention", 4),
    KVCacheGroupSpec("sliding_window", 4, sliding_window=8)))


def test_in_flight_tokens_reach_vllms_request_for_the_call() -> None:
    from kvcheck.adapters import vllm
    from kvcheck.adapters.vllm_manager import HAS_IN_FLIGHT_TOKENS

    assert ("async_scheduling" in vllm.IMPL_INFO.capabilities) == HAS_IN_FLIGHT_TOKENS
    manager = vllm.make_kv_cache_manager(SPEC)
    view = RequestView("a", tuple(range(24)))
    assert manager.allocate_slots(view, 8) is not None
    view = RequestView("a", view.prompt_token_ids, num_computed_tokens=8)
    if not HAS_IN_FLIGHT_TOKENS:
        with pytest.raises(UnsupportedSpec, match="num_in_flight_tokens=8"):
            manager.allocate_slots(view, 8, num_in_flight_tokens=8)
        return
    assert manager.allocate_slots(view, 8, num_in_flight_tokens=8) is not None
    view = RequestView("a", view.prompt_token_ids, num_computed_tokens=16)
    assert manager.allocate_slots(view, 8, num_in_flight_tokens=8) is not None
    # computed 16, 8 in flight: the window of 8 frees nothing yet (the sync rule: 2 blocks).
    assert manager.get_block_ids("a")[1][:2] != [0, 0]
    req = manager._requests.sync(view)  # the vLLM Request the adapter keeps
    assert req.num_in_flight_tokens == 0  # set for the call only
