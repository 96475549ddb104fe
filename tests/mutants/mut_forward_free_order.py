"""Bug: ``free()`` releases a request's blocks first-to-last instead of last-to-first.

vLLM frees ``reversed(req_blocks)`` so the deepest block of a cached chain sits nearest the
head and is evicted before its ancestors; freeing forward evicts the chain root first and
leaves the rest of the chain unreachable (peer-systems §4 #12: llm-d-inference-sim#704 and
LMCache#443 evicted the middle of a chain first).
"""

from _mutant_base import build

from kvcheck.reference_impl.single_type_kv_cache_manager import FullAttentionManager


class ForwardFreeFullAttention(FullAttentionManager):
    def free(self, request_id):
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self.block_pool.free_blocks(blocks)  # BUG: not reversed


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_forward_free_order", managers={FullAttentionManager: ForwardFreeFullAttention})
