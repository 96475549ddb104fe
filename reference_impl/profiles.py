"""Version profiles: the handful of vLLM behaviours that changed between releases.

A profile is selected by one argument (``profile="vllm-0.33"``) everywhere in the reference.
Each field names one behaviour that docs/semantics.md#differences says must be
version-gated; everything not listed here is identical in 0.10.2 and 0.33.0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvcheck.reference_impl.errors import KVCacheMisuseError

__all__ = [
    "BEHAVIOURS",
    "DEFAULT_PROFILE",
    "ProfileBehaviour",
    "get_profile",
]

FreeOrder = Literal["head_tail_split", "append_all"]
NoneHashPolicy = Literal["default_seed", "urandom"]
ExtraKeyFormat = Literal["tagged", "bare"]
HybridRules = Literal["spec_groups", "full_and_other"]


@dataclass(frozen=True, slots=True)
class ProfileBehaviour:
    """Behaviour switches of one vLLM release line.

    Attributes:
        name: the public profile name, e.g. ``"vllm-0.33"``.
        vllm_version: the release whose code produced the golden traces for this profile.
        free_order: ``"head_tail_split"`` (>= 0.28, and 0.24-0.26): blocks that reach
            ``ref_cnt == 0`` unhashed (or with caching off) are prepended to the free queue
            keeping their order, hashed ones appended; ``"append_all"`` (<= 0.23, 0.10.2):
            every freed block is appended to the tail.
        none_hash: ``"default_seed"`` (>= 0.29): with PYTHONHASHSEED unset, NONE_HASH is
            ``hash_fn("vllm-none-hash")`` for sha256 / sha256_cbor and random for the xxhash
            variants; ``"urandom"`` (<= 0.28): raw ``os.urandom(32)`` when unset.
        extra_key_format: ``"tagged"`` (>= 0.31): ``("lora", name, path)``,
            ``("mm", identifier, offset)``, ``("cache_salt", salt)``,
            ``("prompt_embeds", digest)``; ``"bare"`` (0.10.2): ``lora_int_id``, ``mm_hash``,
            ``salt``.
        hash_algos: the hash algorithms the release offers.
        has_prepend_n: whether ``FreeKVCacheBlockQueue.prepend_n`` exists (0.33 only).
        touch_null_ref_cnt: 0.10.2 increments the null block's ``ref_cnt`` in ``touch``;
            0.33 skips null blocks entirely.
        event_parent_from_physical: 0.10.2 takes ``BlockStored.parent_block_hash`` from the
            physical previous block; 0.33 uses the logical ``request.block_hashes[i - 1]``.
        allocate_zero_new_tokens_raises_always: 0.10.2 raises for any ``num_new_tokens == 0``;
            0.33 only when there are also no computed tokens to add.
        clamp_blocks_to_allocate: 0.33 clamps the new-block count of
            ``get_num_blocks_to_allocate`` at 0; 0.10.2 does not.
        live_common_prefix_blocks: 0.10.2 computes ``get_num_common_prefix_blocks``; 0.33
            always returns 0 (cascade attention was removed).
        hybrid_rules: the KV-cache-group rules
        (docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups), used by
            ``kv_cache_manager``, ``kv_cache_coordinator`` and
            ``single_type_kv_cache_manager``: ``"spec_groups"`` (0.33: any number
            of spec groups with a fixed-point hit search, LCM/GCD block sizes, skip-aware hits
            and block counts, leading nulls trimmed on free, the sliding-window cache mask,
            logical event parents, empty ``BlockStored``); ``"full_and_other"`` (0.10.2: one
            full spec and one other spec, one block size with caching, hits stored as returned
            with the null block's ``ref_cnt`` drifting, removal from ``num_computed_tokens``,
            chunked local keeps its last cached block).
    """

    name: str
    vllm_version: str
    free_order: FreeOrder
    none_hash: NoneHashPolicy
    extra_key_format: ExtraKeyFormat
    hash_algos: tuple[str, ...]
    has_prepend_n: bool
    touch_null_ref_cnt: bool
    event_parent_from_physical: bool
    allocate_zero_new_tokens_raises_always: bool
    clamp_blocks_to_allocate: bool
    live_common_prefix_blocks: bool
    hybrid_rules: HybridRules


VLLM_0_33 = ProfileBehaviour(
    name="vllm-0.33",
    vllm_version="0.33.0",
    free_order="head_tail_split",
    none_hash="default_seed",
    extra_key_format="tagged",
    hash_algos=("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"),
    has_prepend_n=True,
    touch_null_ref_cnt=False,
    event_parent_from_physical=False,
    allocate_zero_new_tokens_raises_always=False,
    clamp_blocks_to_allocate=True,
    live_common_prefix_blocks=False,
    hybrid_rules="spec_groups",
)

VLLM_0_10 = ProfileBehaviour(
    name="vllm-0.10",
    vllm_version="0.10.2",
    free_order="append_all",
    none_hash="urandom",
    extra_key_format="bare",
    hash_algos=("sha256", "sha256_cbor"),
    has_prepend_n=False,
    touch_null_ref_cnt=True,
    event_parent_from_physical=True,
    allocate_zero_new_tokens_raises_always=True,
    clamp_blocks_to_allocate=False,
    live_common_prefix_blocks=True,
    hybrid_rules="full_and_other",
)

BEHAVIOURS: dict[str, ProfileBehaviour] = {p.name: p for p in (VLLM_0_33, VLLM_0_10)}
DEFAULT_PROFILE = VLLM_0_33.name


def get_profile(profile: str | ProfileBehaviour | None = None) -> ProfileBehaviour:
    """Resolve a profile name (or pass a ``ProfileBehaviour`` through); ``None`` means the default.

    Raises:
        KVCacheMisuseError: for an unknown name, listing the known ones.
    """
    if profile is None:
        return BEHAVIOURS[DEFAULT_PROFILE]
    if isinstance(profile, ProfileBehaviour):
        return profile
    try:
        return BEHAVIOURS[profile]
    except KeyError:
        known = ", ".join(sorted(BEHAVIOURS))
        raise KVCacheMisuseError(
            f"unknown kvcheck profile {profile!r}; known profiles: {known}"
        ) from None
