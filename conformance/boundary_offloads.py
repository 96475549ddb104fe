"""Boundary-state hand-offs for a KV connector (capability ``boundary_state_offloads``, vLLM
0.33; docs/semantics.md#boundary-state-hand-offs): which layouts make them, and the laws the
harness judges them by.

vLLM 0.33's Mamba "align" block table is not append-only (interior states are nulled and
freed, speculative blocks move to its end), so a KV connector cannot find a state block by its
position: ``KVCacheManager.take_boundary_state_offloads()`` hands it each boundary state with
its exact block, ``{request_id: [(group_id, block_id, boundary_tokens), ...]}``, and its
scheduler drains them in every ``schedule()``, just before ``take_kv_cache_block_copies``. A
Mamba "align" group makes them (prefix caching on): each state block ``cache_blocks`` keys, at
``(index + 1) * block_size``, and with fine-grained hits the copy-on-write copy of a running
request's own partial tail (the prompt's last hash boundary, inside a block). A request freed
before the drain loses its hand-offs. ``finalize_partial_tail_offloads(request)``, which vLLM's
scheduler calls for a KV producer whose request finishes, hands a tail not copied yet from the
request's own table block when the request computed exactly up to it.

The driver (``kvcheck.conformance.driver``) drains the hand-offs where vLLM's ``schedule()``
does and asks for a request's tails before each ``free``; the guard checks their shape; the
laws here (``offload_problems``, ``tail_problems``) check each hand-off: its request holds the
block (in its table of that group, or as the destination of a copy drained with it), the group
is a Mamba group, and the block holds the state after exactly ``boundary_tokens`` tokens of
that request (the written-content record, ``kvcheck.conformance.written``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.conformance.written import WrittenBlocks

__all__ = ["CAPABILITY", "boundary_state_offloads", "offload_problems", "tail_problems"]

#: The capability that declares the feature (needs ``mamba``).
CAPABILITY = "boundary_state_offloads"


def boundary_state_offloads(spec: KVCacheSpec) -> bool:
    """Whether vLLM 0.33 makes boundary-state hand-offs in ``spec``'s layout: prefix caching
    on and a Mamba group in mode "align" (never under ``vllm-0.10``)."""
    return (spec.profile != "vllm-0.10" and spec.enable_caching
            and any(g.kind == "mamba" and g.mamba_cache_mode == "align"
                    for g in spec.groups))


def _content_problem(written: WrittenBlocks, block: int, view: RequestView,
                     boundary: int) -> str | None:
    """Why ``block`` does not hold the state after exactly ``boundary`` tokens of ``view``
    (None if it does)."""
    bs = written.block_size
    index = -(-boundary // bs) - 1
    count = boundary - index * bs
    if count == bs:
        return written.mismatch(block, view, index)
    return written.partial_mismatch(block, view, index, count)


def _entry_problems(spec: KVCacheSpec, written: Sequence[WrittenBlocks], what: str,
                    rid: str, view: RequestView | None, tables: Sequence[Sequence[int]],
                    copies: Sequence[tuple[int, int]],
                    entries: Sequence[tuple[int, int, int]]) -> list[str]:
    problems: list[str] = []
    if view is None:
        return [(f"{what} hands off {list(entries)} for request {rid!r}, which holds no "
                "blocks (a request freed before the drain loses its hand-offs)")]
    copied = {dst for _, dst in copies}
    for g, block, boundary in entries:
        entry = f"{what}: ({g}, {block}, {boundary}) of request {rid!r}"
        group = spec.groups[g]
        if group.kind != "mamba" or group.mamba_cache_mode != "align":
            problems.append(f"{entry}: group {g} is {group.kind!r}, not a Mamba 'align' group "
                            "(only those hand boundary states off)")
            continue
        table = tables[g] if g < len(tables) else ()
        if block not in table and block not in copied:
            problems.append(f"{entry}: block {block} is neither in the request's table of "
                            f"group {g} ({list(table)}) nor the destination of a copy "
                            f"drained with it ({sorted(copied)})")
            continue
        if boundary > view.num_computed_tokens:
            problems.append(f"{entry}: the request computed only {view.num_computed_tokens} "
                            "tokens")
            continue
        why = _content_problem(written[g], block, view, boundary)
        if why is not None:
            problems.append(f"{entry}: block {block} must hold the state after exactly "
                            f"{boundary} tokens of the request, but {why}")
    return problems


def offload_problems(spec: KVCacheSpec, written: Sequence[WrittenBlocks],
                     views: Mapping[str, RequestView], running: set[str],
                     tables: Mapping[str, Sequence[Sequence[int]]],
                     offloads: Mapping[str, Sequence[tuple[int, int, int]]],
                     copies: Sequence[tuple[int, int]]) -> list[str]:
    """The laws of one drain of ``take_boundary_state_offloads()`` (see the module doc):
    ``tables`` are the running requests' tables at the drain, ``copies`` the copies drained
    with it (already applied to ``written``)."""
    problems: list[str] = []
    if offloads and not boundary_state_offloads(spec):
        return [(f"take_boundary_state_offloads() handed off {dict(offloads)} in a layout "
                "without a Mamba 'align' group with prefix caching on (vLLM makes none there)")]
    for rid, entries in offloads.items():
        view = views.get(rid) if rid in running else None
        problems += _entry_problems(spec, written, "take_boundary_state_offloads()", rid, view,
                                    tables.get(rid, ()), copies, entries)
    return problems


def tail_problems(spec: KVCacheSpec, written: Sequence[WrittenBlocks], view: RequestView,
                  table: Sequence[Sequence[int]],
                  tails: Sequence[tuple[int, int, int]]) -> list[str]:
    """The laws of ``finalize_partial_tail_offloads(view)``: each tail is in the request's
    own table of a Mamba group, at exactly its computed tokens, and holds that state."""
    what = f"finalize_partial_tail_offloads({view.request_id!r})"
    problems = _entry_problems(spec, written, what, view.request_id, view, table, (), tails)
    for g, block, boundary in tails:
        if boundary != view.num_computed_tokens:
            problems.append(f"{what}: ({g}, {block}, {boundary}) is not at the request's "
                            f"{view.num_computed_tokens} computed tokens (a tail is handed "
                            "off only when no later token was computed into its block)")
    return problems
