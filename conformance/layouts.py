"""The KV-cache group layouts random workloads draw
(docs/semantics.md#kv-cache-groups-hybrid-models): tables of group kinds and block-size
multipliers per profile, and the layout of one draw (``layout_for``). The workload machine
(``kvcheck.conformance.workload_machine``) turns its drawn pool size into a draw number, so
Hypothesis explores layouts as it explores pools, and a failure shrinks to a short op list on
one layout like any other. Layouts stay within what the profile's vLLM supports:

* ``vllm-0.10``: one group of any kind, or exactly one full-attention spec and one other spec
  (possibly several groups each, not interleaved), all of one block size;
* ``vllm-0.33`` and ``generic``: up to four groups, mixed block sizes (each a multiple of the
  smallest, the hash block; the scheduler block is their lcm, in two layouts no group's size),
  a chunked-local group only at the scheduler block size, windows 2..32, chunks a multiple of
  the group's block size, full-attention groups larger than the hash block (partial-block
  keys), ``prefix_cache_retention_interval`` None, 0 or a multiple of the
  scheduler block size (with a sliding group). A quarter of the table are layouts of three or
  more kinds listed for the hit length's fixed point (a later group often stricter than an
  earlier one, so the common hit length needs several rounds over the groups).

Layouts with a ``cross_attention`` group (an encoder-decoder model) run with prefix caching
off, as vLLM runs them (``has_cross_attention``): half of the caching-off draws take one when
the kind is declared (the caching-on draws are unchanged), and their requests carry encoder
tokens.

Layouts with a ``mamba`` group (state-space models) are drawn in a quarter of the draws where
the kind is declared: with caching on (vLLM 0.33 only) mode "align" at the layout's smallest
block size, with caching off (both releases) mode "none"; one speculative block in every
other draw, no retention interval (but with checkpoints, below). For an
implementation declaring ``fine_grained_hits``
(``fine_grained=True``) the caching-on Mamba table also lists layouts with a Mamba group
larger than the hash block, where vLLM 0.33 has fine-grained partial hits
(``kvcheck.conformance.fine_grained``), and one where a sliding window keeps them off:
appended, so the draws of an implementation not declaring it are unchanged. For an
implementation declaring ``mamba_checkpoints`` (``checkpoints=True``) half the caching-on
Mamba draws give the Mamba groups prefill checkpoint blocks and draw a retention interval
(sparse Mamba retention; ``kvcheck.conformance.mamba_checkpoints``): the same tables, so the
draws of an implementation not declaring it are unchanged.

Only kinds both sides declare are drawn (``declared_kinds``, ``KIND_CAPABILITIES``). vLLM
0.10.2 crashes when events are on for a chunked-local group or a window ``w - 1 < bs``
(docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups): such layouts
run with events off under that profile (``events_crash``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from kvcheck.conformance.protocol import KIND_CAPABILITIES, KVCacheGroupSpec

__all__ = ["KNOBS", "WINDOWS", "declared_kinds", "events_crash", "has_cross_attention",
           "hybrid_layouts", "knobs_for", "layout_for"]

#: Sliding windows drawn (tokens).
WINDOWS: tuple[int, ...] = (4, 2, 3, 5, 8, 16, 32)
# Chunk sizes, in blocks of the chunked group.
_CHUNK_BLOCKS: tuple[int, ...] = (2, 1, 3, 4)

# A layout: (kind, block size multiplier) per group; windows and chunks are filled in later.
_Layout = tuple[tuple[str, int], ...]
_F, _S, _C = "full_attention", "sliding_window", "chunked_local_attention"
_X, _M = "cross_attention", "mamba"

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
    # No group at the scheduler block (lcm 6): only the sliding groups' own alignment rule
    # keeps their hits on its boundaries.
    ((_F, 1), (_S, 2), (_S, 3)),
    # Three or more kinds, a later group often stricter than an earlier one (a smaller window,
    # or a window after chunks of different sizes): a later group cuts the hit length the
    # earlier ones agreed on, and the search is iterated to a fixed point
    # (docs/semantics.md#hits-per-group-and-the-common-hit-length). Listed again for weight:
    # random workloads reach these layouts in their first examples.
    ((_F, 1), (_S, 1), (_S, 1)),
    ((_F, 1), (_C, 1), (_S, 1)),
    ((_F, 1), (_C, 1), (_C, 1), (_S, 1)),
    ((_F, 1), (_S, 1), (_S, 1), (_S, 1)),
    ((_S, 1), (_S, 1), (_C, 1)),
    # Full attention larger than the hash block (the gcd): 0.33 keys the block holding the
    # prompt's last hash boundary by the hash there too (docs/semantics.md#partial-block-keys),
    # with the scheduler block at the full group's size, past it (lcm 6), and beside chunks.
    ((_F, 4), (_S, 1)),
    ((_F, 2), (_S, 3)),
    ((_F, 2), (_S, 1), (_C, 2)),
)
# Encoder-decoder models (Whisper): decoder self-attention and cross attention, prefix caching
# off (as vLLM runs them); any layout then, in either release. Drawn in half of the examples
# with caching off, so the caching-on examples (the hit searches) stay those of the table above.
_CROSS_LAYOUTS: tuple[_Layout, ...] = (
    ((_F, 1), (_X, 1)),
    ((_X, 1), (_F, 1)),
    # A window beside, and a cross-attention block twice the decoder's.
    ((_F, 1), (_S, 1), (_X, 2)),
)

# Mamba (state-space) models. vLLM 0.33 with prefix caching on: mode "align", the Mamba block
# the smallest of the layout (the hash block: a larger one turns on 0.33's fine-grained hits,
# not modelled), no retention interval. Drawn in a quarter of the caching-on draws where the
# kind is declared (draw % 4 == 3); appended tables, so the other draws stay where they were.
_MAMBA_LAYOUTS_ON: tuple[_Layout, ...] = (
    ((_F, 1), (_M, 1)),
    ((_M, 1),),
    ((_F, 2), (_M, 1)),
    ((_F, 1), (_S, 1), (_M, 1)),
    ((_M, 1), (_F, 1), (_C, 1)),
)
# Fine-grained partial hits (vLLM 0.33, capability ``fine_grained_hits``): a Mamba "align"
# group larger than the hash block (the gcd). Appended to the caching-on Mamba table for an
# implementation declaring the capability (``fine_grained``): its other draws stay where they
# were. A hit may end inside a Mamba block (Mamba at 2, 3 or 4 times the hash block) and inside
# a full-attention block (full attention at twice the hash block); a sliding window at the
# hash block leaves the feature on, one at twice it keeps it off.
_FINE_LAYOUTS: tuple[_Layout, ...] = (
    ((_F, 1), (_M, 2)),
    ((_F, 2), (_M, 3)),
    ((_M, 2), (_F, 1)),
    ((_F, 1), (_F, 2), (_M, 4)),
    ((_F, 1), (_S, 1), (_M, 2)),
    ((_F, 1), (_S, 2), (_M, 2)),
)
# Boundary-state hand-offs (vLLM 0.33, capability ``boundary_state_offloads``): two Mamba
# "align" groups, whose hand-offs come group by group. Appended after the tables above for an
# implementation declaring the capability (``offloads``): the other draws stay where they were;
# the second one (a Mamba group larger than the hash block: fine-grained hits, copies of both
# groups) only where ``fine_grained`` holds too.
_OFFLOAD_LAYOUTS: tuple[_Layout, ...] = (
    ((_M, 1), (_F, 1), (_M, 1)),
)
_OFFLOAD_FINE_LAYOUTS: tuple[_Layout, ...] = (
    ((_F, 1), (_M, 2), (_M, 3)),
)
# Prefix caching off (both releases, mode "none"; 0.10.2 runs Mamba models only so): any block
# sizes. Drawn in a quarter of the caching-off draws (draw % 4 == 2: not the encoder-decoder
# ones).
_MAMBA_LAYOUTS_OFF: tuple[_Layout, ...] = (
    ((_F, 1), (_M, 1)),
    ((_M, 1),),
    ((_F, 1), (_M, 2)),
    ((_F, 1), (_S, 1), (_M, 1)),
)


def hybrid_layouts(profile: str, kinds: Iterable[str]) -> tuple[_Layout, ...]:
    """The layouts drawn under ``profile`` using only ``kinds``."""
    allowed = set(kinds)
    table = _LAYOUTS_010 if profile == "vllm-0.10" else _LAYOUTS_033
    return tuple(lay for lay in table if all(kind in allowed for kind, _ in lay))


def layout_for(profile: str, kinds: Iterable[str], block_size: int, draw: int,
               scale: int = 1, *, enable_caching: bool = True, fine_grained: bool = False,
               offloads: bool = False, checkpoints: bool = False,
               ) -> tuple[tuple[KVCacheGroupSpec, ...], int | None]:
    """The groups and retention interval of draw number ``draw`` (any int >= 0); sliding
    windows are ``scale`` times ``WINDOWS`` (the machine's ``workload_scale``: at a declared
    256-token block a window spans as many blocks as at 4). With caching off, every other
    draw is an encoder-decoder layout where ``cross_attention`` is among ``kinds``; where
    ``mamba`` is, a quarter of the draws are Mamba layouts (``_mamba_layouts``; with
    ``fine_grained``, both sides declaring ``fine_grained_hits``, fine-grained ones among
    them; with ``offloads``, both sides declaring ``boundary_state_offloads``, layouts of
    two Mamba groups after them; with ``checkpoints``, both sides declaring
    ``mamba_checkpoints``, half the caching-on Mamba layouts get prefill checkpoint blocks
    and a retention interval, ``_checkpoint_fields``)."""
    kinds = tuple(kinds)
    layouts = hybrid_layouts(profile, kinds)
    mamba = _mamba_layouts(profile, kinds, enable_caching, draw, fine_grained, offloads)
    if mamba:
        layouts = mamba
        draw //= 4
    elif not enable_caching and _X in kinds and draw % 2:
        layouts = tuple(lay for lay in _CROSS_LAYOUTS
                        if all(kind in kinds for kind, _ in lay))
        draw //= 2
    layout = layouts[draw % len(layouts)]
    draw //= len(layouts)
    # Prefill checkpoint blocks and sparse retention (vLLM 0.33, ``checkpoints``: both sides
    # declare ``mamba_checkpoints``): the caching-on Mamba layouts in half the draws, by the
    # parity of what is left of the draw and of the block size's bit length (a pool size
    # reaches a layout in few draws; the block sizes vary them).
    checkpointed = (checkpoints and bool(mamba) and enable_caching
                    and (draw + block_size.bit_length()) % 2 == 1)
    ckpt_blocks, ckpt_alignment = _checkpoint_fields(checkpointed, draw, block_size)
    groups = []
    for i, (kind, mult) in enumerate(layout):
        bs = block_size * mult
        if kind == _S:
            # Groups of one spec in 0.10.2 share it: the same window for every SWA group.
            # Elsewhere two groups apart in the table, so that a later group's window is the
            # smaller one in 4 draws of 7 (the fixed point's layouts above).
            window = scale * WINDOWS[(draw - (0 if profile == "vllm-0.10" else 2 * i))
                                     % len(WINDOWS)]
            groups.append(KVCacheGroupSpec(kind, bs, sliding_window=window))
        elif kind == _C:
            # Each chunked group of a layout its own chunk size (its own spec).
            chunk = bs * _CHUNK_BLOCKS[(draw // 3 + i) % len(_CHUNK_BLOCKS)]
            groups.append(KVCacheGroupSpec(kind, bs, attention_chunk_size=chunk))
        elif kind == _M:
            # "align" with caching on, "none" off; one speculative block in every other draw.
            groups.append(KVCacheGroupSpec(kind, bs,
                                           mamba_cache_mode="align" if enable_caching else "none",
                                           num_speculative_blocks=(draw + i) % 2,
                                           num_prefill_checkpoint_blocks=ckpt_blocks,
                                           prefill_checkpoint_alignment=ckpt_alignment))
        else:
            groups.append(KVCacheGroupSpec(kind, bs))
    # 0.33's prefix_cache_retention_interval: None, 0, or (with a sliding group) a multiple of
    # the scheduler block size (the lcm of the groups' sizes).
    choice = (draw + 1) % 4
    has_swa = any(kind == _S for kind, _ in layout)
    retention: int | None = None
    if checkpointed:  # sparse Mamba retention: None, 0, one or two scheduler blocks
        scheduler = math.lcm(*(g.block_size or block_size for g in groups))
        variant = draw // 2 + block_size.bit_length() // 2
        return tuple(groups), (None, 0, scheduler, 2 * scheduler)[variant % 4]
    if mamba:  # the Mamba layouts drawn before checkpoints were: no retention interval
        return tuple(groups), None
    if profile != "vllm-0.10" and choice and (choice == 1 or has_swa):
        retention = 0 if choice == 1 else math.lcm(*(g.block_size or block_size
                                                     for g in groups)) * (choice - 1)
    return tuple(groups), retention


def _checkpoint_fields(checkpointed: bool, draw: int, block_size: int) -> tuple[int, int | None]:
    """A checkpoint layout's Mamba ``(num_prefill_checkpoint_blocks,
    prefill_checkpoint_alignment)`` (``(0, None)`` elsewhere): one checkpoint block in four
    variants of five (none in the fifth: sparse retention alone), aligned on 1, the layout's
    smallest block or twice it. The variant mixes in the block size: a pool size reaches a
    layout of this table in few draws, the block sizes vary them."""
    if not checkpointed:
        return 0, None
    variant = draw + block_size.bit_length() // 2
    return int(variant % 5 != 4), (1, block_size, 2 * block_size)[(variant + variant // 3) % 3]


def _mamba_layouts(profile: str, kinds: tuple[str, ...], enable_caching: bool,
                   draw: int, fine_grained: bool = False,
                   offloads: bool = False) -> tuple[_Layout, ...]:
    """The Mamba layouts draw number ``draw`` picks from (none: draw from the other tables):
    a quarter of the draws where ``mamba`` is among ``kinds``, caching on only under vLLM
    0.33 (0.10.2 runs Mamba models with caching off); the fine-grained layouts appended
    with ``fine_grained``, then the two-Mamba-group ones with ``offloads``."""
    if _M not in kinds:
        return ()
    if enable_caching:
        on = _MAMBA_LAYOUTS_ON + (_FINE_LAYOUTS if fine_grained else ())
        if offloads:
            on += _OFFLOAD_LAYOUTS + (_OFFLOAD_FINE_LAYOUTS if fine_grained else ())
        table = on if profile != "vllm-0.10" and draw % 4 == 3 else ()
    else:
        table = _MAMBA_LAYOUTS_OFF if draw % 4 == 2 else ()
    return tuple(lay for lay in table if all(kind in kinds for kind, _ in lay))


def declared_kinds(capabilities: Iterable[str]) -> tuple[str, ...]:
    """The attention kinds a set of capabilities covers (none without ``kv_cache_groups``)."""
    caps = set(capabilities)
    if "kv_cache_groups" not in caps:
        return ()
    return tuple(kind for kind, cap in KIND_CAPABILITIES.items() if cap in caps)


def events_crash(profile: str, groups: Iterable[KVCacheGroupSpec], block_size: int) -> bool:
    """Whether ``profile``'s vLLM crashes with KV events on for ``groups`` (``block_size``:
    the spec's, for a group without its own): 0.10.2 with a chunked-local group or a sliding
    window ``w - 1`` shorter than its block."""
    return profile == "vllm-0.10" and any(
        g.kind == _C or (g.kind == _S and (g.sliding_window or 0) - 1
                         < (g.block_size or block_size)) for g in groups)


def has_cross_attention(groups: Iterable[KVCacheGroupSpec]) -> bool:
    """Whether ``groups`` are an encoder-decoder model's (a ``cross_attention`` group): vLLM
    runs those with prefix caching off."""
    return any(g.kind == _X for g in groups)


#: Capabilities for the manager's configuration knobs ``knobs_for`` draws (the spec's
#: ``dcp_world_size`` and ``prefix_match_unit``; ``mamba_dcp``: DCP beside Mamba groups).
KNOBS: tuple[str, ...] = ("dcp", "prefix_match_unit", "mamba_dcp")

# Decode context parallelism with prefix caching on, where vLLM allows it: one full-attention
# group (0.10.2 asserts one group, and its and 0.33's window and chunk managers assert DCP 1 at
# a lookup), or 0.33's hybrid layouts of full attention only (its HybridKVCacheCoordinator
# asserts every group full attention or Mamba). Beside a Mamba "align" group (0.33, both sides
# declaring ``mamba_dcp`` and ``fine_grained_hits``) the drawn Mamba layout itself when it has
# only full-attention and Mamba groups: vLLM 0.33 leaves the Mamba block unscaled, so a Mamba
# block equal to the hash block already has fine-grained hits (``_mamba_dcp_groups``).
_DCP_LAYOUTS_ON_010: tuple[_Layout, ...] = (((_F, 1),),)
_DCP_LAYOUTS_ON_033: tuple[_Layout, ...] = (
    ((_F, 1),),
    ((_F, 1), (_F, 2)),
    ((_F, 2), (_F, 1), (_F, 1)),
)
# Mamba "align" layouts under DCP with caching on (vLLM 0.33, ``_mamba_dcp_groups``): the
# Mamba block at the layout's smallest size (under DCP the hash block: fine-grained hits at
# equality), larger than it, alone, and beside two full-attention sizes.
_DCP_MAMBA_LAYOUTS_ON: tuple[_Layout, ...] = (
    ((_F, 1), (_M, 1)),
    ((_F, 1), (_M, 2)),
    ((_M, 1), (_F, 2)),
    ((_F, 1), (_F, 2), (_M, 1)),
    ((_M, 1),),
    ((_F, 2), (_M, 3)),
)
#: DCP world sizes drawn.
_DCP_SIZES: tuple[int, ...] = (2, 4)


def knobs_for(profile: str, groups: tuple[KVCacheGroupSpec, ...], block_size: int, draw: int,
              *, enable_caching: bool, knobs: Iterable[str],
              group_kinds: Iterable[str] | None = None,
              ) -> tuple[tuple[KVCacheGroupSpec, ...], int, int | None] | None:
    """The knobs of draw number ``draw`` for an implementation declaring ``knobs`` (``KNOBS``
    both sides declare), or None (most draws, and every draw without them: the layout of
    ``layout_for`` as it is). Else ``(groups, dcp_world_size, prefix_match_unit)``, in one
    draw of three each where declared:

    * ``dcp``: world size 2 or 4; with caching off on the drawn layout (any groups: vLLM's
      no-prefix-cache coordinator; a Mamba one under 0.10.2 only with ``mamba_dcp`` among
      ``knobs``), with caching on on a layout of ``_DCP_LAYOUTS_ON_*`` (no retention interval
      then: no window), or on the drawn Mamba layout where ``_mamba_dcp_groups`` keeps it;
    * ``prefix_match_unit`` (0.33, caching on, several groups): a proper divisor of the gcd
      of the group block sizes (the gcd when it is 1), so hashes are finer than the default;
      beside a Mamba group only with ``fine_grained_hits`` among ``knobs`` (a Mamba block
      then exceeds the hash block: fine-grained partial hits).

    ``group_kinds``: the kinds the run draws from (None: any); a Mamba layout of DCP's own
    takes the drawn one's place only where ``mamba`` is among them.
    """
    wanted = set(knobs)
    if group_kinds is not None and _M not in group_kinds:
        # No Mamba layout of DCP's own where the run's kinds leave Mamba out.
        wanted -= {"mamba_dcp"}
    slot = (draw // 5) % 3
    mamba_010 = profile == "vllm-0.10" and any(g.kind == _M for g in groups)
    if slot == 1 and "dcp" in wanted and not (mamba_010 and "mamba_dcp" not in wanted):
        dcp = _DCP_SIZES[(draw // 15) % len(_DCP_SIZES)]
        mamba_groups = (_mamba_dcp_groups(profile, groups, block_size, draw, wanted)
                        if enable_caching else
                        _mamba_dcp_groups_off(groups, block_size, draw, wanted))
        if mamba_groups is not None:
            return mamba_groups, dcp, None
        if enable_caching:
            table = _DCP_LAYOUTS_ON_010 if profile == "vllm-0.10" else _DCP_LAYOUTS_ON_033
            layout = table[(draw // 30) % len(table)]
            groups = tuple(KVCacheGroupSpec(kind, block_size * mult) for kind, mult in layout)
        return groups, dcp, None
    if (slot == 2 and "prefix_match_unit" in wanted and profile != "vllm-0.10"
            and enable_caching and len(groups) > 1
            and ("fine_grained_hits" in wanted or all(g.kind != _M for g in groups))):
        gcd = math.gcd(*(g.block_size or block_size for g in groups))
        units = [d for d in range(1, gcd) if gcd % d == 0] or [gcd]
        return groups, 1, units[(draw // 15) % len(units)]
    return None


def _mamba_dcp_groups_off(groups: tuple[KVCacheGroupSpec, ...], block_size: int, draw: int,
                          wanted: set[str]) -> tuple[KVCacheGroupSpec, ...] | None:
    """With caching off and ``mamba_dcp`` both sides declared, a drawn layout without a Mamba
    group gives way to one of ``_MAMBA_LAYOUTS_OFF`` (mode "none") in every other draw, so
    Mamba groups meet DCP as often as under caching on (0.10.2 runs Mamba models only with
    caching off). None: the drawn layout (always so for an implementation not declaring it)."""
    if "mamba_dcp" not in wanted or any(g.kind == _M for g in groups) or draw % 2 == 0:
        return None
    layout = _MAMBA_LAYOUTS_OFF[(draw // 2) % len(_MAMBA_LAYOUTS_OFF)]
    window = WINDOWS[(draw // 7) % len(WINDOWS)]
    return tuple(KVCacheGroupSpec(kind, block_size * mult,
                                  num_speculative_blocks=(draw // 7 + i) % 2)
                 if kind == _M else
                 KVCacheGroupSpec(kind, block_size * mult, sliding_window=window)
                 if kind == _S else KVCacheGroupSpec(kind, block_size * mult)
                 for i, (kind, mult) in enumerate(layout))


def _mamba_dcp_groups(profile: str, groups: tuple[KVCacheGroupSpec, ...], block_size: int,
                      draw: int, wanted: set[str]) -> tuple[KVCacheGroupSpec, ...] | None:
    """A caching-on Mamba layout under DCP (vLLM 0.33, both sides declaring ``mamba_dcp`` and
    ``fine_grained_hits``: a Mamba block at the hash block has fine-grained hits under DCP):
    the drawn one when vLLM 0.33's hybrid coordinator takes it under DCP (full attention and
    Mamba only) and it has no prefill checkpoint, as a new tuple (so ``spec_fields`` drops
    the drawn retention interval, as for any DCP layout); else one of ``_DCP_MAMBA_LAYOUTS_ON``
    in every other draw. None: draw a ``_DCP_LAYOUTS_ON_*`` layout instead (always so for an
    implementation not declaring both)."""
    if profile == "vllm-0.10" or not {"mamba_dcp", "fine_grained_hits"} <= wanted:
        return None
    if any(g.kind == _M for g in groups) and not any(
            g.kind not in (_F, _M) or g.num_prefill_checkpoint_blocks
            or g.prefill_checkpoint_alignment is not None for g in groups):
        return (*groups,)  # a new tuple, not ``groups``: the retention interval is dropped
    if draw % 2 == 0:
        return None
    layout = _DCP_MAMBA_LAYOUTS_ON[(draw // 2) % len(_DCP_MAMBA_LAYOUTS_ON)]
    # Mode "align" (caching on); one speculative block in every other draw.
    return tuple(KVCacheGroupSpec(kind, block_size * mult, mamba_cache_mode="align",
                                  num_speculative_blocks=(draw // 7 + i) % 2)
                 if kind == _M else KVCacheGroupSpec(kind, block_size * mult)
                 for i, (kind, mult) in enumerate(layout))
