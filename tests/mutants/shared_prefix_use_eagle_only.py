"""Bug: ``mamba_shared_prefix_checkpoint`` is narrowed on ``use_eagle`` rather than on the
coordinator's EAGLE groups.

vLLM 0.33 keeps the flag when ``eagle_group_ids`` is not empty: the groups flagged
``is_eagle_group`` (every group under ``use_eagle`` when none is), so a layout with a flagged
group and no ``use_eagle`` (hash lookahead clears ``use_eagle``; the groups stay flagged) keeps
it (docs/semantics.md#the-shared-prefix-checkpoint). Dropped there, the sibling's junction at
12 tokens is not keyed and the next sibling hits 8 tokens, not 12.
"""

from __future__ import annotations

from _shared_prefix_mutant_base import build_shared_prefix


def on_use_eagle(manager, spec):
    return manager.mamba_shared_prefix_checkpoint and spec.use_eagle  # BUG: flags ignored


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_shared_prefix(
    "shared_prefix_use_eagle_only", narrowing=on_use_eagle)
