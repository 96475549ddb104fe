"""The vLLM adapter on vLLM 0.33's Mamba shared-prefix checkpoint
(``KVCacheSpec.mamba_shared_prefix_checkpoint``; docs/semantics.md#the-shared-prefix-checkpoint),
on the real vLLM.

Runs only where vLLM is importable (an environment built by scripts/vllm-cpu-env.sh; run it
with that environment's python). Under vLLM 0.33 the adapter passes
``enable_mamba_shared_prefix_checkpoint=True`` to vLLM's ``KVCacheManager``, which narrows it
itself; vLLM 0.10.2 has no such argument and the spec is declined by name.
"""

from __future__ import annotations

import importlib.util

import pytest

from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, UnsupportedSpec

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = pytest.mark.skipif(
    not HAS_VLLM, reason="vLLM is not importable here (build it: scripts/vllm-cpu-env.sh)")

FULL = KVCacheGroupSpec("full_attention", 4)
ALIGN = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")


def test_flag_reaches_vllms_manager_or_is_declined_by_name() -> None:
    from kvcheck.adapters.vllm_kv_config import HAS_SHARED_PREFIX_CHECKPOINT, make_vllm_cache

    spec = KVCacheSpec(num_blocks=48, block_size=4, kv_cache_groups=(FULL, ALIGN),
                       use_eagle=True, mamba_shared_prefix_checkpoint=True)
    if not HAS_SHARED_PREFIX_CHECKPOINT:  # 0.10.2: Mamba layouts run with caching off
        legacy = KVCacheSpec(num_blocks=48, block_size=4, enable_caching=False,
                             kv_cache_groups=(FULL, KVCacheGroupSpec("mamba", 4)),
                             mamba_shared_prefix_checkpoint=True)
        with pytest.raises(UnsupportedSpec, match="has no enable_mamba_shared_prefix_checkpoint"):
            make_vllm_cache(legacy)
        return
    assert make_vllm_cache(spec).manager.mamba_shared_prefix_checkpoint is True
    # Narrowed off by vLLM itself without an EAGLE group: no error.
    plain = KVCacheSpec(num_blocks=48, block_size=4, kv_cache_groups=(FULL, ALIGN),
                        mamba_shared_prefix_checkpoint=True)
    assert make_vllm_cache(plain).manager.mamba_shared_prefix_checkpoint is False
