"""Bug: NONE_HASH is random per instance even though PYTHONHASHSEED is pinned.

vllm#17088 (peer-systems §4 #3) inverted the seed test, so NONE_HASH was random exactly when
PYTHONHASHSEED *was* set: two processes with the same seed computed different hashes for
every block and external caches never hit. With a seed, vLLM's NONE_HASH is
``hash_fn(seed)``.
"""

import os

from _mutant_base import build


def random_none_hash(spec):
    return os.urandom(32)  # BUG: ignores spec.pythonhashseed


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_none_hash_random", none_hash=random_none_hash)
