"""Random multi-group workloads: the single-group workload machine
(``kvcheck.conformance.workload_machine``) run over hybrid layouts
(docs/semantics.md#kv-cache-groups-hybrid-models).

The machine draws each engine's block size, pool size, caching, events and hash algorithm;
``hybrid_pair_factory`` turns those draws into a multi-group spec: the layout (which groups,
their kinds, block sizes, windows and chunks, the retention interval) is a function of the
drawn pool size, so Hypothesis explores layouts as it explores pools, and a failure shrinks
to a short op list on one layout like any other. Layouts stay within what the profile's vLLM
supports:

* ``vllm-0.10``: one group of any kind, or exactly one full-attention spec and one other spec
  (possibly several groups each, not interleaved), all of one block size;
* ``vllm-0.33`` and ``generic``: up to four groups, mixed block sizes (every size divides the
  largest, so the hash block is the smallest and the scheduler block the largest), a
  chunked-local group only at the scheduler block size, windows 2..32, chunks a multiple of
  the group's block size, ``prefix_cache_retention_interval`` None, 0 or a multiple of the
  scheduler block size (with a sliding group).

Only kinds both sides declare are drawn (``KIND_CAPABILITIES``). vLLM 0.10.2 crashes when
events are on for a chunked-local group or a window ``w - 1 < bs``
(docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups): such engines
run with events off under that profile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from kvcheck.conformance.protocol import (
    KIND_CAPABILITIES,
    ImplInfo,
    KVCacheGroupSpec,
    KVCacheSpec,
    UnsupportedSpec,
)
from kvcheck.conformance.scaled_workloads import workload_scale

__all__ = ["WINDOWS", "declared_kinds", "hybrid_layouts", "hybrid_pair_factory", "layout_for"]

#: Sliding windows drawn (tokens).
WINDOWS: tuple[int, ...] = (4, 2, 3, 5, 8, 16, 32)
# Chunk sizes, in blocks of the chunked group.
_CHUNK_BLOCKS: tuple[int, ...] = (2, 1, 3, 4)

# A layout: (kind, block size multiplier) per group; windows and chunks are filled in later.
_Layout = tuple[tuple[str, int], ...]
_F, _S, _C = "full_attention", "sliding_window", "chunked_local_attention"

_LAYOUTS_010: tuple[_Layout, ...] = (
    ((_F, 1), (_S, 1)),
    ((_S, 1), (_F, 1)),
    ((_F, 1), (_C, 1)),
    ((_S, 1),),
    ((_F, 1), (_F, 1), (_S, 1), (_S, 1)),
    ((_C, 1),),
    ((_F, 1),),
)
_LAYOUTS_033: tuple[_Layout, ...] = (
    ((_F, 1), (_S, 1)),
    ((_F, 1), (_S, 2)),
    ((_F, 2), (_S, 1)),
    ((_F, 1), (_S, 1), (_S, 1)),
    ((_F, 1), (_C, 1)),
    ((_S, 1),),
    ((_F, 1), (_S, 1), (_C, 1)),
    ((_S, 1), (_C, 1)),
    ((_F, 1), (_F, 1), (_S, 1), (_S, 1)),
    ((_C, 1),),
    ((_F, 1), (_F, 2)),
    ((_S, 2), (_F, 1), (_C, 2)),
    ((_F, 2), (_S, 4)),
    # A sliding group finer than the scheduler block: its hits must end on aligned boundaries.
    ((_F, 1), (_S, 1), (_S, 2)),
)


def hybrid_layouts(profile: str, kinds: Iterable[str]) -> tuple[_Layout, ...]:
    """The layouts drawn under ``profile`` using only ``kinds``."""
    allowed = set(kinds)
    table = _LAYOUTS_010 if profile == "vllm-0.10" else _LAYOUTS_033
    return tuple(lay for lay in table if all(kind in allowed for kind, _ in lay))


def layout_for(profile: str, kinds: Iterable[str], block_size: int, draw: int,
               scale: int = 1) -> tuple[tuple[KVCacheGroupSpec, ...], int | None]:
    """The groups and retention interval of draw number ``draw`` (any int >= 0); sliding
    windows are ``scale`` times ``WINDOWS`` (the machine's ``workload_scale``: at a declared
    256-token block a window spans as many blocks as at 4)."""
    layouts = hybrid_layouts(profile, kinds)
    layout = layouts[draw % len(layouts)]
    draw //= len(layouts)
    groups = []
    for i, (kind, mult) in enumerate(layout):
        bs = block_size * mult
        if kind == _S:
            # Groups of one spec in 0.10.2 share it: the same window for every SWA group.
            window = scale * WINDOWS[(draw + (0 if profile == "vllm-0.10" else i))
                                     % len(WINDOWS)]
            groups.append(KVCacheGroupSpec(kind, bs, sliding_window=window))
        elif kind == _C:
            chunk = bs * _CHUNK_BLOCKS[(draw // 3) % len(_CHUNK_BLOCKS)]
            groups.append(KVCacheGroupSpec(kind, bs, attention_chunk_size=chunk))
        else:
            groups.append(KVCacheGroupSpec(kind, bs))
    # 0.33's prefix_cache_retention_interval: None, 0, or (with a sliding group) a multiple of
    # the scheduler block size (the lcm of the groups' sizes).
    choice = (draw + 1) % 4
    has_swa = any(kind == _S for kind, _ in layout)
    retention: int | None = None
    if profile != "vllm-0.10" and choice and (choice == 1 or has_swa):
        retention = 0 if choice == 1 else math.lcm(*(g.block_size or block_size
                                                     for g in groups)) * (choice - 1)
    return tuple(groups), retention


def declared_kinds(capabilities: Iterable[str]) -> tuple[str, ...]:
    """The attention kinds a set of capabilities covers (none without ``kv_cache_groups``)."""
    caps = set(capabilities)
    if "kv_cache_groups" not in caps:
        return ()
    return tuple(kind for kind, cap in KIND_CAPABILITIES.items() if cap in caps)


def hybrid_pair_factory(make_pair: Callable[..., Any], profile: str,
                        kinds: Iterable[str], info: ImplInfo | None = None
                        ) -> Callable[..., Any]:
    """A ``make_pair(**spec_fields)`` for ``run_workload_machine`` that turns the machine's
    single-group spec fields into a multi-group spec (see the module doc): the pool grows
    with the number of groups (each token needs a slot in every group). A multi-group spec
    ``info`` does not support (a group's block size outside ``block_sizes``, the grown pool
    outside ``num_blocks_range``) raises ``UnsupportedSpec``: the machine draws another.
    Sliding windows scale with the machine's lengths (``workload_scale`` of ``info``)."""
    kind_list = tuple(kinds)

    def make(**fields: Any) -> Any:
        block_size = int(fields["block_size"])
        num_blocks = int(fields["num_blocks"])
        groups, retention = layout_for(profile, kind_list, block_size, num_blocks,
                                       workload_scale(block_size, info, profile))
        per_group = max(2, num_blocks - 1)
        fields["num_blocks"] = 1 + sum(max(2, per_group * block_size // (g.block_size or 1))
                                       for g in groups)
        fields["kv_cache_groups"] = groups
        fields["prefix_cache_retention_interval"] = retention
        if profile == "vllm-0.10" and any(
                g.kind == _C or (g.kind == _S and (g.sliding_window or 0) - 1
                                 < (g.block_size or block_size)) for g in groups):
            # vLLM 0.10.2's event crash
            # (docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups)
            fields["enable_kv_cache_events"] = False
        if info is not None and not info.supports(KVCacheSpec(**fields)):
            raise UnsupportedSpec(f"{info.name} does not declare this layout's block sizes "
                                  "or pool size (IMPL_INFO.block_sizes, num_blocks_range)")
        return FlatAnswers(make_pair(**fields))

    return make


class FlatAnswers:
    """A ``Pair`` as the single-group workload machine sees it: ``apply`` answers with the
    groups' lists joined (null blocks left out), so the machine's bookkeeping (refusals,
    blocks handed out, touched positions of the free queue) reads them as one list. The
    checks and comparisons inside the ``Pair`` still see the per-group answers."""

    def __init__(self, pair: Any) -> None:
        self.pair = pair

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pair, name)

    def apply(self, op: Any) -> Any:
        got = dict(self.pair.apply(op))
        if got.get("new") is not None:
            got["new"] = _joined(got["new"])
        if "hits" in got:
            got["hits"] = (_joined(got["hits"][0]), got["hits"][1])
        return got


def _joined(groups: Iterable[Iterable[int]]) -> list[int]:
    return [b for part in groups for b in part if b != 0]
