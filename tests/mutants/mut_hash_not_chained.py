"""Bug: block hashes are not chained: every block hashes ``(NONE_HASH, tokens, extra)``.

Two prompts that end in the same block but differ before it then share that block's key, so
a lookup can hit KV computed for another prefix. Content-only hashing is the bug sglang#13488
(dynamo#4394) shipped in its KV events (peer-systems §4 #18), and position-blind keys are
what llm-d-kv-cache#138 warns replicas about.
"""

from _mutant_base import build

from kvcheck.reference_impl.block_hasher import RequestBlockHasher


class UnchainedHasher(RequestBlockHasher):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        inner, root = self.hash_fn, self.none_hash
        # hash_block_tokens hashes (parent or NONE_HASH, tokens, extra): drop the parent.
        self.hash_fn = lambda obj: inner((root, *obj[1:]))  # BUG: parent ignored


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_hash_not_chained", hasher_cls=UnchainedHasher)
