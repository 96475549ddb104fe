"""Triton building blocks shared by the paged-attention kernels (decode and varlen).

``_attend_kv_tiles`` runs the online-softmax (flash-attention) loop over KV tiles read through a
block table, state initialisation and fp8 scales included; the kernels only differ in which query
rows they load, the position each row sits at, and which tile range they cover.
Conventions inside the kernels:

* rows (``BLOCK_M``) are (query token, query head) pairs that share one KV head (GQA packing);
* ``KV_BLOCK_SIZE`` is the cache block size, ``BLOCK_N`` the KV tile, ``BLOCK_D`` the padded
  head size; a KV tile may span several cache blocks (or part of one), because every key position
  looks up its own ``block_id`` (so block sizes 1, 16, 32, ... and non-multiples all work);
* every cache offset is int64 (``block_id * stride`` overflows int32 on large caches);
* with a sliding window nothing before ``kv_start`` is read, neither the block table nor the
  cache: a sliding-window group's table holds the null block (id 0) at the positions the window
  has skipped (``remove_skipped_blocks``), and those entries (and whatever block 0 holds) must
  never reach the arithmetic. Whole tiles before ``kv_start`` are skipped by the callers
  (``tile_start``); inside the first tile the loads are masked per position.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__: list[str] = []  # kernel helpers only; the public ops live in paged_decode / paged_varlen


@triton.jit
def _softcap(scores, softcap):
    # softcap * tanh(scores / softcap), with tanh(y) = 1 - 2 / (exp(2y) + 1): this form saturates
    # to +-1 for large |y| (exp -> inf or 0) instead of producing inf / inf = NaN.
    y = scores / softcap
    return softcap * (1.0 - 2.0 / (tl.exp(2.0 * y) + 1.0))


@triton.jit
def _attend_kv_tiles(
    q,  # [BLOCK_M, BLOCK_D] query rows in the compute dtype (the query dtype)
    q_pos,  # [BLOCK_M] int32 absolute position of each row's token in its sequence
    key_cache_ptr,  # NHD view [num_blocks, KV_BLOCK_SIZE, num_kv_heads, head_size]
    value_cache_ptr,  # NHD view, same shape
    block_table_row_ptr,  # this sequence's block-table row (int32/int64 block ids)
    kv_head,  # int64 KV head index of this program
    seq_len,  # number of cached tokens of the sequence (keys at positions [0, seq_len))
    kv_start,  # first key position read (USE_WINDOW): earlier ones are neither loaded nor seen
    tile_start,  # first KV tile (of BLOCK_N positions) to visit
    tile_end,  # one past the last KV tile to visit
    scale,  # softmax scale applied to q . k (fp32)
    softcap,  # logit soft cap (fp32), used when USE_SOFTCAP
    sliding_window,  # keys with q_pos - key_pos >= sliding_window are hidden (USE_WINDOW)
    k_scale_ptr,  # [1] fp32 per-tensor dequantisation scale of K (read only when IS_FP8)
    v_scale_ptr,  # [1] fp32 per-tensor dequantisation scale of V
    stride_k_block,  # key cache strides of the NHD view, in elements
    stride_k_slot,
    stride_k_head,
    stride_v_block,  # value cache strides
    stride_v_slot,
    stride_v_head,
    head_size,  # D <= BLOCK_D
    BLOCK_M: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    IS_FP8: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 queries (no TF32 rounding), else "tf32"
    UPCAST_DOT: tl.constexpr,  # run the dots in fp32 (interpreter: its bf16 tl.dot is broken)
):
    """The attention of ``BLOCK_M`` query rows over KV tiles ``[tile_start, tile_end)``:
    ``(acc, m_i, l_i)``, the unnormalised output ``[BLOCK_M, BLOCK_D]`` fp32, the running max
    and the softmax normaliser ``[BLOCK_M]`` fp32 (``l_i == 0``: no visible key)."""
    # tl.full, not tl.zeros (nor tl.cdiv below and in the kernels): those are @triton.jit
    # helpers, and in TRITON_INTERPRET mode each call of one re-patches triton.language
    # (about a millisecond); on a GPU both compile to the same code.
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, dtype=tl.float32)  # running sum of p * V
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # -inf before any visible key
    l_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32)  # running sum of exp(score - m_i)
    k_scale = 1.0
    v_scale = 1.0
    if IS_FP8:
        k_scale = tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < head_size
    k_head_off = kv_head * stride_k_head
    v_head_off = kv_head * stride_v_head
    for tile in range(tile_start, tile_end):
        kv_pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        kv_valid = kv_pos < seq_len
        if USE_WINDOW:
            # Before the window: the table may hold the null block there; load nothing.
            kv_valid = kv_valid & (kv_pos >= kv_start)
        # Logical -> physical: position p lives in block_table[p // bs] at row p % bs.
        # e.g. bs 16, row [7, 2, 9]: p = 29 -> block 2, row 13 -> slot 45 = 2 * 16 + 13.
        block_ids = tl.load(block_table_row_ptr + kv_pos // KV_BLOCK_SIZE, mask=kv_valid, other=0)
        block_ids = block_ids.to(tl.int64)
        block_offsets = (kv_pos % KV_BLOCK_SIZE).to(tl.int64)

        # K is loaded transposed, [BLOCK_D, BLOCK_N], ready for q @ K^T. Masked loads never touch
        # slots past seq_len, before kv_start, or unused block-table entries (garbage or null).
        k_off = block_ids * stride_k_block + block_offsets * stride_k_slot + k_head_off
        k = tl.load(
            key_cache_ptr + k_off[None, :] + dims[:, None],
            mask=kv_valid[None, :] & dim_mask[:, None],
            other=0.0,
        )
        v_off = block_ids * stride_v_block + block_offsets * stride_v_slot + v_head_off
        v = tl.load(
            value_cache_ptr + v_off[:, None] + dims[None, :],
            mask=kv_valid[:, None] & dim_mask[None, :],
            other=0.0,
        )
        if IS_FP8:
            # vLLM semantics: dequantise in fp32 (x * scale), then cast to the query dtype.
            k = (k.to(tl.float32) * k_scale).to(q.dtype)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        else:
            k = k.to(q.dtype)
            v = v.to(q.dtype)

        if UPCAST_DOT:
            # Exact: bf16 x bf16 products are representable in fp32 and the GPU's MMA also
            # accumulates in fp32, so only the summation order differs from the native dot.
            scores = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
        else:
            scores = tl.dot(q, k, input_precision=DOT_PRECISION)
        scores = scores * scale  # [BLOCK_M, BLOCK_N] fp32
        if USE_SOFTCAP:
            scores = _softcap(scores, softcap)
        # Causal relative to each row's own position; positions past seq_len never count.
        visible = kv_valid[None, :] & (kv_pos[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            visible = visible & (kv_pos[None, :] > q_pos[:, None] - sliding_window)
        scores = tl.where(visible, scores, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # A row that has seen no visible key yet keeps m = -inf; subtracting 0 instead keeps
        # exp(-inf - 0) = 0 and avoids -inf - (-inf) = NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)  # the fp32 p: the normaliser is not rounded
        # P is rounded to the value dtype before the PV product, as flash-attention kernels do.
        p = p.to(v.dtype)
        if UPCAST_DOT:
            pv = tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p, v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i
