"""``HybridDriver``: the ``Driver`` for a multi-group spec (``spec.kv_cache_groups``).

The ops and the repro snippet are the single-group driver's (``kvcheck.conformance.driver``);
what changes is the shape of the answers (one list of block ids per group, id 0 the null
block) and what the laws judge against: one ``WrittenBlocks`` per group at that group's block
size, and ``last_start[rid]``, the tokens the request had computed (its new hits included)
when its last ``allocate_slots`` was called, which fixes the positions its windows may have
skipped (``kvcheck.conformance.hybrid_laws``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from kvcheck.conformance.driver import Driver, StepResult
from kvcheck.conformance.hybrid_laws import NULL_BLOCK, check_hybrid_hits
from kvcheck.conformance.laws import WrittenBlocks
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.ops import AddOp
from kvcheck.conformance.protocol import KVCacheSpec, RequestView, SupportsKVCacheGroups

__all__ = ["HybridDriver"]


class HybridDriver(Driver):
    """One implementation instance driven over a multi-group spec. ``tables()`` maps each
    running request to its per-group block tables; a ``StepResult``'s ``hits`` is
    ``(per-group lists, tokens)`` and its ``new`` the per-group new blocks (or None)."""

    def __init__(self, impl: ImplHandle, spec: KVCacheSpec) -> None:
        super().__init__(impl, spec)
        self.group_written = [WrittenBlocks(spec.group_block_size(g))
                              for g in range(len(spec.groups))]
        self.last_start: dict[str, int] = {}

    def _add(self, op: AddOp) -> StepResult:
        out = super()._add(op)
        for written in self.group_written:
            written.forget(op["rid"])
        self.last_start.pop(op["rid"], None)
        return out

    # ------------------------------------------------------------------ group hooks
    def written_records(self) -> list[WrittenBlocks]:
        return list(self.group_written)

    def _block_ids(self, answer: Sequence[Any]) -> list[list[int]]:
        """One list of block ids per group (the guard checked the form)."""
        return [list(ids) for ids in answer]

    def _check_hits(self, view: RequestView, hits: list[list[int]], num_hit: int) -> list[str]:
        return check_hybrid_hits(self.group_written, self.spec, view, hits, num_hit)

    def _answered(self, rid: str, new_ids: list[list[int]] | None, start: int,
                  was_running: bool) -> None:
        """Keeps ``last_start`` (a refused running request's windows may still have moved),
        and judges all-or-nothing for a refused new request."""
        if was_running or new_ids is not None:
            self.last_start[rid] = start
        if new_ids is None and not was_running:
            left = [list(t) for t in self._groups.get_block_ids(rid)]
            if any(left):
                self._law_problems.append(
                    f"all-or-nothing: allocate_slots({rid!r}) returned None for a request "
                    f"holding no blocks, yet it now holds {left}")

    def _write(self, view: RequestView, new_ids: list[list[int]], start: int,
               num_new: int) -> None:
        rid = view.request_id
        tables = [list(t) for t in self._groups.get_block_ids(rid)] if num_new else []
        for g, written in enumerate(self.group_written):
            written.clear(new_ids[g] if g < len(new_ids) else [])
            if num_new and g < len(tables):
                # Null positions hold nothing: keep them out of the record.
                table = [b if b != NULL_BLOCK else -1 - i for i, b in enumerate(tables[g])]
                written.write(view, table, start, start + num_new)
                self.write_log.wrote(rid, tables[g], start, start + num_new, written.block_size,
                                     group=g, null=NULL_BLOCK)

    # ------------------------------------------------------------------ observation
    @property
    def _groups(self) -> SupportsKVCacheGroups:
        """The manager in its per-group form (the guard checked the forms)."""
        return cast("SupportsKVCacheGroups", self.manager)

    def group_tables(self) -> dict[str, list[list[int]]]:
        """``{rid: per-group tables}`` of the running requests."""
        return {rid: [list(t) for t in self._groups.get_block_ids(rid)]
                for rid in sorted(self.running)}

    def tables(self) -> dict[str, list[int]]:
        """``group_tables()``, typed as the base's (observations compare them as values)."""
        return cast("dict[str, list[int]]", self.group_tables())
