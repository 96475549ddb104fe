"""Per-block extra hash keys: LoRA, MM items, salt, prompt embeds (docs/semantics.md#extra-keys).

Contract: ``generate_block_hash_extra_keys`` returns the third element of the hashed 3-tuple
``(parent, tokens, extra_keys)`` for one block, built the way vLLM builds it (same order, same
tuple shapes, same literal tag strings), or ``None`` when the block has no extras: never ``()``,
which would hash differently. The profile's ``extra_key_format`` selects the generator:
``"tagged"`` is vLLM 0.31+ (0.33), ``"bare"`` is vLLM 0.10.2, including its multimodal scan.
"""

from __future__ import annotations

import hashlib
from collections.abc import MutableMapping, Sequence
from typing import TYPE_CHECKING

from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.profiles import ProfileBehaviour, get_profile

if TYPE_CHECKING:
    from kvcheck.reference_impl.request import MultiModalFeature, PromptEmbeds, Request

__all__ = [
    "ExtraKeys",
    "PromptEmbedsDigestCache",
    "generate_block_hash_extra_keys",
    "to_event_extra_keys",
]

# The extra keys of one block: a non-empty tuple, or None when the block has no extras.
ExtraKeys = tuple[object, ...] | None

# (start_token_idx, end_token_idx) -> sha256 digest of that slice of one request's prompt embeds.
PromptEmbedsDigestCache = MutableMapping[tuple[int, int], bytes]


def _scan_mm_tagged(
    features: Sequence[MultiModalFeature], start: int, end: int, start_mm_idx: int
) -> tuple[list[object], int]:
    """0.33 scan: every item with ``end > offset and start < offset + length``.

    Returns the keys (``("mm", identifier, offset - start)``, in feature order) and the index of
    the first item this block does not finish (where the next block's scan may resume).
    """
    keys: list[object] = []
    idx = start_mm_idx
    next_idx: int | None = None
    while idx < len(features):
        feature = features[idx]
        if feature.offset >= end:
            # Features are sorted by offset: neither this item nor any later one reaches the block.
            break
        item_end = feature.offset + feature.length
        if start < item_end:
            # Half-open overlap of [start, end) and [offset, item_end). The offset is relative to
            # the block start and is negative when the item began in an earlier block.
            # The "mm" literal is one interned object, as in vLLM: pickle then memoizes it
            # across several items of the same block (docs/semantics.md#serialization-bytes).
            keys.append(("mm", feature.identifier, feature.offset - start))
        if item_end > end and next_idx is None:
            # The item continues into the next block: it is the earliest one still open.
            next_idx = idx
        idx += 1
    return keys, (idx if next_idx is None else next_idx)


def _scan_mm_bare(
    features: Sequence[MultiModalFeature], start: int, end: int, start_mm_idx: int
) -> tuple[list[object], int]:
    """0.10.2 scan: keys are bare identifiers (``mm_hash``); comparisons are strict.

    Quirks kept on purpose: a block that starts exactly at an item's end still carries that item
    (``start > item_end`` skips, ``==`` does not); a negative ``start_mm_idx`` counts from the end
    (``-1`` = the last item, what incremental blocks use), so earlier items are never seen.
    """
    keys: list[object] = []
    last = features[-1]
    if last.offset + last.length < start:
        # Every item ended before this block (strictly): nothing to scan, index unchanged.
        return keys, start_mm_idx
    idx = start_mm_idx + len(features) if start_mm_idx < 0 else start_mm_idx
    while idx < len(features):
        feature = features[idx]
        item_end = feature.offset + feature.length
        if end <= feature.offset:
            break  # the block has not reached this item yet
        if start > item_end:
            idx += 1  # the block is past this item
            continue
        keys.append(feature.identifier)
        if end >= item_end:
            idx += 1  # the block holds the item's end; the next item may start in it too
        else:
            break  # the item continues past the block
    return keys, idx


def _prompt_embeds_digest(
    embeds: PromptEmbeds, start: int, end: int, cache: PromptEmbedsDigestCache | None
) -> bytes:
    """sha256 of the raw bytes of ``prompt_embeds[start:end]`` (possibly an empty slice)."""
    if cache is not None and (start, end) in cache:
        return cache[(start, end)]
    # Slicing past the prompt gives a short or empty slice; vLLM hashes whatever it gets, so a
    # decode-only block carries sha256(b"").
    digest = hashlib.sha256(embeds[start:end].tobytes()).digest()
    if cache is not None:
        cache[(start, end)] = digest
    return digest


