"""Batch metadata: what a worker builds from one scheduler step before the forward pass.

Given each scheduled request's block-table row, its computed-token count (already in the KV
cache) and its scheduled-token count (computed in this step), vLLM's model runner lays the
step's tokens out request by request and derives, per token ``i``:

    req_indices[i]  = the request (block-table row) token i belongs to
    positions[i]    = num_computed_tokens[req] + (i - query_start_loc[req])   # absolute
    slot_mapping[i] = where token i's K/V is written (``compute_slot_mapping``)

``slot_mapping`` is padded with ``PAD_SLOT_ID`` (-1) up to the padded batch size (the CUDA-graph
size ``num_padded_tokens``): KV-store kernels skip negative slots, so padding tokens write
nothing. A padding of 0 would instead overwrite slot 0 of the null block, and a real block's
first slot in a design without a null block.

Decode context parallelism (DCP, world size W, this rank's ``dcp_rank``, interleave size I):
position ``p`` is stored on rank ``(p // I) % W`` only; a block-table entry covers a virtual
block of ``block_size * W`` positions, of which each rank stores ``block_size``. Tokens stored
on another rank get ``PAD_SLOT_ID`` (see ``block_table.compute_slot_mapping``).

``req_to_token`` is SGLang's per-token form of the same table: row ``b`` holds the flat slot of
every position ``< seq_lens[b]`` (one rank, no DCP).

Sources: docs/semantics.md#slot-mapping; vLLM 0.33 ``v1/worker/block_table.py`` and
``gpu_model_runner._prepare_inputs`` (0.10.2: the same numpy arithmetic, DCP interleave 1 only,
the model runner filling the padding with -1); SGLang ``ReqToTokenPool``. An independent
numpy re-implementation, not vLLM's code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvcheck.reference_impl.block_table import (
    PAD_SLOT_ID,
    BlockTableRows,
    as_block_table,
    as_int_1d,
    check_dcp,
    compute_slot_mapping,
)
from kvcheck.reference_impl.errors import KVCacheMisuseError

__all__ = ["PAD_SLOT_ID", "BatchMetadata", "build_batch", "dcp_owner_rank", "req_to_token"]


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One step's per-token metadata (``build_batch``).

    Attributes:
        slot_mapping: int64 ``[num_padded_tokens]``; ``PAD_SLOT_ID`` for padding and for
            tokens stored on another DCP rank.
        positions: int64 ``[num_tokens]``, absolute position of each token in its request.
        req_indices: int64 ``[num_tokens]``, the block-table row of each token.
        query_start_loc: int64 ``[num_reqs + 1]``, token range of each request.
        seq_lens: int64 ``[num_reqs]``, ``num_computed_tokens + num_scheduled_tokens``.
    """

    slot_mapping: np.ndarray
    positions: np.ndarray
    req_indices: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray


def _non_negative(name: str, values: npt.ArrayLike) -> np.ndarray:
    arr = as_int_1d(name, values)
    if arr.size and arr.min() < 0:
        i = int(np.argmax(arr < 0))
        raise KVCacheMisuseError(f"{name}[{i}] = {int(arr[i])} is negative")
    return arr


