"""``Request``: the reference's stand-in for vLLM's ``v1.request.Request``.

Only what block management reads is modelled: the token ids (prompt + output), the number of
tokens whose KV is already computed, the per-block hashes, and the inputs that enter the hash
as extra keys (LoRA, multimodal items, ``cache_salt``, prompt embeds).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict

from kvcheck.reference_impl.errors import KVCacheMisuseError

if TYPE_CHECKING:
    from kvcheck.reference_impl.block import BlockHash

__all__ = ["LoRARequest", "MultiModalFeature", "PromptEmbeds", "Request", "RequestOptions"]


class _EmbedsSlice(Protocol):
    def tobytes(self) -> bytes: ...


class PromptEmbeds(Protocol):
    """Per-token prompt embeddings: any object with ``__getitem__(slice)`` whose slices expose
    ``tobytes()`` (e.g. a numpy array ``[num_prompt_tokens, hidden_size]``)."""

    def __getitem__(self, index: slice, /) -> _EmbedsSlice: ...


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """The LoRA adapter of a request. 0.10.2 hashes ``lora_int_id``; 0.31+ hashes
    ``("lora", lora_name, lora_path)``."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""


@dataclass(frozen=True, slots=True)
class MultiModalFeature:
    """One multimodal item placed in the prompt: tokens ``[offset, offset + length)``.

    ``identifier`` is vLLM's ``mm_hash`` / ``identifier`` string. Features of a request must be
    sorted by ``offset`` (vLLM assumes it).
    """

    identifier: str
    offset: int
    length: int


BlockHasher = Callable[["Request"], "list[BlockHash]"]


class RequestOptions(TypedDict, total=False):
    """The optional ``Request`` fields, as keyword arguments (see ``Request``)."""

    lora_request: LoRARequest | None
    mm_features: Sequence[MultiModalFeature]
    cache_salt: str | None
    prompt_embeds: PromptEmbeds | None
    skip_reading_prefix_cache: bool
    num_computed_tokens: int


@dataclass(eq=False)
class Request:
    """A request as the KV-cache manager sees it.

    Contract: ``block_hashes[i]`` is the chained hash of full block ``i`` and exists only for
    blocks whose ``block_size`` tokens are all known (partial blocks never get a hash). They are
    computed eagerly at construction and extended on every ``append_output_token_ids``, like
    vLLM 0.33 (``v1/request.py``), by the ``block_hasher`` callable (``None`` = no prefix
    caching: ``block_hashes`` stays empty).

    ``num_computed_tokens`` is owned by the caller (the scheduler): the manager reads it and
    never advances it.
    """

    request_id: str
    prompt_token_ids: Sequence[int]
    block_hasher: BlockHasher | None = None
    lora_request: LoRARequest | None = None
    mm_features: Sequence[MultiModalFeature] = ()
    cache_salt: str | None = None
    # Per-token prompt embeddings, any object with ``__getitem__(slice)`` whose slices expose
    # ``tobytes()`` (e.g. a numpy array ``[num_prompt_tokens, hidden_size]``).
    prompt_embeds: PromptEmbeds | None = None
    # vLLM: prompt_logprobs requested (or set explicitly) => never read the prefix cache,
    # but still write to it.
    skip_reading_prefix_cache: bool = False
    num_computed_tokens: int = 0
    all_token_ids: list[int] = field(init=False)
    block_hashes: list[BlockHash] = field(init=False, default_factory=list)
    # Asynchronous scheduling (vLLM 0.33's ``Request.num_in_flight_tokens``): tokens of
    # steps whose output the scheduler has not processed yet, counted optimistically in
    # ``num_computed_tokens``. Owned by the caller too (set on the instance); the manager
    # frees window blocks and finalizes boundary states on the processed basis,
    # ``num_computed_tokens`` minus it. A class default, not a dataclass field: a request's
    # construction (the hot path) stores nothing more.
    num_in_flight_tokens = 0

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise KVCacheMisuseError(f"request_id must be a non-empty str, got {self.request_id!r}")
        # Conversion and checks run in C: per-token Python frames made construction ~1.75x
        # slower than vLLM's. ``array`` takes a tuple or list of ints (and ``__index__`` objects
        # such as numpy integers) in one pass; anything else (floats, strings, huge ints, other
        # iterables) takes the general ``int()`` path, so inputs and errors are unchanged.
        given = self.prompt_token_ids
        prompt: tuple[int, ...] | None = None
        if isinstance(given, (tuple, list)):  # re-iterable: the fallback may read it again
            try:
                prompt = tuple(array("q", given).tolist())
            except (TypeError, OverflowError):
                prompt = None
        if prompt is None:
            prompt = tuple(map(int, given))
        if prompt and min(prompt) < 0:
            raise KVCacheMisuseError(f"request {self.request_id!r}: token ids must be >= 0")
        self.prompt_token_ids = prompt
        self.all_token_ids = list(prompt)
        self.mm_features = tuple(self.mm_features)
        offsets = [f.offset for f in self.mm_features]
        if offsets != sorted(offsets):
            raise KVCacheMisuseError(
                f"request {self.request_id!r}: mm_features must be sorted by offset, got {offsets}"
            )
        self.update_block_hashes()

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens known so far."""
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Append sampled tokens and hash any block they complete."""
        if isinstance(token_ids, int):  # one sampled token: every decode step
            if token_ids < 0:
                raise KVCacheMisuseError(f"request {self.request_id!r}: token ids must be >= 0")
            self.all_token_ids.append(token_ids)
        else:
            new = list(token_ids)
            if new and min(new) < 0:
                raise KVCacheMisuseError(f"request {self.request_id!r}: token ids must be >= 0")
            self.all_token_ids.extend(new)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Extend ``block_hashes`` with the hashes of newly full blocks."""
        if self.block_hasher is not None:
            self.block_hashes.extend(self.block_hasher(self))
