"""``KVIndexer``: the prefix index a KV-aware router keeps per worker, rebuilt from KV events.

A router never sees a worker's block tables. It receives each worker's event batches
(``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, numbered by the publisher's sequence)
and answers, for a new request, how many of its leading blocks each worker holds. This is that
index, exact wherever the stream allows it (docs/indexers.md, "The truth"):

* **keys**: a worker holds a block when its stream stored ``(group, hash)`` more often than it
  removed it. vLLM stores a hash once per physical copy and removes it once per copy evicted
  (a ``BlockRemoved`` of one copy while another is resident, vLLM PR #55092), so the index
  counts copies; a removal of a hash it does not hold is ignored (a partial block it never
  indexed, dynamo PR #866), never a negative count (AIBrix PR #2723);
* **groups**: keys carry the event's ``group_idx``: a sliding-window group removing a hash does
  not remove the full-attention group's copy of the same hash (vLLM mixes no group into a hash:
  AMD Infera #98). Matches count in one group (``match_group``, a full-attention group);
* **full blocks only**: a store's hash counts only where its ``token_ids`` fill that block (a
  partial tail block is never a prefix block); stores of another medium than the GPU are not
  the worker's GPU cache; a store in the match group whose ``block_size`` is not the index's
  is refused (``IndexerInputError``): its hashes are of other blocks (dynamo PR #1233);
* **partial-block keys** (vLLM 0.33, a hash block smaller than the match group's block): the
  group keys each block by the hash at its last hash-block boundary, and the block holding a
  prompt's last boundary gets a second key, a ``BlockStored`` of one hash with the hash
  block's ``block_size`` (``BlockPool.cache_partial_block``). That store is accepted, not
  refused; its key is a key of the group, at a boundary inside a block, so no request's
  block key is ever it: it is never counted as a block. Its ``BlockRemoved`` (on eviction,
  after the block's full key; on promotion, before the full key's store) removes that key
  alone;
* **kinds**: a store names its group's kind (0.33's ``kv_cache_spec_kind``). A Mamba or
  sliding-window group's hashes are the attention group's (vLLM mixes no group into a hash)
  but say only that a state or a window is cached: they stay in their own group (AMD Infera
  #98), and a match group whose stores name such a kind is a misconfigured index, refused;
* **order**: a worker's batches apply in sequence order from 0. A batch past a gap waits until
  the gap is filled by a replayed batch (``replay=True``), so an old ``BlockStored`` never lands
  after a newer ``BlockRemoved`` (Mooncake PR #4159); a batch already applied (a duplicate
  delivery, or a replay overlapping the live stream) is ignored (llm-d-kv-cache #691);
* **restarts**: a live batch whose sequence is below the last live one is a new publisher (a
  restarted engine, an empty cache): the worker's index is cleared (llm-d-router #1737);
  ``AllBlocksCleared`` clears it too (AIBrix #2287), and only the sender's keys ever change
  (AIBrix PR #2723).

Requests are hashed as the workers hash them (``block_size``, ``hash_algo``, the NONE_HASH of
``pythonhashseed``, the profile's extra-key format, vLLM 0.33's hash lookahead; in blocks of
the hash block, every ``block_size // hash_block_size``-th hash keying a block), so LoRA, salt
and multimodal inputs select other keys (dynamo PR #6517), and under hash lookahead ``L`` a
block's key covers the ``L`` tokens after it (a request's last blocks without them have no
key). With ``int_hashes`` the stream carries vLLM's default
64-bit form of each hash (its last 8 bytes, as ``kvcheck.events`` decodes it): keys are
compared in that form.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvcheck.reference_impl.errors import IndexerInputError, KVCacheMisuseError
from kvcheck.reference_impl.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvcheck.reference_impl.kv_cache_manager import make_block_hasher
from kvcheck.reference_impl.profiles import get_profile
from kvcheck.reference_impl.request import LoRARequest, MultiModalFeature, Request

__all__ = ["IndexerInputError", "KVIndexer", "WorkerIndex"]

#: The medium of the GPU prefix cache in events (None: a release that does not say).
_GPU_MEDIA = frozenset({"GPU", None})
#: Bytes of vLLM's default integer event hash (the digest's last 8 bytes).
_INT_HASH_BYTES = 8
#: ``kv_cache_spec_kind`` values of groups that cache every block of a request (their stores
#: are dense, so their keys are prefix blocks): the kinds a match group may have (llm-d-router
#: PR #2363 admits these only).
_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


@dataclass
class WorkerIndex:
    """One worker's keys and where its stream stands.

    Attributes:
        copies: ``(group, hash) -> copies`` stored and not removed (always > 0).
        applied: the last sequence number applied (-1: none yet).
        last_live: the last live (not replayed) sequence number seen, or None.
        pending: batches past a gap, by sequence number, waiting for it to fill.
        kinds: ``group -> kv_cache_spec_kind`` as the worker's stores named them (0.33).
    """

    copies: Counter[tuple[int, bytes]] = field(default_factory=Counter)
    applied: int = -1
    last_live: int | None = None
    pending: dict[int, Sequence[KVCacheEvent]] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)

    def clear(self) -> None:
        """Forget every key (``AllBlocksCleared``, or a restart)."""
        self.copies.clear()


class KVIndexer:
    """The router's index over every worker that sent a batch and was not removed.

    Args:
        block_size: tokens per block of the workers (of the match group).
        hash_algo: the workers' ``hash_algo``; pythonhashseed: their NONE_HASH seed.
        profile: the workers' release (``vllm-0.33`` / ``vllm-0.10``): its hash and
            extra-key format.
        int_hashes: the stream carries 64-bit hashes (the last 8 bytes of each digest).
        match_group: the KV-cache group whose keys ``match`` counts (a full-attention one).
        hash_block_size: the workers' hash block when smaller than ``block_size`` (vLLM
            0.33: the gcd of the groups' block sizes); None: ``block_size``.
        num_hash_lookahead_tokens: the workers' hash lookahead ``L`` (vLLM 0.33, EAGLE and
            MTP drafters with prefix caching): requests are hashed as they hash them, each
            block's key covering the ``L`` tokens after it (a block without them has none).
    """

    def __init__(self, block_size: int, *, hash_algo: str = "sha256",
                 profile: str = "vllm-0.33", pythonhashseed: str | None = "0",
                 int_hashes: bool = False, match_group: int = 0,
                 hash_block_size: int | None = None, num_hash_lookahead_tokens: int = 0) -> None:
        if block_size < 1:
            raise KVCacheMisuseError(f"block_size must be >= 1, got {block_size!r}")
        hash_block = block_size if hash_block_size is None else hash_block_size
        if hash_block < 1 or block_size % hash_block:
            raise KVCacheMisuseError(
                f"hash_block_size must be a positive divisor of block_size ({block_size}), "
                f"got {hash_block_size!r}")
        self.block_size = block_size
        self.hash_block_size = hash_block
        self.int_hashes = int_hashes
        self.match_group = match_group
        self._scale = block_size // hash_block
        self._hasher = make_block_hasher(hash_block, hash_algo, get_profile(profile),
                                         pythonhashseed,
                                         num_lookahead_tokens=num_hash_lookahead_tokens)
        self.workers: dict[str, WorkerIndex] = {}

    # ------------------------------------------------------------------ the stream
    def apply(self, worker_id: str, seq: int, events: Sequence[KVCacheEvent], *,
              replay: bool = False, group_kinds: Mapping[int, str] | None = None) -> None:
        """One batch of ``worker_id``'s stream: live (``replay=False``, as the subscriber
        receives it) or replayed (asked for from the publisher's replay socket after a gap).
        ``group_kinds``: the ``kv_cache_spec_kind`` the batch's stores name per group (0.33;
        ``DecodedBatch.group_metadata``).

        Raises:
            IndexerInputError: a store in the match group with another block size than the
                index's that is not a partial-block key, or naming a kind whose keys are
                not prefix blocks (the worker's index is left as it was).
        """
        self._check_kinds(worker_id, seq, group_kinds or {})
        worker = self.workers.get(worker_id)
        if worker is None:
            worker = self.workers[worker_id] = WorkerIndex()
        if group_kinds:
            worker.kinds.update(group_kinds)
        if not replay:
            if worker.last_live is not None and seq < worker.last_live:
                # A new publisher: its sequence starts again, its engine's cache is empty.
                worker.clear()
                worker.applied, worker.pending = -1, {}
            worker.last_live = seq
        if seq <= worker.applied or seq in worker.pending:
            return  # applied already: a duplicate, or a replay overlapping the live stream
        self._check_block_size(worker_id, seq, events)
        worker.pending[seq] = events
        while worker.applied + 1 in worker.pending:
            worker.applied += 1
            self._apply_events(worker, worker.pending.pop(worker.applied))

    def _check_kinds(self, worker_id: str, seq: int, kinds: Mapping[int, str]) -> None:
        kind = kinds.get(self.match_group)
        if kind is not None and kind not in _ATTENTION_KINDS:
            raise IndexerInputError(
                f"worker {worker_id!r}, batch {seq}: the match group {self.match_group} is a "
                f"{kind!r} group: its keys say a state or a window is cached, not that the "
                "request's prefix blocks are. Fix: configure match_group to a full-attention "
                f"group (one of {sorted(_ATTENTION_KINDS)})")

    def _is_partial_key(self, event: BlockStored) -> bool:
        """A partial-block key of vLLM 0.33 (``BlockPool.cache_partial_block``): one hash,
        the hash block's ``block_size`` and tokens, in a group of larger blocks."""
        return (self.hash_block_size < self.block_size
                and event.block_size == self.hash_block_size
                and len(event.block_hashes) == 1
                and len(event.token_ids) == self.hash_block_size)

    def _check_block_size(self, worker_id: str, seq: int,
                          events: Iterable[KVCacheEvent]) -> None:
        for event in events:
            if (isinstance(event, BlockStored) and event.group_idx == self.match_group
                    and event.block_size != self.block_size
                    and not self._is_partial_key(event)):
                raise IndexerInputError(
                    f"worker {worker_id!r}, batch {seq}: a BlockStored of group "
                    f"{event.group_idx} has block_size {event.block_size}, but this index "
                    f"keys requests in blocks of {self.block_size} (hash block "
                    f"{self.hash_block_size}, whose one-hash stores are partial-block keys): "
                    "its hashes are of other blocks. Fix: configure the index with the "
                    "workers' block size and hash block size")

    def _apply_events(self, worker: WorkerIndex, events: Iterable[KVCacheEvent]) -> None:
        copies = worker.copies
        for event in events:
            if isinstance(event, BlockStored):
                if event.medium not in _GPU_MEDIA:
                    continue
                # A partial-block key is one full hash block: a key of the group like any
                # other (the worker's map holds it), at a boundary inside a block, so no
                # request block's key (request_hashes) is ever it.
                full = len(event.token_ids) // event.block_size if event.block_size > 0 else 0
                for block_hash in event.block_hashes[:full]:
                    copies[event.group_idx, block_hash] += 1
            elif isinstance(event, BlockRemoved):
                if event.medium not in _GPU_MEDIA:
                    continue
                for block_hash in event.block_hashes:
                    key = (event.group_idx, block_hash)
                    left = copies.get(key, 0) - 1
                    if left > 0:
                        copies[key] = left
                    else:
                        copies.pop(key, None)
            elif isinstance(event, AllBlocksCleared):
                worker.clear()

    def remove_worker(self, worker_id: str) -> None:
        """Forget ``worker_id`` (it left the pool); unknown ids are ignored."""
        self.workers.pop(worker_id, None)

    # ------------------------------------------------------------------ the answers
    def request_hashes(self, token_ids: Sequence[int], *,
                       lora: tuple[str, int, str] | None = None, cache_salt: str | None = None,
                       mm_features: Sequence[tuple[str, int, int]] = ()) -> list[bytes]:
        """The keys of the request's full blocks as the workers compute them: hashes in
        blocks of the hash block, every ``block_size // hash_block_size``-th (vLLM 0.33's
        ``BlockHashListWithBlockSize``), in the stream's form (the last 8 bytes with
        ``int_hashes``)."""
        request = Request(
            "probe", list(token_ids), block_hasher=self._hasher,
            lora_request=None if lora is None else LoRARequest(*lora),
            mm_features=[MultiModalFeature(*item) for item in mm_features],
            cache_salt=cache_salt)
        hashes = list(request.block_hashes)[self._scale - 1::self._scale]
        if self.int_hashes:
            return [bytes(h)[-_INT_HASH_BYTES:] for h in hashes]
        return [bytes(h) for h in hashes]

    def match(self, token_ids: Sequence[int], *, lora: tuple[str, int, str] | None = None,
              cache_salt: str | None = None,
              mm_features: Sequence[tuple[str, int, int]] = ()) -> dict[str, int]:
        """Per worker, how many leading full blocks of the request its index holds (in the
        match group); workers holding none are left out."""
        hashes = self.request_hashes(token_ids, lora=lora, cache_salt=cache_salt,
                                     mm_features=mm_features)
        group = self.match_group
        out: dict[str, int] = {}
        for worker_id, worker in self.workers.items():
            copies = worker.copies
            count = 0
            for block_hash in hashes:
                if (group, block_hash) not in copies:
                    break
                count += 1
            if count:
                out[worker_id] = count
        return out
