"""Bug: under decode context parallelism vLLM 0.33's Mamba group is scaled like an attention
group (its block covers ``block_size * dcp_world_size`` tokens), as vLLM 0.10.2 scales every
manager, though 0.33's ``MambaSpec`` is not ``dcp_sharded``
(docs/semantics.md#decode-context-parallelism-and-prefix_match_unit).

Full attention and Mamba in blocks of 2 at DCP 2: Mamba blocks of 4 tokens, the hash block 4
instead of 2 (no fine-grained hit at 10, fewer Mamba entries); with caching off a 10-token
prompt with one speculative block takes 4 Mamba blocks instead of 6.
"""

import dataclasses

from _knob_mutant_base import build_knob_mutant


def _scale_every_group(specs, dcp_world_size, profile):
    # BUG: MambaSpec scaled too (0.33 shards attention groups only)
    return tuple(dataclasses.replace(s, block_size=s.block_size * dcp_world_size)
                 for s in specs)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_knob_mutant(
    "hybrid_mamba_dcp_sharded", mamba_dcp=True, dcp_kv_cache_specs=_scale_every_group)
