"""``HybridDriver``: the ``Driver`` for a multi-group spec (``spec.kv_cache_groups``).

The ops and the repro snippet are the single-group driver's (``kvcheck.conformance.driver``);
what changes is the shape of the answers (one list of block ids per group, id 0 the null
block) and what the laws judge against: one ``WrittenBlocks`` per group at that group's block
size, and ``last_start[rid]``, the tokens the request had computed (its new hits included)
when its last ``allocate_slots`` was called, which fixes the positions its windows may have
skipped (``kvcheck.conformance.hybrid_laws``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from kvcheck.conformance.driver import Driver, StepResult, output_token
from kvcheck.conformance.hybrid_laws import NULL_BLOCK, check_hybrid_hits
from kvcheck.conformance.laws import WrittenBlocks
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.ops import AddOp
from kvcheck.conformance.protocol import KVCacheSpec, SupportsKVCacheGroups

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

    def _schedule(self, rid: str, num_tokens: int | None, decode: bool = False,
                  lookahead: int = 0) -> StepResult:
        view = self.views[rid]
        mgr = cast("SupportsKVCacheGroups", self.manager)  # the guard checked the forms
        out: StepResult = {}
        hits: list[list[int]] = []
        num_hit = 0
        if rid not in self.running:
            raw_hits, num_hit = self._call(
                f"m.get_computed_blocks(views[{rid!r}])", mgr.get_computed_blocks, view)
            hits = [list(h) for h in raw_hits]
            out["hits"] = (hits, num_hit)  # type: ignore[typeddict-item]  # per-group lists
            self._law_problems += check_hybrid_hits(self.group_written, self.spec, view, hits,
                                                    num_hit)
        remaining = view.num_tokens - view.num_computed_tokens - num_hit
        if rid in self.running and (decode or remaining <= 0):
            num_tokens = 1 if num_tokens is None else num_tokens
            new_out = tuple(output_token(rid, len(view.output_token_ids) + i)
                            for i in range(num_tokens))
            view = replace(view, output_token_ids=view.output_token_ids + new_out)
            self.views[rid] = view
            self.lines.append(
                f"views[{rid!r}] = replace(views[{rid!r}], output_token_ids="
                f"{view.output_token_ids!r})")
            remaining = num_tokens
        num_new = max(0, remaining if num_tokens is None else min(num_tokens, remaining))
        start = view.num_computed_tokens + num_hit  # hits are read, not written
        was_running = rid in self.running
        text = f"m.allocate_slots(views[{rid!r}], {num_new}, {num_hit}, {hits!r}"
        if lookahead:
            new = self._call(f"{text}, {lookahead})", mgr.allocate_slots, view,
                             num_new, num_hit, hits, lookahead)
        else:
            new = self._call(f"{text})", mgr.allocate_slots, view, num_new, num_hit, hits)
        if was_running or new is not None:
            self.last_start[rid] = start
        new_ids: list[list[int]] | None = None if new is None else [list(p) for p in new]
        out["new"] = new_ids  # type: ignore[typeddict-item]  # per-group lists
        if new_ids is None:
            if not was_running:
                left = [list(t) for t in mgr.get_block_ids(rid)]
                if any(left):
                    self._law_problems.append(
                        f"all-or-nothing: allocate_slots({rid!r}) returned None for a request "
                        f"holding no blocks, yet it now holds {left}")
            return out
        self.running.add(rid)
        view = self.views[rid] = replace(view, num_computed_tokens=start + num_new)
        tables = [list(t) for t in mgr.get_block_ids(rid)] if num_new else []
        for g, written in enumerate(self.group_written):
            written.clear(new_ids[g] if g < len(new_ids) else [])
            if num_new and g < len(tables):
                # Null positions hold nothing: keep them out of the record.
                table = [b if b != NULL_BLOCK else -1 - i for i, b in enumerate(tables[g])]
                written.write(view, table, start, start + num_new)
        self.lines.append(
            f"views[{rid!r}] = replace(views[{rid!r}], num_computed_tokens="
            f"{self.views[rid].num_computed_tokens})")
        return out

    def group_tables(self) -> dict[str, list[list[int]]]:
        """``{rid: per-group tables}`` of the running requests."""
        mgr = cast("SupportsKVCacheGroups", self.manager)
        return {rid: [list(t) for t in mgr.get_block_ids(rid)] for rid in sorted(self.running)}

    def tables(self) -> dict[str, list[int]]:
        """``group_tables()``, typed as the base's (observations compare them as values)."""
        return cast("dict[str, list[int]]", self.group_tables())
