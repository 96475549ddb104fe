"""vLLM 0.33's ``enable_mamba_shared_prefix_checkpoint`` narrowing in the reference
(docs/semantics.md#the-shared-prefix-checkpoint), against what vLLM 0.33.0's own
``KVCacheManager`` kept.

How the expected values were obtained: a throwaway script outside the repository (it imports
vLLM, which the test command does not install) built each spec below with
``mamba_shared_prefix_checkpoint=True`` through kvcheck's ``adapters/vllm_kv_config.
make_vllm_cache`` on vLLM 0.33.0 (CPU-only install) and printed the manager's
``mamba_shared_prefix_checkpoint`` and each per-group manager's ``shared_prefix_checkpoint``.
The printed values are the literals below; nothing here is computed by the reference.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvcheck.adapters.reference import ReferenceManager
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, UnsupportedSpec
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec, MambaSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager

F4 = KVCacheGroupSpec("full_attention", 4)
F8 = KVCacheGroupSpec("full_attention", 8)
M8 = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")
W8 = KVCacheGroupSpec("sliding_window", 8, sliding_window=8)


def _flagged(group: KVCacheGroupSpec) -> KVCacheGroupSpec:
    return replace(group, is_eagle_group=True)


#: name -> (spec fields besides the flag, vLLM 0.33.0's manager flag, its per-group flags).
NARROWING: dict[str, tuple[dict[str, Any], bool, list[bool]]] = {
    "use_eagle": ({"kv_cache_groups": (F4, M8), "use_eagle": True}, True, [False, True]),
    "no_eagle_group": ({"kv_cache_groups": (F4, M8)}, False, [False, False]),
    "flagged_without_use_eagle": ({"kv_cache_groups": (_flagged(F4), M8)}, True,
                                  [False, True]),
    "flagged_mamba": ({"kv_cache_groups": (F4, _flagged(M8)), "use_eagle": True}, True,
                      [False, True]),
    "hash_lookahead_flagged": ({"kv_cache_groups": (_flagged(F4), M8),
                                "num_hash_lookahead_tokens": 1}, True, [False, True]),
    "no_fine_grained_hits": ({"kv_cache_groups": (F8, M8), "use_eagle": True}, False,
                             [False, False]),
    "window_turns_fine_grained_off": ({"kv_cache_groups": (F4, M8, W8), "use_eagle": True},
                                      False, [False, False, False]),
    "multi_module_mtp": ({"kv_cache_groups": (_flagged(F4), M8), "num_prefill_lookahead": 2},
                         False, [False, False]),
    "caching_off": ({"kv_cache_groups": (F4, M8), "use_eagle": True, "enable_caching": False},
                    False, [False, False]),
}


@pytest.mark.parametrize("name", sorted(NARROWING))
def test_flag_is_narrowed_as_vllm_narrows_it(name: str) -> None:
    fields, kept, per_group = NARROWING[name]
    manager = ReferenceManager(KVCacheSpec(num_blocks=48, block_size=4,
                                           mamba_shared_prefix_checkpoint=True,
                                           **fields)).manager
    assert manager.mamba_shared_prefix_checkpoint is kept
    assert [getattr(m, "shared_prefix_checkpoint", False)
            for m in manager.coordinator.single_type_managers] == per_group


def test_flag_is_refused_under_vllm_010_and_when_not_a_bool() -> None:
    with pytest.raises(KVCacheMisuseError, match=r"enable_mamba_shared_prefix_checkpoint=True: "
                       r"vLLM 0\.10\.2 has no Mamba shared-prefix checkpoint"):
        KVCacheManager(32, kv_cache_specs=[FullAttentionSpec(4), MambaSpec(4)],
                       profile="vllm-0.10", enable_caching=False,
                       enable_mamba_shared_prefix_checkpoint=True)
    with pytest.raises(KVCacheMisuseError, match="must be True or False, got 1"):
        KVCacheManager(32, kv_cache_specs=[FullAttentionSpec(4),
                                           MambaSpec(4, mamba_cache_mode="align")],
                       enable_mamba_shared_prefix_checkpoint=1)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedSpec, match=r"vLLM 0\.10\.2 has no Mamba shared-prefix"):
        ReferenceManager(KVCacheSpec(num_blocks=32, block_size=4, profile="vllm-0.10",
                                     enable_caching=False,
                                     kv_cache_groups=(F4, KVCacheGroupSpec("mamba", 4)),
                                     mamba_shared_prefix_checkpoint=True))
