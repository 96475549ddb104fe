"""Bug: a Mamba "align" group never keys the state at the shared-prefix boundary, though
the ``KVCacheManager`` kept ``mamba_shared_prefix_checkpoint``.

vLLM 0.33's ``MambaManager._cache_partial_tail_block`` keys the state where the chunk being
cached ends at the request's ``shared_prefix_boundary`` inside the prompt, besides the
prompt's checkpoint (docs/semantics.md#the-shared-prefix-checkpoint). Ignored, a sibling
sharing the prefix hits only the block boundary below the junction: 8 tokens, not 12.
"""

from __future__ import annotations

from _shared_prefix_mutant_base import build_shared_prefix

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class JunctionIgnored(MambaManager):
    # BUG: the flag reads False whatever the KVCacheManager set.
    shared_prefix_checkpoint = property(lambda self: False, lambda self, value: None)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_shared_prefix(
    "shared_prefix_junction_ignored", managers={MambaManager: JunctionIgnored})