def build_batch(
    block_table_rows: BlockTableRows,
    num_computed_tokens: npt.ArrayLike,
    num_scheduled_tokens: npt.ArrayLike,
    block_size: int,
    num_padded_tokens: int | None = None,
    *,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
    cp_kv_cache_interleave_size: int = 1,
) -> BatchMetadata:
    """Slot mapping, positions and request indices of one step (vLLM 0.33 semantics).

    Args:
        block_table_rows: int ``[num_rows, width]`` array or ragged rows of physical block ids;
            row ``r`` is request ``r``'s table (``num_rows >= num_reqs``). With DCP an entry
            covers ``block_size * dcp_world_size`` positions.
        num_computed_tokens: ``[num_reqs]`` int ``>= 0``, tokens already in the KV cache.
        num_scheduled_tokens: ``[num_reqs]`` int ``>= 0``, tokens computed in this step.
        block_size: tokens per physical block on one rank (``>= 1``).
        num_padded_tokens: length of ``slot_mapping`` (the padded batch size,
            ``>= num_tokens``); None: ``num_tokens`` (no padding).
        dcp_world_size, dcp_rank, cp_kv_cache_interleave_size: decode context parallelism;
            the interleave size must divide ``block_size``.

    Returns:
        A ``BatchMetadata`` (see its attributes).

    Raises:
        KVCacheMisuseError: mismatched lengths, negative counts, more requests than rows, a
            position past its row's blocks, ``num_padded_tokens < num_tokens``, or bad DCP
            parameters.

    Example:
        Rows ``[7, 3, 9]`` and ``[5, 2]``, ``block_size`` 4; request 0 has 0 tokens computed
        and 5 scheduled, request 1 has 4 computed and 3 scheduled; padded to 10:

        >>> b = build_batch([[7, 3, 9], [5, 2]], [0, 4], [5, 3], 4, 10)
        >>> b.slot_mapping.tolist()
        [28, 29, 30, 31, 12, 8, 9, 10, -1, -1]
        >>> b.positions.tolist(), b.req_indices.tolist()
        ([0, 1, 2, 3, 4, 4, 5, 6], [0, 0, 0, 0, 0, 1, 1, 1])

        The same on rank 1 of two DCP ranks (virtual blocks of 8; odd positions on rank 1):

        >>> build_batch([[7, 3, 9], [5, 2]], [0, 4], [5, 3], 4, 10, dcp_world_size=2,
        ...             dcp_rank=1).slot_mapping.tolist()
        [-1, 28, -1, 29, -1, -1, 22, -1, -1, -1]
    """
    check_dcp(block_size, dcp_world_size, dcp_rank, cp_kv_cache_interleave_size)
    computed = _non_negative("num_computed_tokens", num_computed_tokens)
    scheduled = _non_negative("num_scheduled_tokens", num_scheduled_tokens)
    if computed.size != scheduled.size:
        raise KVCacheMisuseError(
            f"num_computed_tokens has {computed.size} entries, num_scheduled_tokens has "
            f"{scheduled.size}")
    num_reqs = computed.size
    table, num_blocks = as_block_table(block_table_rows)
    if num_reqs > table.shape[0]:
        raise KVCacheMisuseError(
            f"{num_reqs} requests but the block table has {table.shape[0]} rows")
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int64)
    np.cumsum(scheduled, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    padded = num_tokens if num_padded_tokens is None else num_padded_tokens
    if padded < num_tokens:
        raise KVCacheMisuseError(
            f"num_padded_tokens={padded} is less than the {num_tokens} scheduled tokens")
    # E.g. scheduled [2, 3] -> req_indices [0, 0, 1, 1, 1], offsets [0, 1, 0, 1, 2].
    req_indices = np.repeat(np.arange(num_reqs, dtype=np.int64), scheduled)
    offsets = np.arange(num_tokens, dtype=np.int64) - query_start_loc[req_indices]
    positions = computed[req_indices] + offsets
    slot_mapping = compute_slot_mapping(
        table[:num_reqs], block_size, query_start_loc, positions,
        max_num_batched_tokens=padded, num_blocks_per_row=num_blocks[:num_reqs],
        dcp_world_size=dcp_world_size, dcp_rank=dcp_rank,
        cp_kv_cache_interleave_size=cp_kv_cache_interleave_size,
    )
    return BatchMetadata(slot_mapping, positions, req_indices, query_start_loc,
                         computed + scheduled)


def dcp_owner_rank(
    positions: npt.ArrayLike, dcp_world_size: int, cp_kv_cache_interleave_size: int = 1
) -> np.ndarray:
    """The DCP rank that stores each position: ``(pos // I) % W`` (chunks of ``I`` positions
    dealt round-robin over the ``W`` ranks).

    Example:
        >>> dcp_owner_rank([0, 1, 2, 3, 4, 5], 2, 2).tolist()
        [0, 0, 1, 1, 0, 0]
    """
    if dcp_world_size < 1 or cp_kv_cache_interleave_size < 1:
        raise KVCacheMisuseError(
            f"dcp_world_size={dcp_world_size} and cp_kv_cache_interleave_size="
            f"{cp_kv_cache_interleave_size} must be >= 1")
    pos = _non_negative("positions", positions)
    ranks: np.ndarray = (pos // cp_kv_cache_interleave_size) % dcp_world_size
    return ranks


def req_to_token(
    block_table_rows: BlockTableRows,
    seq_lens: npt.ArrayLike,
    block_size: int,
    max_context_len: int | None = None,
) -> np.ndarray:
    """vLLM block table -> SGLang ``req_to_token``: the flat slot of every position.

    ``req_to_token[b, pos] = row_b[pos // P] * P + pos % P`` for ``pos < seq_lens[b]``, 0 (as
    in SGLang's zero-initialised pool) from ``seq_lens[b]`` on.

    Args:
        block_table_rows: int ``[num_rows, width]`` or ragged rows, ``num_rows >= B``.
        seq_lens: ``[B]`` int ``>= 0``.
        block_size: ``P``.
        max_context_len: the row length; None: ``max(seq_lens)``.

    Returns:
        int32 ``[B, max_context_len]``.

    Raises:
        KVCacheMisuseError: a row too short for its ``seq_len``, a slot outside int32, or
            ``max_context_len < max(seq_lens)``.

    Example:
        >>> req_to_token([[7, 3], [5]], [6, 3], 4).tolist()
        [[28, 29, 30, 31, 12, 13], [20, 21, 22, 0, 0, 0]]
    """
    lens = _non_negative("seq_lens", seq_lens)
    width = int(lens.max()) if lens.size else 0
    if max_context_len is not None:
        if max_context_len < width:
            raise KVCacheMisuseError(
                f"max_context_len={max_context_len} < the longest seq_len {width}")
        width = max_context_len
    table, num_blocks = as_block_table(block_table_rows)
    out = np.zeros((lens.size, width), dtype=np.int64)
    if lens.size:
        # One request per row of the table: a "batch" whose tokens are all positions.
        qsl = np.zeros(lens.size + 1, dtype=np.int64)
        np.cumsum(lens, out=qsl[1:])
        req = np.repeat(np.arange(lens.size, dtype=np.int64), lens)
        pos = np.arange(int(qsl[-1]), dtype=np.int64) - qsl[req]
        if lens.size > table.shape[0]:
            raise KVCacheMisuseError(
                f"{lens.size} seq_lens but the block table has {table.shape[0]} rows")
        slots = compute_slot_mapping(table[: lens.size], block_size, qsl, pos,
                                     num_blocks_per_row=num_blocks[: lens.size])
        out[req, pos] = slots
    if out.size and out.max() > np.iinfo(np.int32).max:
        raise KVCacheMisuseError(f"slot {int(out.max())} does not fit int32 (req_to_token)")
    return out.astype(np.int32)