def generate_block_hash_extra_keys(
    request: Request,
    start_token_idx: int,
    end_token_idx: int,
    start_mm_idx: int,
    profile: str | ProfileBehaviour | None = None,
    *,
    prompt_embeds_cache: PromptEmbedsDigestCache | None = None,
) -> tuple[ExtraKeys, int]:
    """Extra keys of the block covering tokens ``[start_token_idx, end_token_idx)``.

    Order: LoRA, then multimodal items (in feature order), then cache_salt, then prompt embeds.

    - ``"tagged"`` (0.33): ``("lora", lora_name, lora_path)``;
      ``("mm", identifier, offset - start_token_idx)`` per overlapping item;
      ``("cache_salt", salt)`` on the block starting at token 0 when the salt is truthy;
      ``("prompt_embeds", sha256(prompt_embeds[start:end].tobytes()).digest())`` when
      ``request.prompt_embeds is not None``.
    - ``"bare"`` (0.10.2): ``lora_int_id``; ``identifier`` per item (0.10.2 scan, see
      ``_scan_mm_bare``); ``salt`` on block 0; prompt embeds are not hashed.

    Args:
        request: read only (token positions, ``lora_request``, ``mm_features``, ``cache_salt``,
            ``prompt_embeds``); not modified.
        start_token_idx, end_token_idx: the block's token range, ``start < end``.
        start_mm_idx: the index in ``request.mm_features`` to start the multimodal scan from
            (0 for a first block; 0.10.2 incremental blocks pass -1 = the last item).
        profile: selects the format; ``None`` is the default profile.
        prompt_embeds_cache: optional per-request memo of embeds digests keyed by
            ``(start, end)``; filled on a miss.

    Returns:
        ``(extra_keys, next_mm_idx)``: a non-empty tuple or ``None``, and the scan index for the
        next block.
    """
    prof = get_profile(profile)
    tagged = prof.extra_key_format == "tagged"
    keys: list[object] = []
    lora = request.lora_request
    if lora is not None:
        # Never copied: pickle memoizes by identity (docs/semantics.md#serialization-bytes).
        keys.append(("lora", lora.lora_name, lora.lora_path) if tagged else lora.lora_int_id)
    next_mm_idx = start_mm_idx
    features = request.mm_features
    if features:
        scan = _scan_mm_tagged if tagged else _scan_mm_bare
        mm_keys, next_mm_idx = scan(features, start_token_idx, end_token_idx, start_mm_idx)
        keys.extend(mm_keys)
    salt = request.cache_salt
    if start_token_idx == 0 and salt:
        # Only the first block carries the salt; chaining propagates it to every later block.
        keys.append(("cache_salt", salt) if tagged else salt)
    embeds = request.prompt_embeds if tagged else None
    if embeds is not None:
        digest = _prompt_embeds_digest(
            embeds, start_token_idx, end_token_idx, prompt_embeds_cache
        )
        keys.append(("prompt_embeds", digest))
    return (tuple(keys) if keys else None), next_mm_idx


def to_event_extra_keys(extra_keys: ExtraKeys) -> ExtraKeys:
    """The untagged form KV events publish for one block's extra keys (docs/semantics.md#kv-events).

    ``("lora", name, path)`` -> ``name``; ``("mm", identifier, offset)`` ->
    ``(identifier, offset)``; ``("cache_salt", salt)`` -> ``salt``;
    ``("prompt_embeds", digest)`` -> ``digest``. ``None`` stays ``None``. Order is kept.

    Takes the normal keys ``E`` of a block, not a lookahead-extended ``(E, *tokens)``.

    Raises:
        KVCacheMisuseError: an entry that is not a tagged (0.31+) key, e.g. 0.10.2's bare keys.
    """
    if extra_keys is None:
        return None
    stripped: list[object] = []
    for key in extra_keys:
        parts: tuple[object, ...] = key if isinstance(key, tuple) else ()
        tag = parts[0] if parts else None
        if tag == "lora" and len(parts) == 3:
            stripped.append(parts[1])
        elif tag == "mm" and len(parts) == 3:
            stripped.append((parts[1], parts[2]))
        elif tag in ("cache_salt", "prompt_embeds") and len(parts) == 2:
            stripped.append(parts[1])
        else:
            raise KVCacheMisuseError(f"not a tagged extra key: {key!r} (in {extra_keys!r})")
    return tuple(stripped)
