"""Bug: ``mamba_shared_prefix_checkpoint`` is kept in every layout (not narrowed).

vLLM 0.33's ``KVCacheManager.__init__`` keeps ``enable_mamba_shared_prefix_checkpoint`` only
with an EAGLE group (its coordinator's ``eagle_group_ids``), fine-grained hits on and no
re-prefillable tail, and drops it without an error otherwise
(docs/semantics.md#the-shared-prefix-checkpoint). Kept without an EAGLE group, a sibling's
junction at 12 tokens is keyed and the next sibling hits 12 tokens, not 8.
"""

from __future__ import annotations

from _shared_prefix_mutant_base import build_shared_prefix


def keep_whenever_asked(manager, spec):
    return spec.mamba_shared_prefix_checkpoint  # BUG: no narrowing


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_shared_prefix(
    "shared_prefix_not_narrowed", narrowing=keep_whenever_asked)
