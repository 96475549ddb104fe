"""Bug: vLLM 0.33's ``prefix_match_unit`` is ignored: several groups with caching on hash at
the gcd of their block sizes whatever the unit
(docs/semantics.md#decode-context-parallelism-and-prefix_match_unit).

Full attention beside a window in blocks of 4 with a unit of 2 hashes every 4 tokens, so the
prompt's last boundary inside a block gets no partial-block key, and beside a Mamba "align"
group of 4 no fine-grained hit lands between two blocks.
"""

from _knob_mutant_base import build_knob_mutant

from kvcheck.reference_impl.kv_cache_manager import resolve_kv_cache_block_sizes


def _ignoring_the_unit(specs, enable_caching, profile, prefix_match_unit=None):
    # BUG: prefix_match_unit never reaches the resolution (the gcd is used)
    return resolve_kv_cache_block_sizes(specs, enable_caching, profile)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_knob_mutant(
    "hybrid_prefix_match_unit_ignored", resolve_kv_cache_block_sizes=_ignoring_the_unit)
