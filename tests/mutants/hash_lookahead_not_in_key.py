"""Bug: with hash lookahead (``num_hash_lookahead_tokens=L``) a block waits for its ``L``
lookahead tokens but its hash leaves them out (extra keys ``E``, not ``(E, *tokens)``).

vLLM 0.33's ``get_request_block_hasher`` puts the lookahead tokens in the extra keys
(docs/semantics.md#request-block-hashes): the drafter's KV at a block's last position depends
on them, so two requests sharing a block but not the token after it must not share it. Left
out, every hash differs from vLLM's, and a request continuing the prompt with another token
hits the block anyway.
"""

from __future__ import annotations

from _mutant_base import build

from kvcheck.reference_impl.block_hasher import RequestBlockHasher


class KeyWithoutLookahead(RequestBlockHasher):
    def _with_lookahead(self, extra_keys, token_ids, end):
        return extra_keys  # BUG: the lookahead tokens are not part of the key


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "hash_lookahead_not_in_key", hasher_cls=KeyWithoutLookahead,
    keep=frozenset({"hash_lookahead"}))
