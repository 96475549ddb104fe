"""What every indexer mutant shares: the reference index (``kvcheck.adapters.reference_indexer``)
with one ``KVIndexer`` method overridden, served under the mutant's own name.

A mutant module defines its buggy ``KVIndexer`` subclass and ends with
``IMPL_INFO, make_indexer = serve("name", BuggyIndex)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kvcheck.adapters.reference_indexer import IMPL_INFO as REFERENCE_INFO
from kvcheck.adapters.reference_indexer import ReferenceIndexer
from kvcheck.conformance.indexer_protocol import IndexerConfig
from kvcheck.conformance.protocol import ImplInfo
from kvcheck.reference_impl.kv_indexer import KVIndexer


def serve(name: str, index_type: type[KVIndexer],
          wrapper: type[ReferenceIndexer] = ReferenceIndexer,
          ) -> tuple[ImplInfo, Callable[[IndexerConfig], ReferenceIndexer]]:
    """``(IMPL_INFO, make_indexer)`` of the reference index with ``index_type`` inside."""
    mutant = type(f"{index_type.__name__}Indexer", (wrapper,), {"index_type": index_type})

    def make_indexer(config: IndexerConfig) -> ReferenceIndexer:
        return mutant(config)

    return dataclasses.replace(REFERENCE_INFO, name=name), make_indexer
