"""Bug (extra_keys.py): a block's multimodal keys come before its LoRA key.

vLLM's order is LoRA, multimodal items, cache salt, prompt embeds; the extra keys are a tuple,
so any other order hashes differently. Requests with both a LoRA adapter and an image then
get hashes no vLLM replica computes, and every external cache keyed on vLLM's hashes misses
them (peer-systems §4 #21: llm-d-kv-cache#138 / vllm#23673, a silent hash-scheme change).
"""

from __future__ import annotations

from typing import Any

from _mutant_base import build, rebind

from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.extra_keys import ExtraKeys, generate_block_hash_extra_keys


def mm_before_lora(*args: Any, **kwargs: Any) -> tuple[ExtraKeys, int]:
    keys, next_mm_idx = generate_block_hash_extra_keys(*args, **kwargs)
    if keys is not None:
        # BUG: ("mm", ...) keys are emitted before ("lora", ...); the rest keeps its order.
        keys = tuple(sorted(keys, key=lambda k: not (isinstance(k, tuple) and k[0] == "mm")))
    return keys, next_mm_idx


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_extra_keys_mm_before_lora",
    hasher_cls=rebind(RequestBlockHasher, generate_block_hash_extra_keys=mm_before_lora),
    pool_cls=rebind(BlockPool, generate_block_hash_extra_keys=mm_before_lora))
