"""``Driven``: what the laws read from a driven implementation.

The laws (``kvcheck.conformance.laws``, ``cache_refs``) judge the state of a
``kvcheck.conformance.driver.Driver``; they take it through this Protocol, so that no module
below the driver imports it (conformance/ has no import cycle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.conformance.protocol import KVCacheSpec, ManagerWithCapabilities, RequestView
    from kvcheck.conformance.rebinding import Rebindings
    from kvcheck.conformance.shared_writes import WriteLog
    from kvcheck.conformance.written import WrittenBlocks

__all__ = ["Driven"]


class Driven(Protocol):
    """A driven implementation as the laws see it (``Driver`` is one).

    ``initial_free``: ``num_free_blocks()`` of the fresh pool; ``written``: one shadow record
    per KV-cache group; ``last_start[rid]``: the tokens ``rid`` had computed (its new hits
    included) when its last ``allocate_slots`` was called; ``tables()``: the running
    requests' per-group block tables."""

    impl: ImplHandle
    spec: KVCacheSpec
    capabilities: frozenset[str]
    reserved: frozenset[int]
    ordinary_block_ids: tuple[int, ...]
    initial_free: int
    views: dict[str, RequestView]
    written: list[WrittenBlocks]
    last_start: dict[str, int]
    #: ``rid`` -> its encoder tokens (an ``add`` op's ``encoder``; 0 or absent without).
    encoder_tokens: dict[str, int]
    write_log: WriteLog
    rebindings: Rebindings | None
    #: Fine-grained hits: copies may be pending (``kvcheck.conformance.fine_grained``).
    copies_pending: bool

    @property
    def manager(self) -> ManagerWithCapabilities:
        """The (guarded) manager under test."""
        ...

    def take_law_problems(self) -> list[str]: ...

    def tables(self) -> dict[str, list[list[int]]]: ...
