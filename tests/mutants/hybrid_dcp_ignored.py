"""Bug: the manager ignores decode context parallelism: a sharded group's block covers its
own ``block_size`` tokens instead of ``block_size * dcp_world_size``
(docs/semantics.md#decode-context-parallelism-and-prefix_match_unit), as if
``dcp_world_size`` were not passed to vLLM's ``KVCacheManager``.

A 10-token prompt at block size 2 and DCP 2 takes 5 blocks instead of 3, hashes every 2
tokens, and hits land on 2-token blocks.
"""

from _knob_mutant_base import build_knob_mutant

IMPL_INFO, make_kv_cache_manager, make_block_pool = build_knob_mutant(
    "hybrid_dcp_ignored",
    # BUG: the specs are not scaled by the DCP world size
    dcp_kv_cache_specs=lambda specs, dcp_world_size, profile: tuple(specs))
