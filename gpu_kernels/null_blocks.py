"""Per-group block tables with null padding: what a sliding-window KV-cache group hands a kernel.

With hybrid KV-cache groups (docs/semantics.md#skipped-tokens-and-null-blocks) every group has its
own block table
over **one shared pool** of block ids, and block id 0 is the *null block*. A sliding-window
group's manager replaces the blocks its window has left behind by the null block
(``remove_skipped_blocks``), so its table reads e.g. ``[0, 0, 0, 10, 11]`` where the
full-attention group's table of the same request reads ``[1, 2, 3, 4, 5]``. Kernels and the
K/V store must therefore never read or write through a null entry:

* attention with ``sliding_window=W`` reads nothing before ``first_key_position`` (the first new
  token's window), which is exactly where the null entries end;
* ``slot_mapping_from_block_table`` gives ``PAD_SLOT_ID`` to a token whose block is null, so the
  store never writes block 0.

These helpers are torch-side (host loops over small tables): they build test inputs and state the
contract; a serving engine computes the same on its own.
"""

from __future__ import annotations

from itertools import pairwise

import torch

from kvcheck.errors import KVCheckInputError
from kvcheck.gpu_kernels.layout import PAD_SLOT_ID
from kvcheck.gpu_kernels.reference import first_key_position

__all__ = [
    "NULL_BLOCK_ID",
    "first_key_position",
    "null_pad_block_table",
    "num_skipped_tokens",
    "slot_mapping_from_block_table",
]

#: The null block's id (vLLM ``BlockPool.null_block``, always block 0 of the pool).
NULL_BLOCK_ID = 0


def num_skipped_tokens(num_computed_tokens: int, sliding_window: int) -> int:
    """vLLM 0.33 ``SlidingWindowManager.get_num_skipped_tokens``: ``max(0, n - W + 1)``.

    The tokens before the window of the next token (position ``n``); e.g. ``W = 4``, ``n = 10``:
    6, so with block size 2 blocks 0..2 are null (docs/semantics.md#skipped-tokens-and-null-blocks,
    G1).
    """
    if sliding_window < 1:
        raise KVCheckInputError(f"sliding_window must be >= 1, got {sliding_window}")
    if num_computed_tokens < 0:
        raise KVCheckInputError(f"num_computed_tokens must be >= 0, got {num_computed_tokens}")
    return max(0, num_computed_tokens - sliding_window + 1)


def _lens(seq_lens: torch.Tensor | list[int], name: str) -> list[int]:
    values = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else list(seq_lens)
    if any(v < 0 for v in values):
        raise KVCheckInputError(f"{name} must be >= 0, got {values}")
    return [int(v) for v in values]


def null_pad_block_table(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor | list[int],
    query_lens: torch.Tensor | list[int] | None,
    block_size: int,
    sliding_window: int,
) -> torch.Tensor:
    """A copy of ``block_table`` where each row's skipped blocks are the null block.

    Row ``s`` has ``context = seq_lens[s] - query_lens[s]`` computed tokens (decode when
    ``query_lens is None``: one new token); entries ``[0, num_skipped_tokens(context, W) //
    block_size)`` become ``NULL_BLOCK_ID``, as ``remove_skipped_blocks`` leaves them before the
    step's forward pass. E.g. ``W = 4``, block size 2, a 10-token context: entries 0..2.

    Raises:
        KVCheckInputError: mismatched lengths, a query longer than its sequence, a bad size.
    """
    if block_size < 1:
        raise KVCheckInputError(f"block_size must be >= 1, got {block_size}")
    lens = _lens(seq_lens, "seq_lens")
    qlens = [1] * len(lens) if query_lens is None else _lens(query_lens, "query_lens")
    if len(qlens) != len(lens) or block_table.dim() != 2 or block_table.shape[0] < len(lens):
        raise KVCheckInputError(
            f"need a [num_seqs, width] block_table and one query_len per seq_len; got table "
            f"{tuple(block_table.shape)}, {len(lens)} seq_lens, {len(qlens)} query_lens"
        )
    out = block_table.clone()
    for seq, (seq_len, query_len) in enumerate(zip(lens, qlens, strict=True)):
        if query_len > seq_len:
            raise KVCheckInputError(f"seq {seq}: query_len {query_len} > seq_len {seq_len}")
        skipped = num_skipped_tokens(seq_len - query_len, sliding_window) // block_size
        out[seq, :skipped] = NULL_BLOCK_ID
    return out


def slot_mapping_from_block_table(
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor | list[int],
    seq_lens: torch.Tensor | list[int],
    block_size: int,
    *,
    num_slots: int | None = None,
) -> torch.Tensor:
    """Flat cache slot of every new token, through a (possibly null-padded) block table.

    Sequence ``s`` owns tokens ``[query_start_loc[s], query_start_loc[s + 1])`` at positions
    ``seq_len - query_len + i``; the token at position ``p`` maps to ``block_table[s, p //
    block_size] * block_size + p % block_size``, or to ``PAD_SLOT_ID`` (-1) when that entry is
    the null block (the window skipped it: nothing may be written to block 0). Entries from
    ``query_start_loc[-1]`` to ``num_slots`` (CUDA-graph padding) are ``PAD_SLOT_ID`` too.

    Returns ``[num_slots or num_tokens]`` int64 on ``block_table``'s device.

    Raises:
        KVCheckInputError: malformed ``query_start_loc``, a query longer than its sequence, a
            position past the table's width, or ``num_slots`` below the token count.
    """
    qsl = _lens(query_start_loc, "query_start_loc")
    lens = _lens(seq_lens, "seq_lens")
    if len(qsl) != len(lens) + 1 or qsl[0] != 0 or any(b < a for a, b in pairwise(qsl)):
        raise KVCheckInputError(
            f"query_start_loc must be non-decreasing from 0 with num_seqs + 1 entries, got {qsl}")
    num_tokens = qsl[-1]
    width = num_tokens if num_slots is None else num_slots
    if width < num_tokens:
        raise KVCheckInputError(f"num_slots={num_slots} < {num_tokens} tokens")
    table = block_table.tolist()
    slots = [PAD_SLOT_ID] * width
    for seq, seq_len in enumerate(lens):
        query_len = qsl[seq + 1] - qsl[seq]
        if query_len > seq_len:
            raise KVCheckInputError(f"seq {seq}: query_len {query_len} > seq_len {seq_len}")
        for i in range(query_len):
            pos = seq_len - query_len + i
            if pos // block_size >= len(table[seq]):
                raise KVCheckInputError(
                    f"seq {seq}: position {pos} needs block-table column {pos // block_size}, "
                    f"the table has {len(table[seq])}")
            block_id = table[seq][pos // block_size]
            if block_id != NULL_BLOCK_ID:
                slots[qsl[seq] + i] = block_id * block_size + pos % block_size
    return torch.tensor(slots, dtype=torch.int64, device=block_table.device)
