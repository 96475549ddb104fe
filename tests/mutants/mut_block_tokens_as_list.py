"""Bug (block_hasher.py): a block's token ids are hashed as a ``list`` instead of a ``tuple``.

Pickle and CBOR encode the two differently, so every block hash differs from vLLM's while the
engine stays self-consistent: prefix caching works inside one engine, and an external router,
LMCache or a second replica keyed on vLLM's hashes never hits (peer-systems §4 #21:
llm-d-kv-cache#138 / vllm#23673; LMCache#1380).
"""

from __future__ import annotations

from collections.abc import Sequence

from _mutant_base import build, rebind

from kvcheck.reference_impl.block import BlockHash
from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.extra_keys import ExtraKeys
from kvcheck.reference_impl.hashing import HashFn


def hash_block_tokens_list(hash_fn: HashFn, parent_block_hash: bytes | None,
                           curr_block_token_ids: Sequence[int], extra_keys: ExtraKeys = None,
                           *, none_hash: bytes) -> BlockHash:
    return BlockHash(
        hash_fn((parent_block_hash or none_hash, list(curr_block_token_ids), extra_keys))  # BUG
    )


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_block_tokens_as_list",
    hasher_cls=rebind(RequestBlockHasher, hash_block_tokens=hash_block_tokens_list))
