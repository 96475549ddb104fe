"""Worker-side ``BlockTable`` and ``slot_mapping``: vLLM V1 semantics (0.33, with 0.10.2 variant).

A block table row lists the physical ``block_id``s of one request in logical order: row entry
``block_idx`` holds the KV of positions ``[block_idx * V, (block_idx + 1) * V)`` where
``V = block_size * dcp_world_size`` (``V == block_size`` without decode context parallelism).
``slot_mapping`` turns every scheduled token into a flat slot of the paged KV cache:

    slot = block_id * block_size + block_offset          (int64; PAD_SLOT_ID = -1 = "skip")

Key invariant: with one rank (W = 1), ``slot_mapping[i] == row[pos // block_size] * block_size +
pos % block_size`` for each real token ``i``, and every entry from ``num_tokens`` up to
``max_num_batched_tokens`` is ``PAD_SLOT_ID`` (CUDA-graph padding). With W > 1 every position is
local on exactly one rank; the other ranks see ``PAD_SLOT_ID`` for it.

Sources: docs/semantics.md#slot-mapping (vLLM 0.33 ``v1/worker/block_table.py`` and the
0.10.2 numpy variant). This is an independent re-implementation in numpy, not vLLM's code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from kvcheck.reference_impl.errors import KVCacheMisuseError

__all__ = [
    "PAD_SLOT_ID",
    "BlockTable",
    "as_block_table",
    "as_int_1d",
    "check_dcp",
    "check_offsets",
    "compute_slot_mapping",
    "compute_slot_mapping_v0_10",
    "slot_mapping_for_request",
]

#: Slot id of a padding / non-local token; KV-store kernels skip negative slots.
PAD_SLOT_ID = -1

# Block tables are int32 on the device, so a block id must fit in int32.
_INT32_MAX = np.iinfo(np.int32).max

# A 2-D int array [num_rows, width], or an iterable of 1-D int rows (ragged: zero-padded).
BlockTableRows: TypeAlias = np.ndarray | Iterable[npt.ArrayLike]


# --------------------------------------------------------------------------------------------
# Input normalisation and validation helpers
# --------------------------------------------------------------------------------------------


def as_int_1d(name: str, values: npt.ArrayLike) -> np.ndarray:
    """``values`` as a 1-D int64 array; KVCacheMisuseError when not 1-D integers."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise KVCacheMisuseError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        # np.asarray([]) is float64; an empty input is fine whatever its dtype.
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise KVCacheMisuseError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def check_offsets(name: str, offsets: np.ndarray, count: str) -> np.ndarray:
    """Validate a prefix-sum array (``query_start_loc``, ``kv_indptr``): at least one entry,
    starts at 0, non-decreasing. Returns the per-entry lengths ``np.diff(offsets)``."""
    if offsets.size == 0:
        raise KVCacheMisuseError(f"{name} must have {count} >= 1 entries")
    if offsets[0] != 0:
        raise KVCacheMisuseError(f"{name}[0] must be 0, got {int(offsets[0])}")
    lengths = np.diff(offsets)
    if lengths.size and lengths.min() < 0:
        i = int(np.argmax(lengths < 0))
        raise KVCacheMisuseError(
            f"{name} must be non-decreasing: {name}[{i}]={int(offsets[i])} > "
            f"{name}[{i + 1}]={int(offsets[i + 1])}"
        )
    return lengths


def as_block_table(block_table_rows: BlockTableRows) -> tuple[np.ndarray, np.ndarray]:
    """Normalise block table rows.

    Returns ``(table, num_blocks)``: ``table`` int ``[num_rows, width]`` and ``num_blocks``
    int64 ``[num_rows]``, the number of valid entries per row. A 2-D array counts every column
    as valid (like vLLM's dense table); a ragged sequence of rows is zero-padded (0 is the null
    block) and only each row's own length is valid.
    """
    if isinstance(block_table_rows, np.ndarray):
        if block_table_rows.ndim != 2:
            raise KVCacheMisuseError(
                f"block_table_rows must be 2-D [num_rows, width], got shape "
                f"{block_table_rows.shape}"
            )
        if block_table_rows.size and block_table_rows.dtype.kind not in "iu":
            raise KVCacheMisuseError(
                f"block_table_rows must hold integers, got dtype {block_table_rows.dtype}"
            )
        # No dtype conversion of the whole table: only the gathered entries are widened, which
        # keeps the per-step cost proportional to num_tokens, not to the table size.
        table = np.ascontiguousarray(block_table_rows)
        return table, np.full(table.shape[0], table.shape[1], dtype=np.int64)
    rows = [np.asarray(row) for row in block_table_rows]
    num_blocks = np.array([row.size for row in rows], dtype=np.int64)
    width = int(num_blocks.max()) if rows else 0
    table = np.zeros((len(rows), width), dtype=np.int64)
    for row_idx, row in enumerate(rows):
        if row.ndim != 1:
            raise KVCacheMisuseError(
                f"block table row {row_idx} must be 1-D, got shape {row.shape}")
        if row.size and row.dtype.kind not in "iu":
            raise KVCacheMisuseError(
                f"block table row {row_idx} must hold integers, got {row.dtype}")
        table[row_idx, : row.size] = row
    return table, num_blocks


