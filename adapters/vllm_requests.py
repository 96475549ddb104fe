"""vLLM ``Request`` objects for kvcheck's request views, and the spec's hashing, for
``kvcheck.adapters.vllm``.

A request is built as vLLM's unit tests build it: prompt only, ``SamplingParams`` with a large
``max_tokens``, hashed by ``get_request_block_hasher(hash_block_size, hash_fn)``; LoRA,
multimodal features and ``cache_salt`` go in where this release's ``Request`` takes them
(``HAS_EXTRAS``). vLLM's ``NONE_HASH`` is a module global derived from ``PYTHONHASHSEED`` by
``init_none_hash``: each ``Hashing`` computes its own (the spec's seed put into ``os.environ``
for the call, then restored) and re-installs it before every hashing call, so managers with
different algorithms or seeds coexist in one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvcheck.adapters.reference import SnapshotSync
from kvcheck.adapters.vllm_features import pythonhashseed
from kvcheck.adapters.vllm_runtime import (
    VERSION,
    LoRARequest,
    MultiModalFeatureSpec,
    PlaceholderRange,
    Request,
    SamplingParams,
    accepting,
    get_hash_fn_by_name,
    kcu,
    params,
)
from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.conformance.view_sync import EngineRequest, RequestViewSync

__all__ = ["HAS_EXTRAS", "Hashing", "VllmRequest", "make_request", "request_sync"]

_REQUEST_PARAMS = params(Request.__init__)
_SAMPLING_PARAMS = params(SamplingParams)
_HAS_MM = MultiModalFeatureSpec is not None and "mm_features" in _REQUEST_PARAMS
#: This release's ``Request`` takes LoRA, multimodal and ``cache_salt`` inputs as the adapter
#: builds them (the ``extra_keys`` capability).
HAS_EXTRAS = {"lora_request", "cache_salt"} <= _REQUEST_PARAMS and _HAS_MM
_MAX_TOKENS = 1 << 20


class VllmRequest(EngineRequest, Protocol):
    """What the adapter reads and writes of vLLM's ``Request``."""

    @property
    def request_id(self) -> str: ...

    @property
    def block_hashes(self) -> Sequence[bytes]: ...

    #: 0.33: set after a lookup, as vLLM's scheduler does (the sliding-window cache mask).
    shared_prefix_boundary: int
    #: vLLM's ``RequestStatus``, RUNNING once an allocation succeeded (0.33's watermark reads
    #: it).
    #: Any: vLLM's enum, imported at run time (vLLM is not a dependency of the type check).
    status: Any
    #: 0.33: the tokens of steps whose output is not processed yet (asynchronous
    #: scheduling), set for one call (``allocate_slots``, ``finalize_partial_tail_offloads``).
    num_in_flight_tokens: int

    def append_output_token_ids(self, token_ids: int | list[int], /) -> None: ...


def _sampling_params(skip_reading_prefix_cache: bool) -> object:
    kwargs: dict[str, object] = {"max_tokens": _MAX_TOKENS}
    if skip_reading_prefix_cache:
        if "skip_reading_prefix_cache" in _SAMPLING_PARAMS:
            kwargs["skip_reading_prefix_cache"] = True
        else:  # 0.10.2: prompt logprobs are what make a request skip the cache lookup
            kwargs["prompt_logprobs"] = 1
    return SamplingParams(**kwargs)


def _mm_feature(identifier: str, offset: int, length: int) -> object:
    return MultiModalFeatureSpec(**accepting(
        MultiModalFeatureSpec, data=None, modality="image", identifier=identifier,
        mm_position=PlaceholderRange(offset=offset, length=length), mm_hash=identifier))


def make_request(view: RequestView, block_hasher: object) -> VllmRequest:
    """A vLLM ``Request`` for ``view`` (prompt only; outputs are appended by the caller)."""
    extras = bool(view.lora or view.mm_features or view.cache_salt)
    if extras and not HAS_EXTRAS:
        raise NotImplementedError(
            f"vLLM {VERSION}'s Request cannot take LoRA / multimodal / cache_salt inputs the "
            "way this adapter knows (the 'extra_keys' capability is not declared)")
    kwargs: dict[str, object] = {
        "request_id": view.request_id,
        "prompt_token_ids": list(view.prompt_token_ids),
        "sampling_params": _sampling_params(view.skip_reading_prefix_cache),
        "pooling_params": None,
        "eos_token_id": None,
        "block_hasher": block_hasher,
    }
    if view.lora is not None:
        name, int_id, path = view.lora
        kwargs["lora_request"] = LoRARequest(lora_name=name, lora_int_id=int_id,
                                             lora_path=path)
    if view.mm_features:
        kwargs["mm_features"] = [_mm_feature(*f) for f in view.mm_features]
    if view.cache_salt is not None:
        kwargs["cache_salt"] = view.cache_salt
    request: VllmRequest = Request(**{k: v for k, v in kwargs.items() if k in _REQUEST_PARAMS})
    return request


class Hashing:
    """The spec's hash function, block hasher (at ``hash_block_size``, default
    ``spec.block_size``, with the spec's hash lookahead) and NONE_HASH, re-installed before
    each use."""

    def __init__(self, spec: KVCacheSpec, hash_block_size: int | None = None) -> None:
        self.fn = get_hash_fn_by_name(spec.hash_algo)
        with pythonhashseed(spec.pythonhashseed):
            kcu.init_none_hash(self.fn)
        self.none_hash = kcu.NONE_HASH
        # Hash lookahead only when set: 0.10.2's hasher takes no third argument.
        self.block_hasher = kcu.get_request_block_hasher(
            spec.block_size if hash_block_size is None else hash_block_size, self.fn,
            *((spec.num_hash_lookahead_tokens,) if spec.num_hash_lookahead_tokens else ()))

    def install(self) -> None:
        """Make this spec's root the one vLLM's (module-global) hasher chains from."""
        kcu.NONE_HASH = self.none_hash


def request_sync(hashing: Hashing) -> RequestViewSync[VllmRequest]:
    """One vLLM ``Request`` per request id, kept in step with the immutable views; the
    spec's NONE_HASH is reinstalled before vLLM hashes new blocks."""
    return SnapshotSync(lambda view: make_request(view, hashing.block_hasher),
                        before_hashing=hashing.install)
