"""Bug (hashing.py): the ``xxhash`` algorithm is XXH64 (8-byte digests) instead of vLLM's
XXH3-128 (16 bytes) of the same pickle.

Every block hash under ``--prefix-caching-hash-algo=xxhash`` then differs from vLLM's (an
external router or a second replica never hits), and a 64-bit digest collides far sooner:
aibrix#749's fixed-seed xxhash64 collisions (peer-systems §4 #22).
"""

from __future__ import annotations

import pickle
from typing import Any

import xxhash
from _mutant_base import build, rebind, rebind_function

from kvcheck.adapters.reference import none_hash_for
from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.hashing import HashFn, get_hash_fn_by_name, resolve_none_hash
from kvcheck.reference_impl.profiles import ProfileBehaviour


def xxh64_pickle(obj: Any) -> bytes:
    return xxhash.xxh64_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))  # BUG


def hash_fn_by_name(name: str, profile: str | ProfileBehaviour | None = None) -> HashFn:
    real = get_hash_fn_by_name(name, profile)
    return xxh64_pickle if name == "xxhash" else real


_none_hash = rebind_function(
    none_hash_for,
    resolve_none_hash=rebind_function(resolve_none_hash, get_hash_fn_by_name=hash_fn_by_name))

IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_xxhash_64bit",
    hasher_cls=rebind(RequestBlockHasher, get_hash_fn_by_name=hash_fn_by_name),
    none_hash=_none_hash)