def check_dcp(block_size: int, dcp_world_size: int, dcp_rank: int, interleave: int) -> None:
    """Refuse impossible decode-context-parallel arguments (KVCacheMisuseError naming the
    argument): a block size, world size or interleave below 1, a rank outside the world."""
    if block_size < 1:
        raise KVCacheMisuseError(f"block_size must be >= 1, got {block_size}")
    if dcp_world_size < 1:
        raise KVCacheMisuseError(f"dcp_world_size must be >= 1, got {dcp_world_size}")
    if not 0 <= dcp_rank < dcp_world_size:
        raise KVCacheMisuseError(
            f"dcp_rank must be in [0, dcp_world_size={dcp_world_size}), got {dcp_rank}"
        )
    if interleave < 1:
        raise KVCacheMisuseError(f"cp_kv_cache_interleave_size must be >= 1, got {interleave}")
    # Why: local_off = (vo // (W*I))*I + vo % I stays below block_size for every vo < bs*W only
    # when I divides block_size; otherwise a rank's tokens spill into the next physical block.
    if block_size % interleave != 0:
        raise KVCacheMisuseError(
            f"cp_kv_cache_interleave_size={interleave} must divide block_size={block_size}"
        )


def _gather_block_ids(
    table: np.ndarray,
    num_blocks: np.ndarray,
    req_indices: np.ndarray,
    positions: np.ndarray,
    block_idx: np.ndarray,
    virtual_block_size: int,
) -> np.ndarray:
    """``table[req_indices, block_idx]`` after checking each ``block_idx`` is inside its row."""
    if block_idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    limit = num_blocks[req_indices]
    bad = block_idx >= limit
    if bad.any():
        i = int(np.argmax(bad))
        raise KVCacheMisuseError(
            f"token {i}: position {int(positions[i])} needs block_idx {int(block_idx[i])} "
            f"(= position // {virtual_block_size}) but row {int(req_indices[i])} has only "
            f"{int(limit[i])} blocks"
        )
    # Flat indexing is the cheap form of table[req_indices, block_idx] on a C-contiguous table.
    width = table.shape[1]
    block_ids: np.ndarray = table.reshape(-1)[req_indices * width + block_idx].astype(
        np.int64, copy=False)
    if block_ids.min() < 0:
        i = int(np.argmax(block_ids < 0))
        raise KVCacheMisuseError(
            f"token {i}: row {int(req_indices[i])} has negative block_id {int(block_ids[i])} "
            f"at block_idx {int(block_idx[i])}"
        )
    return block_ids


# --------------------------------------------------------------------------------------------
# slot_mapping (0.33)
# --------------------------------------------------------------------------------------------


