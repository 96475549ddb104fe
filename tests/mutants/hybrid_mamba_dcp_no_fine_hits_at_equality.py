"""Bug: under decode context parallelism fine-grained partial hits are turned on only by a
Mamba "align" block larger than the hash block, as without DCP; vLLM 0.33's
``partial_hash_hits_enabled`` already turns them on at a Mamba block equal to the hash block
when ``dcp_world_size > 1`` (DCP scales the attention blocks instead)
(docs/semantics.md#fine-grained-partial-hits).

Full attention and Mamba in blocks of 2 at DCP 2 (full attention's blocks cover 4 tokens, the
hash block is 2): a hit that vLLM ends at 10 tokens, inside full attention's block, lands on
the 4-token scheduler block (8) instead, and nothing is copied on write.
"""

from _knob_mutant_base import build_knob_mutant

from kvcheck.reference_impl.kv_cache_coordinator import get_kv_cache_coordinator


def _coordinator_without_dcp(*args, dcp_world_size=1, **kwargs):
    # BUG: the coordinator's fine-grained rule is not told the DCP world size
    return get_kv_cache_coordinator(*args, **kwargs)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_knob_mutant(
    "hybrid_mamba_dcp_no_fine_hits_at_equality", mamba_dcp=True,
    get_kv_cache_coordinator=_coordinator_without_dcp)
