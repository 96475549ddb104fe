"""Mamba prefill checkpoint blocks and sparse Mamba retention (capability
``mamba_checkpoints``, vLLM 0.33; docs/semantics.md#mamba-prefill-checkpoints).

A Mamba "align" group with ``num_prefill_checkpoint_blocks > 0`` and a
``prefill_checkpoint_alignment`` may export, in the same forward pass as a prefill chunk
``[start, end)``, the state at the chunk's *checkpoint position* ``p`` (the last reusable
boundary before ``end``: ``(end - 1)`` rounded down to the hit alignment, with EAGLE ``end``
rounded down less one alignment unit) into one more block: the entry at index ``cdiv(end,
block_size) - 2`` of the request's table, where a null would be otherwise. vLLM's worker writes
it there (``compute_mamba_prefill_checkpoints``), so that block holds the state after exactly
``p`` tokens, whatever its index, and the manager keys it at ``p``.

``checkpoint_of`` is kvcheck's own statement of when a chunk exports one (vLLM's
``is_mamba_prefill_checkpoint_valid`` and the prefill-end rule), from the spec and the request
alone: the driver records, in the written-content model (``WrittenBlocks.write_state``), that
the block the table holds at that index holds the state at ``p``; the hit-correctness law then
judges every hit on it. An implementation that keys that block at another position, or exports
a checkpoint the rule does not, is caught where a later request hits it.
"""

from __future__ import annotations

import math

from kvcheck.conformance.fine_grained import fine_grained_hits, hash_block_size
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, RequestView

__all__ = ["CAPABILITY", "checkpoint_groups", "checkpoint_of", "checkpoint_position"]

#: The capability that declares the feature (needs ``mamba``).
CAPABILITY = "mamba_checkpoints"


def checkpoint_groups(spec: KVCacheSpec) -> frozenset[int]:
    """The groups that may export prefill checkpoints: Mamba "align" groups with
    ``num_prefill_checkpoint_blocks > 0`` and an alignment, caching on, vLLM 0.33."""
    if spec.profile == "vllm-0.10" or not spec.enable_caching:
        return frozenset()
    return frozenset(g for g, group in enumerate(spec.groups) if _exports(group))


def _exports(group: KVCacheGroupSpec) -> bool:
    return (group.kind == "mamba" and group.mamba_cache_mode == "align"
            and group.num_prefill_checkpoint_blocks > 0
            and group.prefill_checkpoint_alignment is not None)


def checkpoint_position(num_tokens: int, alignment: int, drop_eagle_block: bool,
                        num_hash_lookahead_tokens: int = 0) -> int:
    """The reusable boundary before ``num_tokens`` on the ``alignment`` grid: ``num_tokens -
    max(1, L)`` rounded down (the last token is recomputed for its logits; with hash lookahead
    ``L`` the state's hash needs the ``L`` tokens after it), with EAGLE ``num_tokens`` rounded
    down less one unit (EAGLE recomputes that unit); at least 0."""
    if drop_eagle_block:
        return max(num_tokens // alignment * alignment - alignment, 0)
    return max((num_tokens - max(1, num_hash_lookahead_tokens)) // alignment * alignment, 0)


def checkpoint_of(spec: KVCacheSpec, group: int, view: RequestView, start: int,
                  end: int) -> tuple[int, int] | None:
    """``(position, table index)`` of the checkpoint the chunk ``[start, end)`` of ``view``
    exports in group ``group`` (None: none). The position is on the hit alignment (the hash
    block with fine-grained hits, else the scheduler block, the groups' lcm); the chunk must
    reach the prefill end (``max(num_prompt_tokens, num_tokens - 1)``) under
    ``prefix_cache_retention_interval == 0``, start on a hash block, leave the checkpoint's
    index ``cdiv(end, bs) - 2`` past the initial state's ``(start - 1) // bs``, hold the
    position strictly inside, at least one hash block after ``start``, and on the
    ``prefill_checkpoint_alignment`` grid from ``start``."""
    g = spec.groups[group]
    if not _exports(g) or spec.profile == "vllm-0.10" or not spec.enable_caching:
        return None
    bs = spec.group_block_size(group)
    hashed = hash_block_size(spec)
    alignment = hashed if fine_grained_hits(spec) else math.lcm(
        *(spec.group_block_size(i) for i in range(len(spec.groups))))
    position = checkpoint_position(end, alignment, spec.use_eagle,
                                   spec.num_hash_lookahead_tokens)
    if position <= 0:
        return None
    if spec.prefix_cache_retention_interval == 0 and end < max(
            len(view.prompt_token_ids), view.num_tokens - 1):
        return None
    index = -(-end // bs) - 2
    step = g.prefill_checkpoint_alignment
    assert step is not None
    if not (start % hashed == 0 and index > (start - 1) // bs and index >= 0
            and start + hashed <= position and start < position < end
            and (position - start) % step == 0):
        return None
    return position, index
