"""Bug (hashing.py): with PYTHONHASHSEED set, NONE_HASH hashes the seed's *bytes*
(``hash_fn(seed.encode())``) instead of the ``str`` vLLM hashes.

Both are deterministic, so two replicas of this engine agree with each other, but every block
hash differs from vLLM's: an engine that is meant to share a KV cache or a router with vLLM
never hits (peer-systems §4 #21, a silent hash-scheme change; docs/semantics.md#none-hash says
the str is hashed).
"""

from __future__ import annotations

from _mutant_base import build

from kvcheck.adapters.reference import none_hash_for
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.reference_impl.hashing import get_hash_fn_by_name


def none_hash_of_seed_bytes(spec: KVCacheSpec) -> bytes:
    if spec.pythonhashseed is None:
        return none_hash_for(spec)
    return get_hash_fn_by_name(spec.hash_algo)(spec.pythonhashseed.encode())  # BUG: a str


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_seed_hashed_as_bytes", none_hash=none_hash_of_seed_bytes)
