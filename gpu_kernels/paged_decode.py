"""Paged attention for decode: one query token per sequence, with an optional split-KV path.

Sequence ``s`` has ``seq_lens[s]`` cached tokens, its query token sits at the last position
``seq_lens[s] - 1`` and attends to every cached key (or the last ``sliding_window`` of them).
One program handles one (sequence, KV head, split): the ``num_heads // num_kv_heads`` query heads
that share the KV head are packed into the rows of one tile, so each K/V tile is read once per
group (GQA/MQA). With ``num_splits > 1`` (flash-decoding) each split covers a contiguous range of
KV tiles and writes a partial output plus its log-sum-exp; a second kernel merges the splits.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvcheck.errors import KVCheckInputError
from kvcheck.gpu_kernels import _host
from kvcheck.gpu_kernels._attention_core import _attend_kv_tiles

__all__ = ["choose_num_splits", "paged_attention_decode"]

_DEFAULT_BLOCK_N = 32
# Split only when programs are too few to fill a GPU; ~2 waves of 66 SMs (H100/H200: 132 SMs).
_TARGET_PROGRAMS = 132
_MIN_TOKENS_PER_SPLIT = 256
_MAX_SPLITS = 16


@triton.jit
def _paged_attention_decode_kernel(
    out_ptr,  # [num_seqs, num_heads, head_size] output, query dtype (NUM_SPLITS == 1)
    partial_out_ptr,  # [num_seqs, num_heads, NUM_SPLITS, head_size] fp32 (NUM_SPLITS > 1)
    partial_lse_ptr,  # [num_seqs, num_heads, NUM_SPLITS] fp32 log-sum-exp per split
    query_ptr,  # [num_seqs, num_heads, head_size]
    key_cache_ptr,  # NHD view [num_blocks, KV_BLOCK_SIZE, num_kv_heads, head_size]
    value_cache_ptr,  # NHD view
    block_table_ptr,  # [num_seqs(+), max_num_blocks_per_seq] int32/int64
    seq_lens_ptr,  # [num_seqs] int32/int64
    k_scale_ptr,  # [1] fp32 (read only when IS_FP8)
    v_scale_ptr,  # [1] fp32
    scale,  # softmax scale
    softcap,  # logit soft cap (USE_SOFTCAP)
    sliding_window,  # window size in tokens (USE_WINDOW)
    stride_q_seq,
    stride_q_head,
    stride_o_seq,
    stride_o_head,
    stride_bt_seq,  # elements between block-table rows
    stride_k_block,
    stride_k_slot,
    stride_k_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    num_heads,  # query heads
    head_size,
    tiles_per_split,  # KV tiles per split (ignored when NUM_SPLITS == 1)
    QUERIES_PER_KV: tl.constexpr,  # num_heads // num_kv_heads
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,  # >= QUERIES_PER_KV, >= 16 (tl.dot minimum)
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    IS_FP8: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,  # see _attend_kv_tiles
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    rows = tl.arange(0, BLOCK_M)
    row_valid = rows < QUERIES_PER_KV
    heads = kv_head * QUERIES_PER_KV + rows  # query heads h share KV head h // QUERIES_PER_KV
    dims = tl.arange(0, BLOCK_D)
    qo_mask = row_valid[:, None] & (dims < head_size)[None, :]
    q = tl.load(
        query_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
        mask=qo_mask,
        other=0.0,
    )
    # The decode token is the newest one: position seq_len - 1.
    q_pos = tl.full([BLOCK_M], 0, dtype=tl.int32) + (seq_len - 1)

    num_tiles = (seq_len + BLOCK_N - 1) // BLOCK_N  # tl.cdiv, inline (_attention_core: why)
    kv_start = 0
    first_tile = 0
    if USE_WINDOW:
        # The window is keys [seq_len - W, seq_len). Tiles wholly before it are skipped, never
        # loaded and masked: a sliding-window group's table holds the null block there. Inside
        # the first tile the loads are masked from kv_start on (_attend_kv_tiles).
        kv_start = tl.maximum(seq_len - sliding_window, 0)
        first_tile = kv_start // BLOCK_N
    if NUM_SPLITS == 1:
        tile_start = first_tile
        tile_end = num_tiles
    else:
        # Splits share out the tiles of the window (all tiles without one).
        tile_start = first_tile + split * tiles_per_split
        tile_end = tl.minimum(tile_start + tiles_per_split, num_tiles)

    acc, m_i, l_i = _attend_kv_tiles(
        q, q_pos,
        key_cache_ptr, value_cache_ptr, block_table_ptr + seq * stride_bt_seq, kv_head,
        seq_len, kv_start, tile_start, tile_end, scale, softcap, sliding_window,
        k_scale_ptr, v_scale_ptr,
        stride_k_block, stride_k_slot, stride_k_head,
        stride_v_block, stride_v_slot, stride_v_head,
        head_size,
        BLOCK_M, KV_BLOCK_SIZE, BLOCK_N, BLOCK_D, USE_SOFTCAP, USE_WINDOW, IS_FP8, DOT_PRECISION,
        UPCAST_DOT,
    )

    # l_i == 0 means no visible key (seq_len 0, or an empty split): output 0, never NaN.
    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=qo_mask,
        )
    else:
        # Partial buffers are contiguous: [seq, head, split, d] and [seq, head, split].
        row_base = (seq * num_heads + heads) * NUM_SPLITS + split
        tl.store(
            partial_out_ptr + row_base[:, None] * head_size + dims[None, :], out, mask=qo_mask
        )
        lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(partial_lse_ptr + row_base, lse, mask=row_valid)


@triton.jit
def _paged_attention_decode_reduce_kernel(
    out_ptr,  # [num_seqs, num_heads, head_size] output, query dtype
    partial_out_ptr,  # [num_seqs, num_heads, NUM_SPLITS, head_size] fp32, normalised per split
    partial_lse_ptr,  # [num_seqs, num_heads, NUM_SPLITS] fp32, -inf for an empty split
    stride_o_seq,
    stride_o_head,
    num_heads,
    head_size,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,  # next power of two >= NUM_SPLITS
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    split_valid = splits < NUM_SPLITS
    base = (seq * num_heads + head) * NUM_SPLITS
    lse = tl.load(partial_lse_ptr + base + splits, mask=split_valid, other=float("-inf"))
    # out = sum_i exp(lse_i) * o_i / sum_i exp(lse_i), shifted by max(lse) for stability.
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weights = tl.exp(lse - lse_max)  # 0 for empty splits
    total = tl.sum(weights, axis=0)
    partial = tl.load(
        partial_out_ptr + (base + splits)[:, None] * head_size + dims[None, :],
        mask=split_valid[:, None] & (dims < head_size)[None, :],
        other=0.0,
    )
    out = tl.sum(partial * weights[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_o_seq + head * stride_o_head + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < head_size,
    )


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int) -> int:
    """Split-KV heuristic: split long contexts only when (seq, KV head) programs are few.

    Returns ``min(16, ceil(max_seq_len / 256), ceil(132 / (num_seqs * num_kv_heads)))``, at
    least 1: e.g. 1 sequence x 8 KV heads x 4096 tokens -> 16 splits; 64 x 8 -> 1.
    """
    num_programs = max(1, num_seqs * num_kv_heads)
    by_length = math.ceil(max_seq_len / _MIN_TOKENS_PER_SPLIT)
    by_occupancy = math.ceil(_TARGET_PROGRAMS / num_programs)
    return max(1, min(_MAX_SPLITS, by_length, by_occupancy))


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    layout: str = "NHD",
    sliding_window: int | None = None,
    softcap: float | None = None,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention over a paged KV cache (one new query token per sequence).

    For sequence ``s`` with ``L = seq_lens[s]`` cached tokens (the query token's own K/V already
    stored at position ``L - 1``) and query head ``h`` (KV head ``h // (num_heads //
    num_kv_heads)``)::

        score_j = softcap * tanh(scale * q . k_j / softcap)   (or scale * q . k_j without softcap)
        out     = sum_j softmax(score)_j * v_j   over j in [max(0, L - sliding_window), L)

    Key ``j`` of sequence ``s`` lives in block ``block_table[s, j // block_size]`` at row
    ``j % block_size``; e.g. block_size 16, ``block_table[s] = [7, 2, 9]``, ``j = 45`` -> block
    9, row 13 (``45 = 2 * 16 + 13``). Block ids may be in any order and shared between sequences.

    Args:
        query: ``[num_seqs, num_heads, head_size]`` float32/float16/bfloat16.
        key_cache, value_cache: NHD ``[num_blocks, block_size, num_kv_heads, head_size]`` or HND
            (``layout="HND"``), any strides with a contiguous head dim; same dtype as ``query``
            unless ``kv_cache_dtype`` is fp8.
        block_table: ``[num_seqs, max_num_blocks_per_seq]`` int32 (or int64); entries past
            ``ceil(seq_len / block_size)`` are never read, nor (sliding window) entries before
            ``(seq_len - sliding_window) // block_size``.
        seq_lens: ``[num_seqs]`` int32 (or int64) cached tokens per sequence, including the
            query token. ``seq_len == 0`` yields a zero output row.
        scale: softmax scale, usually ``head_size ** -0.5``.
        layout: "NHD" or "HND".
        sliding_window: ``None`` (full attention) or ``W >= 1``: only the last ``W`` keys
            (vLLM's ``window_size = (W - 1, 0)``). Nothing before key ``L - W`` is read, neither
            block-table entries nor cache slots, so a sliding-window group's null-padded table
            (the null block, id 0, at the blocks ``remove_skipped_blocks`` dropped) works
            whatever block 0 holds.
        softcap: ``None`` or ``> 0``: Gemma-2 style ``softcap * tanh(score / softcap)``.
        kv_cache_dtype: "auto" or "fp8"/"fp8_e4m3" (cache e4m3 or uint8; K/V dequantised as
            ``x * scale`` in fp32, then cast to the query dtype).
        k_scale, v_scale: per-tensor float32 scales for fp8 (tensor or float; None = 1.0).
        num_splits: KV splits (flash-decoding); ``None`` picks one with ``choose_num_splits``,
            1 disables the split path (no reduce kernel).
        max_seq_len: an upper bound of ``seq_lens``; computing it otherwise costs a device sync
            (only needed when ``num_splits != 1``).
        block_n: KV tile in tokens (power of two >= 16); None = 32.
        out: optional ``[num_seqs, num_heads, head_size]`` output tensor (query dtype).

    Returns:
        ``[num_seqs, num_heads, head_size]`` in the query dtype (``out`` if given).

    Raises:
        KVCheckInputError: wrong ranks, ``num_heads`` not a multiple of ``num_kv_heads``, mismatched
            head sizes, non-contiguous head dims, non-integer index tensors, an unsupported
            ``kv_cache_dtype`` or cache dtype, a bad ``sliding_window``/``softcap``/
            ``num_splits``/``block_n``, or CPU tensors without ``TRITON_INTERPRET=1``.
    """
    num_seqs = query.shape[0] if isinstance(query, torch.Tensor) and query.dim() == 3 else 0
    args = _host.check_paged_attention_args(
        query, key_cache, value_cache, block_table, seq_lens, num_seqs, layout,
        kv_cache_dtype, k_scale, v_scale, sliding_window, softcap,
        "[num_seqs, num_heads, head_size]",
    )
    num_heads, head_size = query.shape[1], query.shape[2]
    block_n = _DEFAULT_BLOCK_N if block_n is None else block_n
    if block_n < 16 or block_n & (block_n - 1):
        raise KVCheckInputError(
            f"block_n must be a power of two >= 16 (tl.dot minimum), got {block_n}")
    if num_splits is not None and num_splits < 1:
        raise KVCheckInputError(f"num_splits must be None (auto) or >= 1, got {num_splits}")
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    elif out.shape != query.shape or out.dtype != query.dtype or out.device != query.device:
        raise KVCheckInputError(
            f"out must match query: shape {tuple(query.shape)}, {query.dtype} on {query.device}; "
            f"got {tuple(out.shape)}, {out.dtype} on {out.device}"
        )
    else:
        _host.check_head_dim_contiguous(out, "out")
    _host.check_device_runnable(_paged_attention_decode_kernel, query)
    if num_seqs == 0:
        return out

    if num_splits != 1 and max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())  # host sync; pass max_seq_len to avoid it
    if num_splits is None:
        assert max_seq_len is not None  # read just above (None is not 1)
        span = max_seq_len if sliding_window is None else min(max_seq_len, sliding_window)
        num_splits = choose_num_splits(num_seqs, args.num_kv_heads, span)
    tiles_per_split = 1
    if num_splits > 1:
        assert max_seq_len is not None
        num_tiles = triton.cdiv(max_seq_len, block_n)
        if sliding_window is not None:
            # Keys [L - W, L) touch at most cdiv(W - 1, block_n) + 1 tiles, wherever L falls.
            num_tiles = min(num_tiles, triton.cdiv(sliding_window - 1, block_n) + 1)
        tiles_per_split = max(1, triton.cdiv(num_tiles, num_splits))

    block_d = triton.next_power_of_2(head_size)
    block_m = max(16, triton.next_power_of_2(args.queries_per_kv))
    if num_splits > 1:
        partial_out = torch.empty(
            (num_seqs, num_heads, num_splits, head_size), dtype=torch.float32, device=query.device
        )
        partial_lse = torch.empty(
            (num_seqs, num_heads, num_splits), dtype=torch.float32, device=query.device
        )
    else:
        partial_out = partial_lse = out  # unused by the kernel on this path
    k_nhd, v_nhd = args.key_cache, args.value_cache
    grid = (num_seqs, args.num_kv_heads, num_splits)
    _paged_attention_decode_kernel[grid](
        out, partial_out, partial_lse, query, k_nhd, v_nhd, block_table, seq_lens,
        args.k_scale, args.v_scale,
        float(scale), float(softcap or 0.0), int(sliding_window or 0),
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        block_table.stride(0),
        k_nhd.stride(0), k_nhd.stride(1), k_nhd.stride(2),
        v_nhd.stride(0), v_nhd.stride(1), v_nhd.stride(2),
        num_heads, head_size, tiles_per_split,
        QUERIES_PER_KV=args.queries_per_kv, KV_BLOCK_SIZE=args.block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, NUM_SPLITS=num_splits,
        USE_SOFTCAP=softcap is not None, USE_WINDOW=sliding_window is not None,
        IS_FP8=args.is_fp8, DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        UPCAST_DOT=(query.dtype == torch.bfloat16
                    and _host.is_interpreted(_paged_attention_decode_kernel)),
    )
    if num_splits > 1:
        _paged_attention_decode_reduce_kernel[(num_seqs, num_heads)](
            out, partial_out, partial_lse, out.stride(0), out.stride(1), num_heads, head_size,
            NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
        )
    return out
