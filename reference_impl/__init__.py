"""kvcheck.reference_impl: a pure-Python paged KV-cache manager with vLLM V1 semantics.

No torch import anywhere in this package, so the conformance suite runs on any CPU machine.
Behaviour that changed between vLLM releases is selected by a profile (``vllm-0.33``, the
default, or ``vllm-0.10``).
"""

from kvcheck.reference_impl.block import (
    BlockHash,
    BlockHashWithGroupId,
    KVCacheBlock,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
)
from kvcheck.reference_impl.block_hasher import (
    RequestBlockHasher,
    hash_block_tokens,
    hash_request_tokens,
)
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.block_table import (
    PAD_SLOT_ID,
    BlockTable,
    compute_slot_mapping,
    slot_mapping_for_request,
)
from kvcheck.reference_impl.errors import FreeQueueMisuseError, KVCacheMisuseError
from kvcheck.reference_impl.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvcheck.reference_impl.free_block_queue import FreeKVCacheBlockQueue
from kvcheck.reference_impl.hashing import (
    HASH_FUNCTIONS,
    get_hash_fn_by_name,
    resolve_none_hash,
)
from kvcheck.reference_impl.invariants import (
    InvariantViolation,
    check_invariants,
    check_manager_invariants,
)
from kvcheck.reference_impl.kv_cache_coordinator import partial_hash_hits_enabled
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.profiles import (
    BEHAVIOURS,
    DEFAULT_PROFILE,
    ProfileBehaviour,
    get_profile,
)
from kvcheck.reference_impl.request import LoRARequest, MultiModalFeature, Request

__all__ = [
    "BEHAVIOURS",
    "DEFAULT_PROFILE",
    "HASH_FUNCTIONS",
    "PAD_SLOT_ID",
    "AllBlocksCleared",
    "BlockHash",
    "BlockHashWithGroupId",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "BlockTable",
    "ChunkedLocalAttentionSpec",
    "FreeKVCacheBlockQueue",
    "FreeQueueMisuseError",
    "FullAttentionSpec",
    "InvariantViolation",
    "KVCacheBlock",
    "KVCacheManager",
    "KVCacheMisuseError",
    "LoRARequest",
    "MultiModalFeature",
    "ProfileBehaviour",
    "Request",
    "RequestBlockHasher",
    "SlidingWindowSpec",
    "check_invariants",
    "check_manager_invariants",
    "compute_slot_mapping",
    "get_block_hash",
    "get_group_id",
    "get_hash_fn_by_name",
    "get_profile",
    "hash_block_tokens",
    "hash_request_tokens",
    "make_block_hash_with_group_id",
    "partial_hash_hits_enabled",
    "resolve_none_hash",
    "slot_mapping_for_request",
]
