"""The indexer protocol: what a KV-aware router's prefix index implements to be checked by the
``indexer`` area (``pytest --kv-indexer=MODULE``; docs/indexers.md).

An indexer module defines, beside an ``IMPL_INFO`` (``kvcheck.conformance.protocol.ImplInfo``)
declaring capability ``indexer``:

* ``make_indexer(config: IndexerConfig) -> IndexerAdapter``: a fresh, empty index for workers
  configured as ``config`` says (called once per test case, under ``--kv-timeout``).

The index is given each worker's event batches in the order a router receives them, every
batch with its publisher sequence number, and answers prefix matches. Primitive types only:
no kvcheck base class to inherit.

Capabilities an indexer declares (``IMPL_INFO.capabilities``; an undeclared one skips its
tests, saying so):

* ``indexer``: this protocol (required);
* ``int_hashes`` / ``bytes_hashes``: the hash forms it reads (vLLM's default 64-bit integers,
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, or the digests); at least one;
* ``decoded_events``: batches arrive decoded, ``apply_events`` instead of ``apply_batch``;
* ``replay``: gaps in a live stream are filled later by replayed batches, and batches may be
  delivered twice (a replay overlapping the live stream, a duplicated delivery);
* ``lora``, ``cache_salt``, ``multimodal``: match contexts with that input;
* ``kv_cache_groups``: workers with several KV-cache groups (full attention beside sliding
  windows or a Mamba group in "align" mode, possibly of smaller blocks than the match
  group's: partial-block keys), whose stores and removals name their group;
* ``lookahead_hashes``: workers hashing with vLLM 0.33's hash lookahead
  (``IndexerConfig.num_hash_lookahead_tokens``; EAGLE and MTP drafters with prefix caching):
  a request's block is keyed with the ``L`` tokens after it too.

``ImplInfo.hash_algos`` lists the hash algorithms the index can hash requests with (``()``:
it keys blocks by content, not by the engine's hashes); ``ImplInfo.block_sizes`` the block
sizes it supports; ``ImplInfo.profile`` the wire release it reads by default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal, Protocol, runtime_checkable

from kvcheck.errors import KVCheckInputError

__all__ = ["INDEXER_CAPABILITIES", "HashForm", "IndexerAdapter", "IndexerConfig",
           "MatchContext", "SupportsDecodedEvents", "SupportsWireBatches", "config_to_dict"]

HashForm = Literal["int", "bytes"]

#: Indexer capability -> what declaring it promises (merged into ``protocol.CAPABILITIES``).
INDEXER_CAPABILITIES: dict[str, str] = {
    "indexer": "make_indexer(config): a KV-aware router's prefix index (docs/indexers.md)",
    "int_hashes": "indexer: reads vLLM's default 64-bit integer block hashes",
    "bytes_hashes": "indexer: reads block hashes as digests "
                    "(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)",
    "decoded_events": "indexer: takes decoded batches, apply_events(...), not wire bytes",
    "replay": "indexer: fills a sequence gap from replayed batches and ignores batches "
              "delivered twice",
    "lookahead_hashes": "indexer: hashes requests with the workers' hash lookahead "
                        "(IndexerConfig.num_hash_lookahead_tokens, vLLM 0.33)",
}


@dataclass(frozen=True, slots=True)
class IndexerConfig:
    """How the workers an index serves are configured (what a router is told, e.g. llm-d's
    ``blockSize`` and ``hashSeed``).

    Attributes:
        block_size: tokens per block of every worker (of the match group).
        release: the workers' vLLM release, which fixes the wire format (``vllm-0.33``:
            tagged maps; ``vllm-0.10``: tagged arrays) and how requests are hashed.
        hash_form: ``"int"`` (vLLM's default: each hash's last 8 bytes as an unsigned
            64-bit integer) or ``"bytes"`` (the digest).
        hash_algo: the workers' ``hash_algo`` (``sha256``, ``sha256_cbor``, ``xxhash``,
            ``xxhash_cbor``); pythonhashseed: the PYTHONHASHSEED their NONE_HASH derives from.
        match_group: the KV-cache group matches count blocks in (a full-attention group;
            0 for single-group workers).
        hash_block_size: the workers' hash block (vLLM 0.33: the gcd of the groups' block
            sizes), when it is smaller than ``block_size``; None: ``block_size``. Requests
            are hashed in blocks of it, a block of ``block_size`` is keyed by the hash at its
            last hash-block boundary, and a ``BlockStored`` of one hash with this
            ``block_size`` in the match group is a partial-block key, not a block
            (docs/indexers.md, "partial keys").
        num_hash_lookahead_tokens: the workers' hash lookahead ``L`` (vLLM 0.33's
            ``VllmConfig.num_hash_lookahead_tokens``: 1 for an EAGLE drafter, the speculative
            token count for multi-module MTP, with prefix caching; 0 otherwise): a block's
            hash also covers the ``L`` tokens after it, so a request's block has a key only
            when those tokens exist, and two requests whose tokens differ only there share no
            key for it. Capability ``lookahead_hashes``; 0 under ``vllm-0.10``.
    """

    block_size: int
    release: str = "vllm-0.33"
    hash_form: HashForm = "int"
    hash_algo: str = "sha256"
    pythonhashseed: str | None = "0"
    match_group: int = 0
    hash_block_size: int | None = None
    num_hash_lookahead_tokens: int = 0

    def __post_init__(self) -> None:
        lookahead = self.num_hash_lookahead_tokens
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
            raise KVCheckInputError(
                f"IndexerConfig.num_hash_lookahead_tokens must be an int >= 0, got "
                f"{lookahead!r}")
        if lookahead and self.release == "vllm-0.10":
            raise KVCheckInputError(
                f"IndexerConfig.num_hash_lookahead_tokens={lookahead} with release "
                "'vllm-0.10': vLLM 0.10.2 hashes without lookahead; use 0 or release "
                "'vllm-0.33'")
        size = self.hash_block_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                                 or size < 1 or self.block_size % size):
            raise KVCheckInputError(
                f"IndexerConfig.hash_block_size must be a positive divisor of block_size "
                f"({self.block_size}), got {size!r}: vLLM hashes in blocks of the gcd of the "
                "groups' block sizes; leave it None when every group has blocks of block_size")


def config_to_dict(config: IndexerConfig) -> dict[str, object]:
    """``config``'s fields as a dict (what the wire and a trace carry), the fields a later
    release added left out at their default (``num_hash_lookahead_tokens`` when 0), so an
    index written before them reads the same config as before."""
    out = asdict(config)
    if not config.num_hash_lookahead_tokens:
        del out["num_hash_lookahead_tokens"]
    return out


@dataclass(frozen=True, slots=True)
class MatchContext:
    """What besides the tokens selects a request's blocks (the inputs of vLLM's extra keys).

    Attributes:
        lora: ``(lora_name, lora_int_id, lora_path)`` or None (the base model).
        cache_salt: the request's ``cache_salt`` or None.
        mm_features: ``(identifier, offset, length)`` per multimodal item, sorted by offset.
    """

    lora: tuple[str, int, str] | None = None
    cache_salt: str | None = None
    mm_features: tuple[tuple[str, int, int], ...] = ()


@runtime_checkable
class IndexerAdapter(Protocol):
    """Capability ``indexer``: the methods every index has."""

    def match(self, token_ids: Sequence[int], context: MatchContext) -> Mapping[str, int]:
        """Per worker, how many leading full blocks of ``token_ids`` (with ``context``) the
        index says it holds, in ``config.match_group``: ``{worker_id: blocks}``, each in
        ``[0, len(token_ids) // block_size]``. A worker left out holds none; a removed
        worker, or one that never sent a batch, is never named."""
        ...

    def remove_worker(self, worker_id: str) -> None:
        """``worker_id`` left the pool: forget it (no batch of it follows)."""
        ...


@runtime_checkable
class SupportsWireBatches(Protocol):
    """Without ``decoded_events``: batches as the bytes on the wire."""

    def apply_batch(self, worker_id: str, seq: int, payload: bytes,
                    replay: bool = False) -> None:
        """One batch of ``worker_id``: ``payload`` is the third ZMQ frame of vLLM's publisher
        (msgpack of the release's ``KVEventBatch``), ``seq`` the second frame's sequence
        number (from 0 for each publisher process). ``replay`` is True for a batch the
        router asked the publisher's replay socket for after a gap (capability ``replay``).
        May raise for a batch it cannot apply without guessing (a store of another block
        size than ``config.block_size``), leaving its index as it was."""
        ...


@runtime_checkable
class SupportsDecodedEvents(Protocol):
    """Capability ``decoded_events``: batches decoded, events as dicts."""

    def apply_events(self, worker_id: str, seq: int, batch: Mapping[str, object],
                     replay: bool = False) -> None:
        """As ``apply_batch``, with ``batch`` = ``{"ts": float, "events": [dict, ...],
        "data_parallel_rank": int | None}``, each event a dict with ``"type"`` and vLLM's
        field names (hashes as ``int`` or ``bytes`` per ``config.hash_form``). Read-only: the
        index must not change what it is given."""
        ...
