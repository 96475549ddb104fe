"""Bug (profiles.py): the ``vllm-0.33`` profile keeps the ``urandom`` NONE_HASH policy of
vLLM <= 0.28.

With PYTHONHASHSEED unset, vLLM >= 0.29 derives NONE_HASH from the fixed string
``"vllm-none-hash"`` for sha256 / sha256_cbor, so every process computes the same block hashes;
a version table that still says ``urandom`` for 0.33 gives every process a random root, and
external caches and routers keyed on vLLM's hashes never hit (peer-systems §4 #3 / #21: the
root hash decides whether hashes agree across processes).
"""

from __future__ import annotations

from dataclasses import replace

from _mutant_base import build, rebind_function

from kvcheck.adapters.reference import none_hash_for, reference_profile
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.reference_impl.profiles import ProfileBehaviour, get_profile


def profile_with_random_root(spec: KVCacheSpec) -> ProfileBehaviour:
    profile = get_profile(reference_profile(spec))
    if profile.name == "vllm-0.33":
        profile = replace(profile, none_hash="urandom")  # BUG: 0.29 changed it to default_seed
    return profile


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_profile_033_random_root", profile_of=profile_with_random_root,
    none_hash=rebind_function(none_hash_for, reference_profile=profile_with_random_root))
