"""The vLLM adapter on vLLM 0.33's admission gates (``allocate_slots(...,
full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)``, ``KVCacheSpec.watermark`` and
``max_in_flight_tokens``; docs/semantics.md#admission-gates), on the real vLLM.

Runs only where vLLM is importable (an environment built by scripts/vllm-cpu-env.sh; run it
with that environment's python). Under vLLM 0.33 the adapter builds vLLM's ``KVCacheManager``
with the watermark and ``max_in_flight_tokens`` (the windows' admission caps), passes the
gates to ``allocate_slots`` and keeps the vLLM ``Request``'s status as the protocol's contract
says (RUNNING once admitted, a freed request's next ``Request`` WAITING); vLLM 0.10.2 has no
gates and declines them by name. The recorded scenarios themselves run through the protocol
in ``conformance/test_admission_gates.py``.
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

SWA8 = KVCacheGroupSpec("sliding_window", 4, sliding_window=8)


def test_settings_reach_vllms_manager() -> None:
    from kvcheck.adapters.vllm_kv_config import HAS_ADMISSION_GATES, make_vllm_cache

    spec = KVCacheSpec(num_blocks=20, block_size=4, kv_cache_groups=(SWA8,), watermark=0.25,
                       max_in_flight_tokens=8, max_model_len=1024)
    if not HAS_ADMISSION_GATES:
        with pytest.raises(UnsupportedSpec, match="no watermark / max_in_flight_tokens"):
            make_vllm_cache(spec)
        return
    manager = make_vllm_cache(spec).manager
    assert manager.watermark_blocks == 5  # int(0.25 * 20)
    window = manager.coordinator.single_type_managers[0]
    assert window.max_admission_blocks_per_request == 5  # cdiv(8 - 1 + 8, 4) + 1


def test_gates_and_status_follow_the_contract() -> None:
    from kvcheck.adapters.vllm_kv_config import HAS_ADMISSION_GATES
    from kvcheck.adapters.vllm_manager import VLLMManager

    if not HAS_ADMISSION_GATES:
        manager = VLLMManager(KVCacheSpec(num_blocks=8, block_size=4))
        with pytest.raises(UnsupportedSpec, match="has no admission gates"):
            manager.allocate_slots(RequestView("a", tuple(range(8))), 8,
                                   full_sequence_must_fit=True)
        return
    from kvcheck.adapters.vllm_runtime import RequestStatus

    # 16 blocks, watermark 4: a waiting request pays it while another is scheduled.
    manager = VLLMManager(KVCacheSpec(num_blocks=16, block_size=4, watermark=0.25))
    a = RequestView("a", tuple(range(40)))
    assert manager.allocate_slots(a, 40, has_scheduled_reqs=False) is not None  # 10 of 15
    assert manager._requests.sync(a).status == RequestStatus.RUNNING
    b = RequestView("b", tuple(range(100, 108)))
    assert manager.allocate_slots(b, 8) is None  # 2 + 4 > 5 free
    assert manager._requests.sync(b).status == RequestStatus.WAITING
    assert manager.allocate_slots(b, 8, has_scheduled_reqs=False) == [11, 12]
    # Running, a's decode never pays it: 1 block of 3 free.
    a = RequestView("a", a.prompt_token_ids, (7,), 40)
    assert manager.allocate_slots(a, 1) == [13]
    manager.free("b")
    b = RequestView("b", b.prompt_token_ids)
    assert manager._requests.sync(b).status == RequestStatus.WAITING
    # 4 free (b's 2 back, cached): its re-admission pays the watermark again (6 > 4); without
    # it, 2 blocks must fit free - reserved.
    assert manager.allocate_slots(b, 8, full_sequence_must_fit=True) is None
    assert manager.allocate_slots(b, 8, reserved_blocks=3, has_scheduled_reqs=False) is None
    assert manager.allocate_slots(b, 8, reserved_blocks=2, has_scheduled_reqs=False) is not None
    assert manager.num_free_blocks() == 2
