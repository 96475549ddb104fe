"""The vLLM adapter on vLLM 0.33's worker-side block zeroing (``KVCacheSpec.
needs_kv_cache_zeroing``, ``take_new_block_ids``, ``allocate_slots(...,
skip_zeroing_group_ids)``; docs/semantics.md#worker-side-block-zeroing), on the real vLLM.

Runs only where vLLM is importable (an environment built by scripts/vllm-cpu-env.sh; run it
with that environment's python). Under vLLM 0.33 the spec's knob reaches vLLM's managers
through the ``KVCacheConfig`` (vLLM derives it from Mamba layers or mixed precision, which
kvcheck's specs do not describe), and it stays vLLM's own where the spec leaves it off; vLLM
0.10.2 has no zeroing and declines the spec by name. The recorded scenarios run through the
protocol in ``conformance/test_block_zeroing.py``.
"""

from __future__ import annotations

import importlib.util

import pytest

from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, UnsupportedSpec

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = pytest.mark.skipif(
    not HAS_VLLM, reason="vLLM is not importable here (build it: scripts/vllm-cpu-env.sh)")

MAMBA8 = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")


@pytest.mark.parametrize("zeroing", [False, True])
def test_the_knob_reaches_vllms_managers(zeroing: bool) -> None:
    from kvcheck.adapters.vllm_kv_config import HAS_BLOCK_ZEROING, make_vllm_cache

    spec = KVCacheSpec(num_blocks=16, block_size=4, needs_kv_cache_zeroing=zeroing)
    if not HAS_BLOCK_ZEROING:
        if zeroing:
            with pytest.raises(UnsupportedSpec, match="no needs_kv_cache_zeroing"):
                make_vllm_cache(spec)
        return
    manager = make_vllm_cache(spec).manager
    assert manager.coordinator.kv_cache_config.needs_kv_cache_zeroing is zeroing
    assert [m.records_new_block_ids for m in manager.coordinator.single_type_managers] == [
        zeroing]


def test_a_mamba_layout_keeps_vllms_own_zeroing() -> None:
    """vLLM's property says True beside a Mamba group: left as it is without the knob (the
    suite then never drains), and only the attention group records."""
    from kvcheck.adapters.vllm_kv_config import HAS_BLOCK_ZEROING, make_vllm_cache

    if not HAS_BLOCK_ZEROING:
        pytest.skip("this vLLM has no worker-side block zeroing")
    spec = KVCacheSpec(num_blocks=16, block_size=4,
                       kv_cache_groups=(KVCacheGroupSpec("full_attention", 4), MAMBA8))
    manager = make_vllm_cache(spec).manager
    assert manager.coordinator.kv_cache_config.needs_kv_cache_zeroing is True
    assert [m.records_new_block_ids for m in manager.coordinator.single_type_managers] == [
        True, False]
