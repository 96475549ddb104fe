"""Chained block hashes of a request's full blocks (docs/semantics.md#request-block-hashes).

Contract: block ``i`` of a request hashes ``(hash of block i-1 or NONE_HASH, tuple(its
block_size token ids), extra_keys)``; only full blocks are hashed, so ``block_hashes`` is always
a prefix of the chain and extends incrementally, giving the same list as hashing in one shot.
The hasher object owns its ``NONE_HASH`` (no process-global state).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final
from weakref import WeakKeyDictionary

from kvcheck.reference_impl.block import BlockHash
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.extra_keys import (
    ExtraKeys,
    PromptEmbedsDigestCache,
    generate_block_hash_extra_keys,
)
from kvcheck.reference_impl.hashing import HashFn, get_hash_fn_by_name, resolve_none_hash
from kvcheck.reference_impl.profiles import ProfileBehaviour, get_profile

if TYPE_CHECKING:
    from kvcheck.reference_impl.request import Request

__all__ = ["RequestBlockHasher", "hash_block_tokens", "hash_request_tokens"]

# docs/semantics.md#request-block-hashes has lookahead hashing (EAGLE/MTP) for 0.33 only;
# refusing older profiles is safer than guessing when it appeared.
_MIN_LOOKAHEAD_VERSION: Final = (0, 33)


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"0.10.2"`` -> ``(0, 10, 2)``; stops at the first non-numeric component."""
    parts: list[int] = []
    for part in version.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def hash_block_tokens(
    hash_fn: HashFn,
    parent_block_hash: bytes | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: ExtraKeys = None,
    *,
    none_hash: bytes,
) -> BlockHash:
    """Hash one block: ``hash_fn((parent_block_hash or none_hash, tuple(token_ids), extra_keys))``.

    A falsy parent (``None`` or ``b""``) means "first block" and is replaced by ``none_hash``.
    Token ids must be Python ``int``s to get vLLM's bytes (pickle encodes numpy ints otherwise);
    ``extra_keys`` is ``None`` or a non-empty tuple (``()`` hashes differently from ``None``).
    """
    return BlockHash(
        hash_fn((parent_block_hash or none_hash, tuple(curr_block_token_ids), extra_keys))
    )


def _rewind_mm_idx(request: Request, mm_idx: int, end: int) -> int:
    """The multimodal scan index moved back to the first item ending after ``end``: a
    lookahead window scanned past items that the next block overlaps too."""
    features = request.mm_features
    while mm_idx > 0:
        item = features[mm_idx - 1]
        if item.offset + item.length <= end:
            break
        mm_idx -= 1
    return mm_idx


