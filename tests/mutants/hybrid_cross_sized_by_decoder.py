"""Bug: a cross-attention group is sized by the decoder's tokens, like a self-attention group,
instead of by the request's encoder tokens.

vLLM's coordinator passes ``num_encoder_tokens`` to its ``CrossAttentionManager`` in place of
the decoder's token count (docs/semantics.md#cross-attention-groups): the table holds
``cdiv(E, block_size)`` blocks from admission to free, however long the decoder runs. Sized by
the decoder, it takes the prompt's blocks at admission and grows with every decode step.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import CrossAttentionManager


class DecoderSizedCross(CrossAttentionManager):
    uses_encoder_tokens = False  # BUG: sized by the decoder's tokens


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_cross_sized_by_decoder", managers={CrossAttentionManager: DecoderSizedCross})
