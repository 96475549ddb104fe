"""Converters between KV index formats: vLLM dense block table, FlashInfer CSR, SGLang req_to_token.

All three describe the same thing, which physical block (FlashInfer/SGLang: *page*; here
page == block and ``page_size == block_size``) holds each logical position of each request:

- vLLM: ``block_table[B, M]`` int32 plus ``seq_lens[B]``;
  ``slot = block_table[b, pos // P] * P + pos % P``.
- FlashInfer CSR: ``kv_indptr[B + 1]``, ``kv_indices[kv_indptr[-1]]`` (the rows' used prefixes
  concatenated) and ``kv_last_page_len[B]``, all int32, with
  ``seq_len = P * (num_pages - 1) + last_page_len`` and ``0 < last_page_len <= P``.
- SGLang: ``req_to_token[pool_size, max_context_len]`` of flat token slots, one per position.

Key invariant (the conformance cross-check): for every token ``(b, pos)``
``kv_indices[kv_indptr[b] + pos // P] * P + pos % P == block_table[b, pos // P] * P + pos % P``
``== slot_mapping[i]``. Sources: ``peer-systems.md`` sections 1.1 and 2.1-2.3.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvcheck.reference_impl.block_table import (
    BlockTableRows,
    as_block_table,
    as_int_1d,
    check_offsets,
)
from kvcheck.reference_impl.errors import KVCacheMisuseError

__all__ = [
    "block_table_from_sglang_req_to_token",
    "from_flashinfer_csr",
    "slot_from_csr",
    "to_flashinfer_csr",
]

# FlashInfer requires int32 index arrays ("int64 can cause indexing errors"), so every id and
# every offset into kv_indices must stay below 2**31.
_INT32_LIMIT = 2**31


def _check_block_size(block_size: int) -> None:
    if block_size < 1:
        raise KVCacheMisuseError(f"block_size must be >= 1, got {block_size}")


def _check_int32_ids(name: str, ids: np.ndarray) -> None:
    """KVCacheMisuseError unless every entry of ``ids`` lies in ``[0, 2**31)``."""
    if ids.size == 0:
        return
    bad = (ids < 0) | (ids >= _INT32_LIMIT)
    if bad.any():
        i = int(np.argmax(bad.reshape(-1)))
        raise KVCacheMisuseError(
            f"{name}: entry {i} = {int(ids.reshape(-1)[i])} is outside [0, 2**31) "
            f"(index arrays are int32)"
        )


def to_flashinfer_csr(
    block_table_rows: BlockTableRows, seq_lens: npt.ArrayLike, block_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """vLLM block table + ``seq_lens`` -> FlashInfer CSR page table.

    ``num_pages[b] = ceil(seq_lens[b] / P)``; ``kv_indptr = [0, cumsum(num_pages)]``;
    ``kv_indices = concat(block_table[b, :num_pages[b]])``;
    ``kv_last_page_len = seq_lens - (num_pages - 1) * P``.

    Args:
        block_table_rows: int ``[num_rows, width]`` or ragged rows of physical block ids,
            ``num_rows >= B``; only rows ``[0, B)`` and their first ``num_pages`` entries are read.
        seq_lens: ``[B]`` int, tokens per request (``>= 1``).
        block_size: tokens per block/page ``P``.

    Returns:
        ``(kv_indptr [B + 1], kv_indices [kv_indptr[-1]], kv_last_page_len [B])``, all int32.

    Raises:
        KVCacheMisuseError: ``seq_lens[b] == 0``: FlashInfer's CSR cannot express an empty sequence,
            because ``last_page_len`` must satisfy ``0 < last <= P`` (0 pages would make
            ``seq_len = P * (0 - 1) + last`` negative, and 1 page with last 0 is rejected by
            its kernels; old vLLM silently mapped it to ``last = P``, i.e. a phantom page).
            Also a row too short for its ``seq_len``, or ids/offsets outside int32.

    Example:
        FlashInfer's own smoke test: ``seq_lens [45, 8, 25, 22]``, ``P = 16``, pages
        ``[3, 1, 2, 2]``, ``45 = (3 - 1) * 16 + 13``:

        >>> rows = [[4, 9, 1], [7], [2, 5], [8, 3]]
        >>> indptr, indices, last = to_flashinfer_csr(rows, [45, 8, 25, 22], 16)
        >>> indptr.tolist(), indices.tolist(), last.tolist()
        ([0, 3, 4, 6, 8], [4, 9, 1, 7, 2, 5, 8, 3], [13, 8, 9, 6])
    """
    _check_block_size(block_size)
    table, num_blocks = as_block_table(block_table_rows)
    lens = as_int_1d("seq_lens", seq_lens)
    batch_size = lens.size
    if batch_size > table.shape[0]:
        raise KVCacheMisuseError(
            f"{batch_size} seq_lens but the block table has {table.shape[0]} rows")
    if batch_size and lens.min() <= 0:
        b = int(np.argmax(lens <= 0))
        raise KVCacheMisuseError(
            f"seq_lens[{b}] = {int(lens[b])}: FlashInfer's CSR needs seq_len >= 1 "
            f"(0 < kv_last_page_len <= block_size)"
        )
    num_pages = -(-lens // block_size)  # ceil without floats
    too_short = num_pages > num_blocks[:batch_size]
    if too_short.any():
        b = int(np.argmax(too_short))
        raise KVCacheMisuseError(
            f"request {b}: seq_len {int(lens[b])} needs {int(num_pages[b])} blocks of "
            f"{block_size} but its row has {int(num_blocks[b])}"
        )
    kv_indptr = np.zeros(batch_size + 1, dtype=np.int64)
    np.cumsum(num_pages, out=kv_indptr[1:])
    if kv_indptr[-1] >= _INT32_LIMIT:
        raise KVCacheMisuseError(f"kv_indptr[-1] = {int(kv_indptr[-1])} does not fit int32")
    # Row-major boolean selection concatenates each row's used prefix in batch order.
    used = np.arange(table.shape[1])[None, :] < num_pages[:, None]
    kv_indices = table[:batch_size][used]
    _check_int32_ids("kv_indices", kv_indices)
    kv_last_page_len = lens - (num_pages - 1) * block_size
    return (
        kv_indptr.astype(np.int32),
        kv_indices.astype(np.int32),
        kv_last_page_len.astype(np.int32),
    )


def _check_indptr(kv_indptr: np.ndarray, num_indices: int) -> np.ndarray:
    """Validate a CSR ``kv_indptr`` against ``len(kv_indices)``; returns the page counts."""
    num_pages = check_offsets("kv_indptr", kv_indptr, "B + 1")
    if kv_indptr[-1] > num_indices:
        raise KVCacheMisuseError(
            f"kv_indptr[-1] = {int(kv_indptr[-1])} exceeds len(kv_indices) = {num_indices}"
        )
    return num_pages


def from_flashinfer_csr(
    kv_indptr: npt.ArrayLike,
    kv_indices: npt.ArrayLike,
    kv_last_page_len: npt.ArrayLike,
    block_size: int,
    *,
    pad_block_id: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """FlashInfer CSR page table -> vLLM dense block table + ``seq_lens``.

    ``block_table[b, j] = kv_indices[kv_indptr[b] + j]`` for ``j < num_pages[b]``, the rest
    ``pad_block_id`` (0 = vLLM's null block; ``seq_lens`` masks it anyway);
    ``seq_lens[b] = (num_pages[b] - 1) * P + kv_last_page_len[b]``.

    Args:
        kv_indptr: ``[B + 1]`` int, non-decreasing from 0.
        kv_indices: ``[>= kv_indptr[-1]]`` int page ids (a longer, preallocated buffer is
            allowed; the tail is ignored).
        kv_last_page_len: ``[B]`` int, each in ``[1, P]``.
        block_size: ``P``.
        pad_block_id: value of unused table entries.

    Returns:
        ``(block_table [B, max(num_pages)] int32, seq_lens [B] int32)``.

    Raises:
        KVCacheMisuseError: malformed ``kv_indptr``, a request with 0 pages, a ``last_page_len``
            outside ``[1, P]``, or ids outside int32.
    """
    _check_block_size(block_size)
    indptr = as_int_1d("kv_indptr", kv_indptr)
    indices = as_int_1d("kv_indices", kv_indices)
    last = as_int_1d("kv_last_page_len", kv_last_page_len)
    num_pages = _check_indptr(indptr, indices.size)
    batch_size = num_pages.size
    if last.size != batch_size:
        raise KVCacheMisuseError(
            f"kv_last_page_len has {last.size} entries, kv_indptr describes {batch_size} requests"
        )
    if batch_size and num_pages.min() < 1:
        b = int(np.argmax(num_pages < 1))
        raise KVCacheMisuseError(
            f"request {b} has 0 pages; FlashInfer's CSR needs >= 1 page per request")
    bad_last = (last < 1) | (last > block_size)
    if bad_last.any():
        b = int(np.argmax(bad_last))
        raise KVCacheMisuseError(
            f"kv_last_page_len[{b}] = {int(last[b])} is outside [1, block_size={block_size}]"
        )
    used_indices = indices[: int(indptr[-1])]
    _check_int32_ids("kv_indices", used_indices)
    if not 0 <= pad_block_id < _INT32_LIMIT:
        raise KVCacheMisuseError(f"pad_block_id = {pad_block_id} is outside [0, 2**31)")
    max_pages = int(num_pages.max()) if batch_size else 0
    block_table = np.full((batch_size, max_pages), pad_block_id, dtype=np.int32)
    used = np.arange(max_pages)[None, :] < num_pages[:, None]
    block_table[used] = used_indices  # row-major scatter is the inverse of the CSR gather
    seq_lens = (num_pages - 1) * block_size + last
    if batch_size and seq_lens.max() >= _INT32_LIMIT:
        raise KVCacheMisuseError(f"seq_len {int(seq_lens.max())} does not fit int32")
    return block_table, seq_lens.astype(np.int32)


def slot_from_csr(
    kv_indptr: npt.ArrayLike,
    kv_indices: npt.ArrayLike,
    block_size: int,
    batch_indices: npt.ArrayLike,
    positions: npt.ArrayLike,
) -> np.ndarray:
    """Flat slot of tokens addressed FlashInfer-style, by ``(batch_indices, positions)``.

    ``slot[i] = kv_indices[kv_indptr[b] + pos // P] * P + pos % P`` with ``b =
    batch_indices[i]``, ``pos = positions[i]`` (absolute position in the request), exactly
    where ``append_paged_kv_cache`` writes. The conformance suite checks it equals vLLM's
    ``slot_mapping``.

    Args:
        kv_indptr: ``[B + 1]`` int; kv_indices: ``[>= kv_indptr[-1]]`` int page ids.
        block_size: ``P``.
        batch_indices: ``[N]`` int in ``[0, B)``; positions: ``[N]`` int ``>= 0``.

    Returns:
        ``[N]`` int64 slots.

    Raises:
        KVCacheMisuseError: a batch index out of range, a negative position, or a position whose
            page ``pos // P`` is not among the request's ``num_pages`` pages.
    """
    _check_block_size(block_size)
    indptr = as_int_1d("kv_indptr", kv_indptr)
    indices = as_int_1d("kv_indices", kv_indices)
    num_pages = _check_indptr(indptr, indices.size)
    batch = as_int_1d("batch_indices", batch_indices)
    pos = as_int_1d("positions", positions)
    if batch.size != pos.size:
        raise KVCacheMisuseError(
            f"batch_indices has {batch.size} entries, positions has {pos.size}")
    if pos.size == 0:
        return np.zeros(0, dtype=np.int64)
    bad_batch = (batch < 0) | (batch >= num_pages.size)
    if bad_batch.any():
        i = int(np.argmax(bad_batch))
        raise KVCacheMisuseError(
            f"batch_indices[{i}] = {int(batch[i])} is outside [0, {num_pages.size}) requests"
        )
    if pos.min() < 0:
        i = int(np.argmax(pos < 0))
        raise KVCacheMisuseError(f"positions[{i}] = {int(pos[i])} is negative")
    page_idx = pos // block_size
    beyond = page_idx >= num_pages[batch]
    if beyond.any():
        i = int(np.argmax(beyond))
        raise KVCacheMisuseError(
            f"token {i}: position {int(pos[i])} is on page {int(page_idx[i])} but request "
            f"{int(batch[i])} has {int(num_pages[batch[i]])} pages"
        )
    slots: np.ndarray = indices[indptr[batch] + page_idx] * block_size + pos % block_size
    return slots


def block_table_from_sglang_req_to_token(
    req_to_token: npt.ArrayLike,
    req_pool_indices: npt.ArrayLike,
    seq_lens: npt.ArrayLike,
    page_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """SGLang ``req_to_token`` -> vLLM dense block table, after checking page contiguity.

    ``block_table[b, j] = req_to_token[r, j * P] // P`` with ``r = req_pool_indices[b]``, valid
    only if every page is contiguous and aligned:
    ``req_to_token[r, j * P + k] == block_table[b, j] * P + k`` for all ``k`` below the number
    of tokens in page ``j`` (the last page may be partial). SGLang's paged allocator guarantees
    this; a token-granular (``page_size == 1``) pool trivially satisfies it.

    Args:
        req_to_token: ``[pool_size, max_context_len]`` int flat token slots (row 0 is SGLang's
            dummy row; any row may be referenced).
        req_pool_indices: ``[B]`` int rows of ``req_to_token``.
        seq_lens: ``[B]`` int tokens per request, ``0 <= seq_len <= max_context_len``.
        page_size: ``P`` (== vLLM ``block_size``).

    Returns:
        ``(block_table [B, max(ceil(seq_lens / P))] int32 padded with 0, seq_lens [B] int32)``.

    Raises:
        KVCacheMisuseError: naming the request, the position and both values when a slot breaks page
            contiguity (including a page that does not start at a multiple of ``P``); also bad
            indices or lengths.

    Example:
        >>> import numpy as np
        >>> r2t = np.zeros((2, 8), dtype=np.int32)
        >>> r2t[1, :6] = [28, 29, 30, 31, 12, 13]     # pages 7 and 3 with P = 4
        >>> bt, lens = block_table_from_sglang_req_to_token(r2t, [1], [6], 4)
        >>> bt.tolist(), lens.tolist()
        ([[7, 3]], [6])
    """
    _check_block_size(page_size)
    r2t = np.asarray(req_to_token)
    if r2t.ndim != 2:
        raise KVCacheMisuseError(
            f"req_to_token must be 2-D [pool_size, max_context_len], got {r2t.shape}")
    if r2t.size and r2t.dtype.kind not in "iu":
        raise KVCacheMisuseError(f"req_to_token must hold integers, got dtype {r2t.dtype}")
    pool_size, max_context_len = r2t.shape
    rows = as_int_1d("req_pool_indices", req_pool_indices)
    lens = as_int_1d("seq_lens", seq_lens)
    if rows.size != lens.size:
        raise KVCacheMisuseError(
            f"req_pool_indices has {rows.size} entries, seq_lens has {lens.size}")
    batch_size = rows.size
    if batch_size == 0:
        return np.zeros((0, 0), dtype=np.int32), np.zeros(0, dtype=np.int32)
    bad_row = (rows < 0) | (rows >= pool_size)
    if bad_row.any():
        b = int(np.argmax(bad_row))
        raise KVCacheMisuseError(
            f"req_pool_indices[{b}] = {int(rows[b])} is outside [0, pool_size={pool_size})"
        )
    bad_len = (lens < 0) | (lens > max_context_len)
    if bad_len.any():
        b = int(np.argmax(bad_len))
        raise KVCacheMisuseError(
            f"seq_lens[{b}] = {int(lens[b])} is outside [0, max_context_len={max_context_len}]"
        )
    max_len = int(lens.max())
    num_pages = -(-lens // page_size)
    max_pages = int(num_pages.max())

    # Slots of every (request, position < seq_len); the rest is masked out.
    slots = r2t[rows, :max_len].astype(np.int64)  # [B, max_len]
    in_seq = np.arange(max_len)[None, :] < lens[:, None]
    first_slot = slots[:, ::page_size][:, :max_pages]  # slot of position j*P, [B, max_pages]
    has_page = np.arange(max_pages)[None, :] < num_pages[:, None]
    block_table = np.where(has_page, first_slot // page_size, 0)

    # Page contiguity: the slot of position j*P + k must be block_table[b, j]*P + k.
    pos = np.arange(max_len)
    expected = block_table[:, pos // page_size] * page_size + pos % page_size
    broken = in_seq & ((slots != expected) | (slots < 0))
    if broken.any():
        b, p = (int(x) for x in np.argwhere(broken)[0])
        j, k = divmod(p, page_size)
        r, actual = int(rows[b]), int(slots[b, p])
        why = (
            "a page must start at a non-negative multiple of page_size"
            if k == 0
            else f"page {j} starts at slot {int(first_slot[b, j])}"
        )
        raise KVCacheMisuseError(
            f"request {b} (req_pool_idx {r}) breaks page contiguity at position {p}: "
            f"req_to_token[{r}, {p}] = {actual}, expected block_table[{b}, {j}] * {page_size} "
            f"+ {k} = {int(expected[b, p])} ({why})"
        )
    _check_int32_ids("block_table", block_table[has_page])
    return block_table.astype(np.int32), lens.astype(np.int32)