def compute_slot_mapping(
    block_table_rows: BlockTableRows,
    block_size: int,
    query_start_loc: npt.ArrayLike,
    positions: npt.ArrayLike,
    *,
    max_num_batched_tokens: int | None = None,
    num_blocks_per_row: npt.ArrayLike | None = None,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
    cp_kv_cache_interleave_size: int = 1,
) -> np.ndarray:
    """Flat KV-cache slot of every scheduled token (vLLM 0.33 ``compute_slot_mapping``).

    Request ``r`` owns tokens ``[query_start_loc[r], query_start_loc[r + 1])``; token ``i`` of
    it sits at absolute position ``positions[i]`` in the request. With ``W = dcp_world_size``,
    ``I = cp_kv_cache_interleave_size`` and ``V = block_size * W``::

        block_idx    = pos // V                       # logical block (row column)
        vo           = pos - block_idx * V            # offset inside the virtual block
        local        = (vo // I) % W == dcp_rank      # chunks of I tokens dealt round-robin
        block_offset = (vo // (W * I)) * I + vo % I   # offset inside this rank's block
        slot         = row[block_idx] * block_size + block_offset   if local else PAD_SLOT_ID

    Args:
        block_table_rows: int ``[num_rows, width]`` array (all ``width`` columns valid) or a
            ragged sequence of rows of physical block ids; ``num_rows >= num_reqs``.
        block_size: tokens per physical block on this rank (``>= 1``).
        query_start_loc: ``[num_reqs + 1]`` int, non-decreasing, starting at 0; the last entry
            is ``num_tokens``.
        positions: ``[num_tokens]`` int, absolute token positions (``>= 0``).
        max_num_batched_tokens: output length; entries ``[num_tokens, max_num_batched_tokens)``
            are ``PAD_SLOT_ID``. ``None`` means no padding (length ``num_tokens``).
        num_blocks_per_row: optional ``[num_rows]`` int, valid entries per row; overrides the
            widths implied by ``block_table_rows``. ``BlockTable`` passes its own counts here.
        dcp_world_size, dcp_rank, cp_kv_cache_interleave_size: decode context parallelism;
            ``I`` must divide ``block_size``.

    Returns:
        ``[max_num_batched_tokens]`` (or ``[num_tokens]``) int64 slots, ``PAD_SLOT_ID`` = -1
        for padding and for tokens stored on another rank.

    Raises:
        KVCacheMisuseError: malformed ``query_start_loc``, a ``positions`` length other than
            ``num_tokens``, a negative position, a position whose ``block_idx`` is past its
            row, a negative block id, ``num_tokens > max_num_batched_tokens``, or bad DCP
            parameters.

    Note:
        vLLM's kernel reads whatever the table holds past a row's valid blocks (0 or stale
        ids); the reference raises instead, because that is always a caller bug.

    Example:
        Rows ``[7, 3, 9]`` and ``[5, 2]``, ``block_size`` 4, two requests of 6 and 3 tokens:

        >>> qsl = [0, 6, 9]
        >>> pos = [0, 1, 2, 3, 4, 9, 4, 5, 6]
        >>> compute_slot_mapping([[7, 3, 9], [5, 2]], 4, qsl, pos,
        ...                      max_num_batched_tokens=12).tolist()
        [28, 29, 30, 31, 12, 37, 8, 9, 10, -1, -1, -1]

        (``9 // 4 = 2`` -> block 9, ``9*4 + 1 = 37``.) With two DCP ranks (virtual block of 8
        tokens, odd offsets on rank 1, local offset ``vo // 2``):

        >>> compute_slot_mapping([[7, 3, 9], [5, 2]], 4, qsl, pos, max_num_batched_tokens=12,
        ...                      dcp_world_size=2, dcp_rank=1).tolist()
        [-1, 28, -1, 29, -1, 12, -1, 22, -1, -1, -1, -1]
    """
    check_dcp(block_size, dcp_world_size, dcp_rank, cp_kv_cache_interleave_size)
    table, num_blocks = as_block_table(block_table_rows)
    if num_blocks_per_row is not None:
        num_blocks = as_int_1d("num_blocks_per_row", num_blocks_per_row)
        if num_blocks.shape[0] != table.shape[0]:
            raise KVCacheMisuseError(
                f"num_blocks_per_row has {num_blocks.shape[0]} entries, block table has "
                f"{table.shape[0]} rows"
            )
        if num_blocks.size and (num_blocks.min() < 0 or num_blocks.max() > table.shape[1]):
            raise KVCacheMisuseError(f"num_blocks_per_row must lie in [0, {table.shape[1]}]")

    qsl = as_int_1d("query_start_loc", query_start_loc)
    query_lens = check_offsets("query_start_loc", qsl, "num_reqs + 1")
    num_reqs = qsl.size - 1
    if num_reqs > table.shape[0]:
        raise KVCacheMisuseError(
            f"{num_reqs} requests but the block table has {table.shape[0]} rows")
    num_tokens = int(qsl[-1])
    if max_num_batched_tokens is not None and num_tokens > max_num_batched_tokens:
        raise KVCacheMisuseError(
            f"num_tokens={num_tokens} exceeds max_num_batched_tokens={max_num_batched_tokens}"
        )

    pos = as_int_1d("positions", positions)
    if pos.size != num_tokens:
        raise KVCacheMisuseError(
            f"positions has {pos.size} entries but query_start_loc[-1] = num_tokens = {num_tokens}"
        )
    if num_tokens and pos.min() < 0:
        i = int(np.argmax(pos < 0))
        raise KVCacheMisuseError(f"positions[{i}] = {int(pos[i])} is negative")

    # Row of every token, the numpy form of "program r handles [qsl[r], qsl[r+1])".
    req_indices = np.repeat(np.arange(num_reqs, dtype=np.int64), query_lens)
    virtual_block_size = block_size * dcp_world_size
    block_idx = pos // virtual_block_size
    block_ids = _gather_block_ids(
        table, num_blocks, req_indices, pos, block_idx, virtual_block_size
    )

    if dcp_world_size == 1:
        slots = block_ids * block_size + (pos - block_idx * block_size)
    else:
        w, i_size = dcp_world_size, cp_kv_cache_interleave_size
        vo = pos - block_idx * virtual_block_size
        is_local = (vo // i_size) % w == dcp_rank
        block_offset = (vo // (w * i_size)) * i_size + vo % i_size
        slots = np.where(is_local, block_ids * block_size + block_offset, PAD_SLOT_ID)

    out_len = num_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    out = np.empty(out_len, dtype=np.int64)
    out[:num_tokens] = slots
    out[num_tokens:] = PAD_SLOT_ID  # CUDA-graph padding: the kernel's last program does this
    return out


def compute_slot_mapping_v0_10(
    block_table_rows: BlockTableRows,
    block_size: int,
    req_indices: npt.ArrayLike,
    positions: npt.ArrayLike,
    *,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
) -> np.ndarray:
    """Slot mapping as vLLM 0.10.2 computes it on the CPU, driven by each token's row.

    ``V = block_size * W``; ``block_idx = pos // V``; ``vo = pos % V``; the token is local iff
    ``vo % W == dcp_rank`` (interleave size 1); ``block_offset = vo // W``;
    ``slot = row[block_idx] * block_size + block_offset``, else ``PAD_SLOT_ID``. With W = 1
    this is ``row[pos // block_size] * block_size + pos % block_size``. It equals the 0.33
    formula with ``cp_kv_cache_interleave_size = 1``.

    Args:
        block_table_rows: int ``[num_rows, width]`` or ragged rows of physical block ids.
        block_size: tokens per physical block on this rank.
        req_indices: ``[num_tokens]`` int, the block-table row of each token.
        positions: ``[num_tokens]`` int, absolute positions (``>= 0``).
        dcp_world_size, dcp_rank: decode context parallelism.

    Returns:
        ``[num_tokens]`` int64 slots. No padding fill: 0.10.2 leaves that to
        ``commit_slot_mapping``'s copy into a larger buffer.

    Note:
        0.10.2 indexes the flattened table with ``req_idx * max_blocks_per_req + block_idx``,
        so a ``block_idx`` past the row silently reads the next row; the reference raises.

    Example:
        >>> compute_slot_mapping_v0_10([[7, 3, 9], [5, 2]], 4, [0, 0, 1], [0, 5, 7]).tolist()
        [28, 13, 11]
    """
    check_dcp(block_size, dcp_world_size, dcp_rank, 1)
    table, num_blocks = as_block_table(block_table_rows)
    req = as_int_1d("req_indices", req_indices)
    pos = as_int_1d("positions", positions)
    if req.size != pos.size:
        raise KVCacheMisuseError(f"req_indices has {req.size} entries, positions has {pos.size}")
    if pos.size == 0:
        return np.zeros(0, dtype=np.int64)
    if req.min() < 0 or req.max() >= table.shape[0]:
        i = int(np.argmax((req < 0) | (req >= table.shape[0])))
        raise KVCacheMisuseError(
            f"req_indices[{i}] = {int(req[i])} is outside [0, {table.shape[0]}) block table rows"
        )
    if pos.min() < 0:
        i = int(np.argmax(pos < 0))
        raise KVCacheMisuseError(f"positions[{i}] = {int(pos[i])} is negative")
    virtual_block_size = block_size * dcp_world_size
    block_idx = pos // virtual_block_size
    block_ids = _gather_block_ids(table, num_blocks, req, pos, block_idx, virtual_block_size)
    vo = pos % virtual_block_size
    slots = block_ids * block_size + vo // dcp_world_size
    if dcp_world_size > 1:
        slots = np.where(vo % dcp_world_size == dcp_rank, slots, PAD_SLOT_ID)
    slot_mapping: np.ndarray = slots.astype(np.int64, copy=False)
    return slot_mapping


def slot_mapping_for_request(
    block_ids: Sequence[int], block_size: int, start: int, end: int
) -> list[int]:
    """Slots of one request's positions ``[start, end)`` (one rank, no DCP).

    ``slot = block_ids[pos // block_size] * block_size + pos % block_size``. This is what the
    conformance suite derives from ``get_block_ids`` for a request.

    Args:
        block_ids: the request's physical block ids in logical order.
        block_size: tokens per block (``>= 1``).
        start, end: token positions, ``0 <= start <= end <= len(block_ids) * block_size``.

    Returns:
        ``end - start`` Python ints.

    Example:
        >>> slot_mapping_for_request([7, 3, 9], 4, 2, 6)
        [30, 31, 12, 13]
    """
    if block_size < 1:
        raise KVCacheMisuseError(f"block_size must be >= 1, got {block_size}")
    capacity = len(block_ids) * block_size
    if not 0 <= start <= end <= capacity:
        raise KVCacheMisuseError(
            f"need 0 <= start <= end <= len(block_ids) * block_size = {capacity}, got "
            f"start={start}, end={end}"
        )
    for block_idx, block_id in enumerate(block_ids):
        if block_id < 0:
            raise KVCacheMisuseError(f"block_ids[{block_idx}] = {block_id} is negative")
    return [
        int(block_ids[pos // block_size]) * block_size + pos % block_size
        for pos in range(start, end)
    ]


# --------------------------------------------------------------------------------------------
# BlockTable
# --------------------------------------------------------------------------------------------


class BlockTable:
    """The worker's dense block table for one KV-cache group (vLLM 0.33 semantics).

    Attributes:
        block_table: int32 ``[max_num_reqs, max_num_blocks_per_req]``; row ``r`` holds the
            physical block ids of the request in batch slot ``r``. 0 (the null block) in
            cleared entries; entries past ``num_blocks_per_row[r]`` are meaningless.
        num_blocks_per_row: int32 ``[max_num_reqs]``, valid entries per row.
        slot_mapping: int64 ``[max_num_batched_tokens]``, the last ``compute_slot_mapping``.

    With DCP (``dcp_world_size > 1``) one row entry covers ``block_size * dcp_world_size``
    positions, of which this rank stores ``block_size``.
    """

    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        *,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_kv_cache_interleave_size: int = 1,
    ) -> None:
        check_dcp(block_size, dcp_world_size, dcp_rank, cp_kv_cache_interleave_size)
        for name, value in (
            ("max_num_reqs", max_num_reqs),
            ("max_num_blocks_per_req", max_num_blocks_per_req),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            if value < 0:
                raise KVCacheMisuseError(f"{name} must be >= 0, got {value}")
        self.block_size = block_size
        self.max_num_reqs = max_num_reqs
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.max_num_batched_tokens = max_num_batched_tokens
        self.dcp_world_size = dcp_world_size
        self.dcp_rank = dcp_rank
        self.cp_kv_cache_interleave_size = cp_kv_cache_interleave_size
        self.block_table = np.zeros((max_num_reqs, max_num_blocks_per_req), dtype=np.int32)
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)
        self.slot_mapping = np.full(max_num_batched_tokens, PAD_SLOT_ID, dtype=np.int64)

    def __repr__(self) -> str:
        return (
            f"BlockTable(block_size={self.block_size}, max_num_reqs={self.max_num_reqs}, "
            f"max_num_blocks_per_req={self.max_num_blocks_per_req}, "
            f"max_num_batched_tokens={self.max_num_batched_tokens}, "
            f"dcp_world_size={self.dcp_world_size}, dcp_rank={self.dcp_rank})"
        )

    # -- row operations ------------------------------------------------------------------------

    def _check_row(self, name: str, row_idx: int) -> None:
        if not 0 <= row_idx < self.max_num_reqs:
            raise KVCacheMisuseError(
                f"{name}={row_idx} out of range [0, max_num_reqs={self.max_num_reqs})")

    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Append physical ``block_ids`` to row ``row_idx`` (after its current blocks)."""
        self._check_row("row_idx", row_idx)
        ids = np.asarray(block_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            return
        if ids.min() < 0 or ids.max() > _INT32_MAX:
            raise KVCacheMisuseError(
                f"row {row_idx}: block ids must lie in [0, 2**31), got {ids.tolist()}")
        start = int(self.num_blocks_per_row[row_idx])
        end = start + ids.size
        if end > self.max_num_blocks_per_req:
            raise KVCacheMisuseError(
                f"row {row_idx} would hold {end} blocks ({start} + {ids.size}) > "
                f"max_num_blocks_per_req={self.max_num_blocks_per_req}"
            )
        self.block_table[row_idx, start:end] = ids
        self.num_blocks_per_row[row_idx] = end

    def add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Replace row ``row_idx`` with ``block_ids`` (a new or resumed request)."""
        self._check_row("row_idx", row_idx)
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        """Empty row ``row_idx``, zeroing its used entries (0 is the null block)."""
        self._check_row("row_idx", row_idx)
        self.block_table[row_idx, : self.num_blocks_per_row[row_idx]] = 0
        self.num_blocks_per_row[row_idx] = 0

    def move_row(self, src: int, tgt: int) -> None:
        """Copy row ``src`` into ``tgt``, then zero ``src`` (batch condensation).

        The vacated row is zeroed so that it points at the null block: 0.33 does this because
        dummy runs may still dereference stale rows (e.g. as Mamba state slots) and write
        through them into blocks that were freed and handed to another request.
        """
        self._check_row("src", src)
        self._check_row("tgt", tgt)
        if src == tgt:
            return
        num_blocks = int(self.num_blocks_per_row[src])
        self.block_table[tgt, :num_blocks] = self.block_table[src, :num_blocks]
        self.num_blocks_per_row[tgt] = num_blocks
        self.block_table[src, :num_blocks] = 0
        self.num_blocks_per_row[src] = 0

    def swap_row(self, src: int, tgt: int) -> None:
        """Exchange rows ``src`` and ``tgt`` (whole rows and their block counts)."""
        self._check_row("src", src)
        self._check_row("tgt", tgt)
        self.num_blocks_per_row[[src, tgt]] = self.num_blocks_per_row[[tgt, src]]
        self.block_table[[src, tgt]] = self.block_table[[tgt, src]]

    def get_row(self, row_idx: int) -> list[int]:
        """The valid block ids of row ``row_idx`` as Python ints."""
        self._check_row("row_idx", row_idx)
        row: list[int] = self.block_table[row_idx, : self.num_blocks_per_row[row_idx]].tolist()
        return row

    # -- slot mapping --------------------------------------------------------------------------

    def compute_slot_mapping(
        self, num_reqs: int, query_start_loc: npt.ArrayLike, positions: npt.ArrayLike
    ) -> np.ndarray:
        """Slot of every scheduled token, padded to ``max_num_batched_tokens``.

        Args:
            num_reqs: requests in the batch; they occupy rows ``[0, num_reqs)``.
            query_start_loc: ``[num_reqs + 1]`` int, token ranges per row (``[0] == 0``).
            positions: ``[num_tokens]`` int, absolute positions of the tokens.

        Returns:
            ``[max_num_batched_tokens]`` int64 (also stored in ``self.slot_mapping``); entries
            from ``num_tokens`` on, and tokens local to another DCP rank, are ``PAD_SLOT_ID``.
            See the module-level ``compute_slot_mapping`` for the formula and errors; a
            position past ``num_blocks_per_row[r]`` blocks is a KVCacheMisuseError.
        """
        if not 0 <= num_reqs <= self.max_num_reqs:
            raise KVCacheMisuseError(
                f"num_reqs={num_reqs} out of range [0, max_num_reqs={self.max_num_reqs}]"
            )
        qsl = np.asarray(query_start_loc)
        if qsl.ndim != 1 or qsl.shape[0] != num_reqs + 1:
            raise KVCacheMisuseError(
                f"query_start_loc must have num_reqs + 1 = {num_reqs + 1} entries, got shape "
                f"{qsl.shape}"
            )
        slots = compute_slot_mapping(
            self.block_table[:num_reqs],
            self.block_size,
            qsl,
            positions,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_blocks_per_row=self.num_blocks_per_row[:num_reqs],
            dcp_world_size=self.dcp_world_size,
            dcp_rank=self.dcp_rank,
            cp_kv_cache_interleave_size=self.cp_kv_cache_interleave_size,
        )
        self.slot_mapping[:] = slots
        return slots
