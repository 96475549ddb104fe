"""KV-cache specs of one KV-cache group (vLLM ``v1/kv_cache_interface.py``, block management
fields only).

A spec says how a group's layers use their blocks: ``FullAttentionSpec`` keeps every block,
``SlidingWindowSpec`` only needs the last ``sliding_window`` tokens, and
``ChunkedLocalAttentionSpec`` only the current ``attention_chunk_size``-token chunk,
``CrossAttentionSpec`` (an encoder-decoder model's decoder reading the encoder's output) holds
one static allocation for the request's encoder tokens, and ``MambaSpec`` (a state-space
layer) only the state after the last computed token. Specs are
frozen and compared by value (class included): two groups with equal specs are looked up
together in a hybrid model's hit search. Page sizes, dtypes and head counts are sizing
concerns (``kvcheck.reference_impl.sizing``), not modelled here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcheck.reference_impl.errors import KVCacheMisuseError

__all__ = [
    "MAMBA_CACHE_MODES",
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "KVCacheSpec",
    "MambaSpec",
    "SlidingWindowSpec",
    "get_kv_cache_spec_kind",
    "get_kv_cache_spec_sliding_window",
    "kv_cache_event_metadata",
]


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise KVCacheMisuseError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """Base of every group spec: ``block_size`` tokens per block of this group."""

    block_size: int

    def __post_init__(self) -> None:
        _positive("block_size", self.block_size)


@dataclass(frozen=True, slots=True)
class FullAttentionSpec(KVCacheSpec):
    """Full attention: every block of a request is kept until the request is freed."""


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec(KVCacheSpec):
    """Sliding-window attention over the last ``sliding_window`` tokens (the new token
    included): ``max(0, n - sliding_window + 1 - extra_retained_tokens)`` leading tokens of
    ``n`` computed ones are skipped, and their whole blocks become null blocks.

    ``extra_retained_tokens``: vLLM 0.33's trailing extension of the window (multi-module MTP
    re-prefills the last ``num_prefill_lookahead - 1`` tokens, so their blocks are kept, not
    attended); ``KVCacheManager`` sets it on every sliding-window group from its
    ``num_prefill_lookahead``, as vLLM's ``kv_cache_planning`` does."""

    sliding_window: int
    extra_retained_tokens: int = 0

    def __post_init__(self) -> None:
        _positive("block_size", self.block_size)
        _positive("sliding_window", self.sliding_window)
        if (not isinstance(self.extra_retained_tokens, int)
                or isinstance(self.extra_retained_tokens, bool)
                or self.extra_retained_tokens < 0):
            raise KVCacheMisuseError(
                f"extra_retained_tokens must be an int >= 0, got {self.extra_retained_tokens!r}")


@dataclass(frozen=True, slots=True)
class ChunkedLocalAttentionSpec(KVCacheSpec):
    """Chunked local attention: a token attends only to the tokens of its own
    ``attention_chunk_size``-token chunk; blocks of finished chunks become null blocks."""

    attention_chunk_size: int

    def __post_init__(self) -> None:
        _positive("block_size", self.block_size)
        _positive("attention_chunk_size", self.attention_chunk_size)


@dataclass(frozen=True, slots=True)
class CrossAttentionSpec(KVCacheSpec):
    """Cross attention of an encoder-decoder model (Whisper): the decoder's cross-attention
    layers read the encoder's output, ``num_encoder_tokens`` positions computed once per
    request. Their blocks are one static allocation made when the scheduler schedules the
    encoder input (``allocate_slots(..., num_encoder_tokens=E)``), kept until the request is
    freed, never cached nor shared: encoder-decoder models run with prefix caching off
    (vLLM ``v1/core/single_type_kv_cache_manager.py`` ``CrossAttentionManager``, both
    releases)."""


#: ``MambaSpec.mamba_cache_mode`` values (vLLM 0.33 ``config/cache.py`` ``MambaCacheMode``).
MAMBA_CACHE_MODES = ("none", "align")


@dataclass(frozen=True, slots=True)
class MambaSpec(KVCacheSpec):
    """Mamba (state-space) layers: a request's state after its last computed token is all a
    step reads, so ``n - 1`` of ``n`` computed tokens are skipped (vLLM 0.33; 0.10.2 keeps
    its blocks until the request is freed). Block manager fields of vLLM's ``MambaSpec``
    (``v1/kv_cache_interface.py``; shapes, dtypes and page padding are sizing's
    ``LayerKVSpec(kind="mamba")``):

    * ``mamba_cache_mode`` (0.33 only; 0.10.2 has no such field, its behaviour is "none"):
      ``"none"``, prefix caching off, one state per request; ``"align"``, prefix caching on:
      the state of the last token of each step is kept in its own block, cached when that
      token ends a block, and the block from two steps ago is freed and nulled;
    * ``num_speculative_blocks``: extra blocks per request for speculative decoding
      (MTP/EAGLE draft states), both releases;
    * ``num_prefill_checkpoint_blocks`` and ``prefill_checkpoint_alignment`` (0.33 only): a
      prefill chunk in "align" mode may also export the state at its last reusable boundary
      (the prefill checkpoint) into one more block, the one before its last state block
      (docs/semantics.md#mamba-prefill-checkpoints); ``num_prefill_checkpoint_blocks > 0``
      turns that on, ``prefill_checkpoint_alignment`` (None: the backend exports none) is the
      token grid the checkpoint's offset from the chunk start must be on.
    """

    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None

    def __post_init__(self) -> None:
        _positive("block_size", self.block_size)
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise KVCacheMisuseError(
                f"mamba_cache_mode must be one of {MAMBA_CACHE_MODES} (vLLM 0.33 "
                f"MambaCacheMode), got {self.mamba_cache_mode!r}")
        n = self.num_speculative_blocks
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise KVCacheMisuseError(f"num_speculative_blocks must be an int >= 0, got {n!r}")
        c = self.num_prefill_checkpoint_blocks
        if not isinstance(c, int) or isinstance(c, bool) or c < 0:
            raise KVCacheMisuseError(
                f"num_prefill_checkpoint_blocks must be an int >= 0, got {c!r}")
        a = self.prefill_checkpoint_alignment
        if a is not None and (not isinstance(a, int) or isinstance(a, bool) or a < 1):
            raise KVCacheMisuseError(
                f"prefill_checkpoint_alignment must be None or an int >= 1 (vLLM 0.33 asserts "
                f"checkpoint_alignment > 0 in is_mamba_prefill_checkpoint_valid), got {a!r}")


def get_kv_cache_spec_kind(spec: KVCacheSpec) -> str:
    """The kind name vLLM 0.33's KV events carry (``get_kv_cache_spec_kind``)."""
    if isinstance(spec, MambaSpec):
        return "mamba"
    if isinstance(spec, CrossAttentionSpec):
        return "cross_attention"
    if isinstance(spec, SlidingWindowSpec):
        return "sliding_window"
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return "chunked_local_attention"
    return "full_attention"


def get_kv_cache_spec_sliding_window(spec: KVCacheSpec) -> int | None:
    """The window a sliding-window spec carries in KV events; None for other kinds."""
    return spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None


def kv_cache_event_metadata(specs: Sequence[KVCacheSpec]) -> tuple[tuple[str, int | None], ...]:
    """Per group, the ``(kv_cache_spec_kind, kv_cache_spec_sliding_window)`` vLLM 0.33's
    ``KVCacheManager.take_events`` puts on each ``BlockStored`` of that group."""
    return tuple((get_kv_cache_spec_kind(s), get_kv_cache_spec_sliding_window(s))
                 for s in specs)
