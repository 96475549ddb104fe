"""Paged attention for mixed prefill / extend / decode batches (vLLM unified-attention semantics).

Sequence ``s`` owns query rows ``[query_start_loc[s], query_start_loc[s + 1])`` and has
``seq_lens[s]`` tokens in the cache, the new ones included. With ``query_len`` new tokens its
cached context is ``context_len = seq_len - query_len``; query token ``i`` sits at position
``context_len + i`` and attends to the keys at positions ``<= context_len + i`` (causal relative
to the cached context). A prefill has ``context_len == 0``, a decode ``query_len == 1``, an
extend (chunked prefill, prefix hit) anything in between.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvcheck.errors import KVCheckInputError
from kvcheck.gpu_kernels import _host
from kvcheck.gpu_kernels._attention_core import _attend_kv_tiles

__all__ = ["paged_attention_varlen"]

_DEFAULT_BLOCK_N = 32
_TARGET_BLOCK_M = 32  # query rows per program: BLOCK_Q tokens x (padded) queries per KV head


@triton.jit
def _paged_attention_varlen_kernel(
    out_ptr,  # [num_tokens, num_heads, head_size] output, query dtype
    query_ptr,  # [num_tokens, num_heads, head_size]
    key_cache_ptr,  # NHD view [num_blocks, KV_BLOCK_SIZE, num_kv_heads, head_size]
    value_cache_ptr,  # NHD view
    block_table_ptr,  # [num_seqs(+), max_num_blocks_per_seq] int32/int64
    query_start_loc_ptr,  # [num_seqs + 1] int32/int64, query rows of each sequence
    seq_lens_ptr,  # [num_seqs] int32/int64, cached tokens incl. the new ones
    k_scale_ptr,  # [1] fp32 (IS_FP8)
    v_scale_ptr,  # [1] fp32 (IS_FP8)
    scale,
    softcap,
    sliding_window,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_bt_seq,
    stride_k_block,
    stride_k_slot,
    stride_k_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    head_size,
    QUERIES_PER_KV: tl.constexpr,  # num_heads // num_kv_heads
    QPK_PAD: tl.constexpr,  # next power of two >= QUERIES_PER_KV
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_M: tl.constexpr,  # BLOCK_Q * QPK_PAD rows: row r = (token r // QPK_PAD, head r % QPK_PAD)
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    IS_FP8: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,  # see _attend_kv_tiles
):
    seq = tl.program_id(0).to(tl.int64)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2).to(tl.int64)

    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    query_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
    if q_tile * BLOCK_Q >= query_len:
        return  # the grid is sized for the longest query; this sequence is shorter
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    context_len = seq_len - query_len

    rows = tl.arange(0, BLOCK_M)
    tok = q_tile * BLOCK_Q + rows // QPK_PAD  # token index within the sequence's query
    head_in_group = rows % QPK_PAD
    row_valid = (tok < query_len) & (head_in_group < QUERIES_PER_KV)
    heads = kv_head * QUERIES_PER_KV + head_in_group
    dims = tl.arange(0, BLOCK_D)
    qo_mask = row_valid[:, None] & (dims < head_size)[None, :]
    qo_tok = (q_start + tok).to(tl.int64)
    q = tl.load(
        query_ptr + qo_tok[:, None] * stride_q_tok + heads[:, None] * stride_q_head
        + dims[None, :],
        mask=qo_mask,
        other=0.0,
    )
    q_pos = context_len + tok  # e.g. context 29, query_len 3: positions 29, 30, 31

    # Keys past the tile's last query position are masked for every row: stop there.
    last_pos = context_len + tl.minimum(query_len, (q_tile + 1) * BLOCK_Q) - 1
    tile_end = (last_pos + BLOCK_N) // BLOCK_N  # tl.cdiv, inline (_attention_core: why)
    kv_start = 0
    if USE_WINDOW:
        # The tile's first query row sees the oldest keys: from first_pos - W + 1 on. Nothing
        # earlier is read (tiles skipped, the first tile's loads masked): a sliding-window
        # group's null-padded table holds the null block there.
        first_pos = context_len + q_tile * BLOCK_Q
        kv_start = tl.maximum(first_pos - sliding_window + 1, 0)
    tile_start = kv_start // BLOCK_N

    acc, _m_i, l_i = _attend_kv_tiles(
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
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + qo_tok[:, None] * stride_o_tok + heads[:, None] * stride_o_head + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=qo_mask,
    )


def paged_attention_varlen(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    layout: str = "NHD",
    sliding_window: int | None = None,
    softcap: float | None = None,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    max_query_len: int | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal paged attention for a batch mixing prefills, extends and decodes.

    Worked example (block_size 4): ``query_start_loc = [0, 5, 6, 9]``, ``seq_lens = [5, 9,
    11]`` is a 5-token prefill (context 0, positions 0..4), a decode (context 8, position 8)
    and a 3-token extend (context 8, positions 8, 9, 10). Query row 7 is the extend's second
    token (``7 - 6 = 1``), at position ``8 + 1 = 9``; it sees keys 0..9, key 9 being in block
    ``block_table[2, 9 // 4]`` at row ``9 % 4 = 1``.

    Args:
        query: ``[num_tokens, num_heads, head_size]`` float32/float16/bfloat16, the new tokens of
            all sequences, concatenated in sequence order.
        key_cache, value_cache: NHD or HND (``layout``) caches, any strides with a contiguous
            head dim; they must already hold the new tokens' K/V (store first).
        block_table: ``[num_seqs, max_num_blocks_per_seq]`` int32 (or int64).
        query_start_loc: ``[num_seqs + 1]`` int32 (or int64), non-decreasing, starting at 0.
        seq_lens: ``[num_seqs]`` int32 (or int64), cached tokens per sequence including the new
            ones; ``query_len <= seq_len`` is required (not checked: it would need a sync).
        scale, layout, sliding_window, softcap, kv_cache_dtype, k_scale, v_scale, block_n, out:
            as for ``paged_attention_decode``; the window applies per query position
            (``q_pos - key_pos < sliding_window``). Nothing before key ``context_len -
            sliding_window + 1`` (the first query's window) is read, so a sliding-window
            group's table may hold the null block (id 0) wherever ``remove_skipped_blocks``
            (run with ``num_computed_tokens = context_len``) put it.
        max_query_len: upper bound of the query lengths (sizes the grid); ``None`` computes it
            with a device sync.

    Returns:
        ``[num_tokens, num_heads, head_size]`` in the query dtype.

    Raises:
        KVCheckInputError: as ``paged_attention_decode``, plus a malformed ``query_start_loc``.
    """
    if not isinstance(query_start_loc, torch.Tensor):
        raise KVCheckInputError("query_start_loc must be a torch.Tensor [num_seqs + 1]")
    _host.check_index_tensor(
        query_start_loc, "query_start_loc", 1, "[num_seqs + 1]", (torch.int32, torch.int64)
    )
    num_seqs = query_start_loc.shape[0] - 1
    if num_seqs < 0:
        raise KVCheckInputError("query_start_loc must have num_seqs + 1 >= 1 entries")
    args = _host.check_paged_attention_args(
        query, key_cache, value_cache, block_table, seq_lens, num_seqs, layout,
        kv_cache_dtype, k_scale, v_scale, sliding_window, softcap,
        "[num_tokens, num_heads, head_size]",
    )
    _host.check_same_device(query=query, query_start_loc=query_start_loc)
    head_size = query.shape[2]
    block_n = _DEFAULT_BLOCK_N if block_n is None else block_n
    if block_n < 16 or block_n & (block_n - 1):
        raise KVCheckInputError(
            f"block_n must be a power of two >= 16 (tl.dot minimum), got {block_n}")
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    elif out.shape != query.shape or out.dtype != query.dtype or out.device != query.device:
        raise KVCheckInputError(
            f"out must match query: shape {tuple(query.shape)}, {query.dtype} on {query.device}; "
            f"got {tuple(out.shape)}, {out.dtype} on {out.device}"
        )
    else:
        _host.check_head_dim_contiguous(out, "out")
    _host.check_device_runnable(_paged_attention_varlen_kernel, query)
    if num_seqs == 0 or query.shape[0] == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())
    if max_query_len == 0:
        return out

    qpk_pad = triton.next_power_of_2(args.queries_per_kv)
    block_q = max(1, _TARGET_BLOCK_M // qpk_pad)
    # Do not tile past the longest query (keeps decode-only batches at one token per program).
    block_q = min(block_q, triton.next_power_of_2(max_query_len))
    block_m = max(16, block_q * qpk_pad)  # tl.dot needs >= 16 rows; extra rows are masked
    block_q = block_m // qpk_pad
    k_nhd, v_nhd = args.key_cache, args.value_cache
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), args.num_kv_heads)
    _paged_attention_varlen_kernel[grid](
        out, query, k_nhd, v_nhd, block_table, query_start_loc, seq_lens,
        args.k_scale, args.v_scale,
        float(scale), float(softcap or 0.0), int(sliding_window or 0),
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        block_table.stride(0),
        k_nhd.stride(0), k_nhd.stride(1), k_nhd.stride(2),
        v_nhd.stride(0), v_nhd.stride(1), v_nhd.stride(2),
        head_size,
        QUERIES_PER_KV=args.queries_per_kv, QPK_PAD=qpk_pad, BLOCK_Q=block_q, BLOCK_M=block_m,
        KV_BLOCK_SIZE=args.block_size, BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(head_size),
        USE_SOFTCAP=softcap is not None, USE_WINDOW=sliding_window is not None,
        IS_FP8=args.is_fp8, DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        UPCAST_DOT=(query.dtype == torch.bfloat16
                    and _host.is_interpreted(_paged_attention_varlen_kernel)),
    )
    return out
