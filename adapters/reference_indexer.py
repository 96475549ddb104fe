"""kvcheck's reference indexer behind the indexer protocol (``--kv-indexer=reference``).

``kvcheck.reference_impl.kv_indexer.KVIndexer`` (the exact index, docs/indexers.md) fed with
the wire bytes decoded by ``kvcheck.events`` in the configured release and hash form. A payload
no consumer could read is refused with ``kvcheck.events.WireFormatError`` naming the fault,
the index left as it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvcheck import __version__
from kvcheck.conformance.indexer_protocol import IndexerConfig, MatchContext
from kvcheck.conformance.protocol import HASH_ALGOS, ImplInfo
from kvcheck.events.codec import Release, decode_batch
from kvcheck.reference_impl.kv_indexer import KVIndexer

__all__ = ["IMPL_INFO", "ReferenceIndexer", "make_indexer"]

IMPL_INFO = ImplInfo(
    name="reference-indexer",
    version=__version__,
    capabilities=frozenset({"indexer", "int_hashes", "bytes_hashes", "replay", "lora",
                            "cache_salt", "multimodal", "kv_cache_groups",
                            "lookahead_hashes"}),
    profile="vllm-0.33",
    hash_algos=HASH_ALGOS,
)


class ReferenceIndexer:
    """The wire side of ``KVIndexer``: one per ``IndexerConfig``. ``index_type`` is the index
    class (a subclass states one bug in tests/indexers' mutants)."""

    index_type: type[KVIndexer] = KVIndexer

    def __init__(self, config: IndexerConfig) -> None:
        self.config = config
        self._release: Release = "vllm-0.10" if config.release == "vllm-0.10" else "vllm-0.33"
        self._int = config.hash_form == "int"
        self.index = self.index_type(config.block_size, hash_algo=config.hash_algo,
                               profile=self._release, pythonhashseed=config.pythonhashseed,
                               int_hashes=self._int, match_group=config.match_group,
                               hash_block_size=config.hash_block_size,
                               num_hash_lookahead_tokens=config.num_hash_lookahead_tokens)

    def apply_batch(self, worker_id: str, seq: int, payload: bytes,
                    replay: bool = False) -> None:
        batch = decode_batch(payload, release=self._release, int_hashes=self._int)
        kinds = {group: kind for group, (kind, _) in batch.group_metadata().items()}
        self.index.apply(worker_id, seq, batch.events, replay=replay, group_kinds=kinds)

    def match(self, token_ids: Sequence[int], context: MatchContext) -> Mapping[str, int]:
        return self.index.match(token_ids, lora=context.lora, cache_salt=context.cache_salt,
                                mm_features=context.mm_features)

    def remove_worker(self, worker_id: str) -> None:
        self.index.remove_worker(worker_id)


def make_indexer(config: IndexerConfig) -> ReferenceIndexer:
    """A fresh, empty reference index for workers configured as ``config``."""
    return ReferenceIndexer(config)
