"""Bug (block_hasher.py): a block's hash leaves the LoRA adapter out of its extra keys.

Requests with the same tokens under different adapters (or one with an adapter and one
without) then get the same block hashes and hit each other's KV, computed with another
adapter's weights: wrong outputs, and across tenants a leak. The multimodal and salt keys are
kept, and KV events still name the adapter (the pool's own keys are untouched), so only the
content key is wrong. Under ``--kv-profile=generic`` (no vLLM hashes compared) the random
workloads meet it only by luck (about 400 examples); the scripted
``test_lora_contexts_never_share_blocks`` fails it at once.
"""

from __future__ import annotations

from typing import Any

from _mutant_base import build, rebind

from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.extra_keys import ExtraKeys, generate_block_hash_extra_keys


def lora_left_out(request: Any, *args: Any, **kwargs: Any) -> tuple[ExtraKeys, int]:
    keys, next_mm_idx = generate_block_hash_extra_keys(request, *args, **kwargs)
    if keys is not None and request.lora_request is not None:
        keys = keys[1:] or None  # BUG: the LoRA key (always the first) is dropped
    return keys, next_mm_idx


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_lora_left_out_of_key",
    hasher_cls=rebind(RequestBlockHasher, generate_block_hash_extra_keys=lora_left_out))