class RequestBlockHasher:
    """The ``block_hasher`` a ``Request`` calls: hashes of its newly completed blocks.

    Attributes:
        block_size: tokens per hashed block (vLLM's ``hash_block_size``), >= 1.
        hash_algo: the algorithm name; ``hash_fn`` is the resolved function.
        profile: the resolved ``ProfileBehaviour``; it selects the extra-key format, the
            multimodal scan and whether lookahead is allowed.
        none_hash: the root parent of every chain (resolved from PYTHONHASHSEED when not given).
        num_lookahead_tokens: L >= 0; a block is hashed only once the L tokens after it exist,
            and those tokens enter its extra keys (0.33 only).
    """

    def __init__(
        self,
        block_size: int,
        hash_algo: str = "sha256",
        *,
        profile: str | ProfileBehaviour | None = None,
        none_hash: bytes | None = None,
        num_lookahead_tokens: int = 0,
    ) -> None:
        """Validate the arguments and resolve the hash function and ``NONE_HASH``.

        Raises:
            KVCacheMisuseError: ``block_size < 1``; ``num_lookahead_tokens < 0``; lookahead under a
                profile older than 0.33; an empty ``none_hash``; an algorithm the profile does
                not offer.
        """
        if block_size < 1:
            raise KVCacheMisuseError(f"block_size must be >= 1, got {block_size}")
        if num_lookahead_tokens < 0:
            raise KVCacheMisuseError(
                f"num_lookahead_tokens must be >= 0, got {num_lookahead_tokens}")
        self.profile: ProfileBehaviour = get_profile(profile)
        if num_lookahead_tokens and (
            _version_tuple(self.profile.vllm_version) < _MIN_LOOKAHEAD_VERSION
        ):
            raise KVCacheMisuseError(
                f"num_lookahead_tokens={num_lookahead_tokens} needs lookahead block hashing, "
                f"which profile {self.profile.name!r} (vLLM {self.profile.vllm_version}) "
                "does not have; use num_lookahead_tokens=0 or a vllm-0.33 profile"
            )
        self.block_size: int = block_size
        self.hash_algo: str = hash_algo
        self.hash_fn: HashFn = get_hash_fn_by_name(hash_algo, self.profile)
        if none_hash is None:
            none_hash = resolve_none_hash(hash_algo, self.profile)
        elif not none_hash:
            # An empty root would be indistinguishable from "no parent" in hash_block_tokens.
            raise KVCacheMisuseError("none_hash must be non-empty bytes")
        self.none_hash: bytes = none_hash
        self.num_lookahead_tokens: int = num_lookahead_tokens
        # 0.10.2 starts the multimodal scan of incremental blocks at the last item; 0.33 rescans
        # from 0 so a decode block overlapping an image gets its key (docs/semantics.md#extra-keys).
        self._incremental_mm_idx: int = -1 if self.profile.extra_key_format == "bare" else 0
        # Embeds digests per live request (vLLM caches them on the request); weak so finished
        # requests are not kept alive by the hasher.
        self._embeds_caches: WeakKeyDictionary[Request, PromptEmbedsDigestCache] = (
            WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return (
            f"RequestBlockHasher(block_size={self.block_size}, hash_algo={self.hash_algo!r}, "
            f"profile={self.profile.name!r}, num_lookahead_tokens={self.num_lookahead_tokens})"
        )

    def _with_lookahead(self, extra_keys: ExtraKeys, token_ids: Sequence[int],
                        end: int) -> ExtraKeys:
        # (E, t_end) for L=1, (E, t_end, ..., t_end+L-1) for L>1: one formula, E kept even if None.
        if not self.num_lookahead_tokens:
            return extra_keys
        return (extra_keys, *token_ids[end : end + self.num_lookahead_tokens])

    def __call__(self, request: Request) -> list[BlockHash]:
        """Hashes of the full blocks after ``request.block_hashes``; does not modify the request.

        Starts at token ``len(request.block_hashes) * block_size``, chains from
        ``request.block_hashes[-1]`` and stops at the last block with
        ``end <= request.num_tokens - num_lookahead_tokens``. Returns ``[]`` when no new block is
        complete. The caller (``Request.update_block_hashes``) extends ``block_hashes``.
        """
        start = len(request.block_hashes) * self.block_size
        hashable_end = request.num_tokens - self.num_lookahead_tokens
        if start + self.block_size > hashable_end:
            return []  # most decode steps: no block completed
        token_ids = request.all_token_ids
        parent: bytes | None = request.block_hashes[-1] if request.block_hashes else None
        if (request.lora_request is None and not request.mm_features
                and request.prompt_embeds is None and not request.cache_salt
                and not self.num_lookahead_tokens):
            return self._plain_hashes(token_ids, start, hashable_end, parent)
        mm_idx = 0 if start == 0 else self._incremental_mm_idx
        embeds_cache = None
        if request.prompt_embeds is not None:
            embeds_cache = self._embeds_caches.setdefault(request, {})
        new_hashes: list[BlockHash] = []
        lookahead = self.num_lookahead_tokens
        while start + self.block_size <= hashable_end:
            end = start + self.block_size
            # With lookahead, E covers the block and its lookahead tokens (an image starting
            # in them is keyed), and the scan resumes at the first item still overlapping
            # the next block (vLLM 0.33's generate_lookahead_block_hash_extra_keys).
            extra_keys, mm_idx = generate_block_hash_extra_keys(
                request, start, end + lookahead, mm_idx, self.profile,
                prompt_embeds_cache=embeds_cache
            )
            if lookahead:
                mm_idx = _rewind_mm_idx(request, mm_idx, end)
            block_hash = hash_block_tokens(
                self.hash_fn,
                parent,
                token_ids[start:end],
                self._with_lookahead(extra_keys, token_ids, end),
                none_hash=self.none_hash,
            )
            new_hashes.append(block_hash)
            parent, start = block_hash, end
        return new_hashes

    def _plain_hashes(self, token_ids: Sequence[int], start: int, hashable_end: int,
                      parent: bytes | None) -> list[BlockHash]:
        """``__call__`` for a request with nothing that makes extra keys (no LoRA, multimodal
        item, cache salt or prompt embeds) and no lookahead: every block's extra keys are
        None, so the per-block extra-key scan is skipped. Same bytes, about a quarter less
        time per block; most prompts take this path."""
        hash_fn, none_hash, size = self.hash_fn, self.none_hash, self.block_size
        new_hashes: list[BlockHash] = []
        while start + size <= hashable_end:
            end = start + size
            parent = hash_block_tokens(hash_fn, parent, token_ids[start:end], None,
                                       none_hash=none_hash)
            new_hashes.append(parent)
            start = end
        return new_hashes


def hash_request_tokens(
    hasher: RequestBlockHasher,
    token_ids: Sequence[int],
    *,
    parent_block_hash: bytes | None = None,
) -> list[BlockHash]:
    """Chained hashes of the full blocks of a plain token list (no LoRA, MM, salt or embeds).

    Uses ``hasher``'s block size, function, ``NONE_HASH`` and lookahead, so the result equals
    what ``hasher`` gives a request with these tokens and no extras; handy for tests and for a
    router predicting cache keys. ``parent_block_hash`` continues an existing chain (``None``:
    start from ``NONE_HASH``). The trailing partial block (and, with lookahead L, any block
    whose next L tokens are missing) is not hashed.
    """
    block_size = hasher.block_size
    hashable_end = len(token_ids) - hasher.num_lookahead_tokens
    parent = parent_block_hash
    hashes: list[BlockHash] = []
    for start in range(0, hashable_end - block_size + 1, block_size):
        end = start + block_size
        block_hash = hash_block_tokens(
            hasher.hash_fn,
            parent,
            token_ids[start:end],
            hasher._with_lookahead(None, token_ids, end),
            none_hash=hasher.none_hash,
        )
        hashes.append(block_hash)
        parent = block_hash
    return hashes
