"""Block copies inside the paged cache (``copy_blocks``) and paged -> contiguous (``gather_kv``).

Both move raw bits: tensors are reinterpreted as same-width integers before the kernel sees them,
so every dtype (fp8 included) and every NaN payload is copied exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kvcheck.errors import KVCheckInputError
from kvcheck.gpu_kernels import _host
from kvcheck.gpu_kernels.layout import as_nhd

__all__ = ["copy_blocks", "gather_kv"]

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_bits(tensor: torch.Tensor) -> torch.Tensor:
    """Same memory, integer dtype of the same width (bit-exact copies, no float semantics)."""
    return tensor.view(_INT_OF_WIDTH[tensor.element_size()])


@triton.jit
def _copy_blocks_kernel(
    cache_ptr,  # [num_blocks, n1, n2, n3] any strides (one K or V cache of one layer)
    block_mapping_ptr,  # [num_pairs, 2] int64: (src_block_id, dst_block_id)
    stride_block,  # cache strides, in elements
    stride_1,
    stride_2,
    stride_3,
    n1,  # the three per-block dims, e.g. (block_size, num_kv_heads, head_size) for NHD
    n2,
    n3,
    BLOCK_E: tl.constexpr,  # elements of the block copied per program
):
    pair = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1).to(tl.int64)
    src = tl.load(block_mapping_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(block_mapping_ptr + 2 * pair + 1).to(tl.int64)
    # Flat element e of a block -> (i1, i2, i3); strides make NHD, HND and views all work.
    e = chunk * BLOCK_E + tl.arange(0, BLOCK_E)
    mask = e < n1 * n2 * n3
    i1 = e // (n2 * n3)
    i2 = (e // n3) % n2
    i3 = e % n3
    inner = i1 * stride_1 + i2 * stride_2 + i3 * stride_3
    data = tl.load(cache_ptr + src * stride_block + inner, mask=mask)
    tl.store(cache_ptr + dst * stride_block + inner, data, mask=mask)


def copy_blocks(caches: Sequence[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Copy whole blocks ``src -> dst`` in every cache tensor, in place (vLLM ``copy_blocks``).

    Copy-on-write and block moves copy every layer's K and V block. Blocks are indexed on dim 0,
    so the layout inside a block (NHD, HND, strided views) does not matter.

    Args:
        caches: 4-D tensors ``[num_blocks, ...]`` (e.g. ``[k0, v0, k1, v1]``); for vLLM's 5-D
            ``[2, num_blocks, ...]`` form pass ``kv[0], kv[1]``. Each is copied bit-exactly.
        block_mapping: ``[num_pairs, 2]`` int64 rows ``(src_block_id, dst_block_id)``, e.g.
            ``[[3, 7], [5, 1]]`` copies block 3 to 7 and block 5 to 1. Ids must be in
            ``[0, num_blocks)``; destinations must be distinct and never a source (copies run
            in parallel, so chains like ``1->2, 2->3`` have no defined order).

    Raises:
        KVCheckInputError: non-4-D caches, caches with different ``num_blocks`` or devices, a
            ``block_mapping`` that is not ``[num_pairs, 2]`` int64, ids out of range,
            duplicate destinations or a destination that is also a source.
    """
    if isinstance(caches, torch.Tensor):
        raise KVCheckInputError(
            "caches must be a sequence of tensors, e.g. [key_cache, value_cache]")
    caches = list(caches)
    _host.check_index_tensor(
        block_mapping, "block_mapping", 2, "[num_pairs, 2] (src, dst)", (torch.int64,)
    )
    if block_mapping.shape[1] != 2:
        raise KVCheckInputError(
            f"block_mapping must be [num_pairs, 2] (src, dst), got {tuple(block_mapping.shape)}"
        )
    for i, cache in enumerate(caches):
        _host.check_rank(cache, 4, f"caches[{i}]", "[num_blocks, ...]")
        _host.check_same_device(cache=cache, block_mapping=block_mapping)
        if cache.shape[0] != caches[0].shape[0]:
            raise KVCheckInputError(
                f"caches[{i}] has {cache.shape[0]} blocks, caches[0] has {caches[0].shape[0]}"
            )
    if not caches or block_mapping.shape[0] == 0:
        return
    # Value checks (a host sync on CUDA; copy_blocks is not on a hot path here).
    pairs = block_mapping.tolist()
    num_blocks = caches[0].shape[0]
    srcs = {src for src, _ in pairs}
    dsts = [dst for _, dst in pairs]
    for src, dst in pairs:
        if not (0 <= src < num_blocks and 0 <= dst < num_blocks):
            raise KVCheckInputError(f"block pair ({src}, {dst}) out of range [0, {num_blocks})")
    if len(set(dsts)) != len(dsts) or srcs & set(dsts):
        raise KVCheckInputError(
            "block_mapping destinations must be distinct and never a source (parallel copies "
            f"have no order); got {pairs}"
        )
    block_mapping = block_mapping.contiguous()
    for cache in caches:
        _host.check_device_runnable(_copy_blocks_kernel, cache)
        bits = _as_bits(cache)
        n1, n2, n3 = bits.shape[1:]
        block_e = min(triton.next_power_of_2(max(1, n1 * n2 * n3)), 4096)
        grid = (len(pairs), triton.cdiv(n1 * n2 * n3, block_e))
        _copy_blocks_kernel[grid](
            bits, block_mapping, *bits.stride(), n1, n2, n3, BLOCK_E=block_e
        )


@triton.jit
def _gather_kv_kernel(
    key_out_ptr,  # [total_tokens, num_kv_heads, head_size] contiguous
    value_out_ptr,  # same
    key_cache_ptr,  # NHD view [num_blocks, KV_BLOCK_SIZE, num_kv_heads, head_size]
    value_cache_ptr,
    block_table_ptr,  # [num_seqs(+), max_num_blocks_per_seq] int32/int64
    seq_lens_ptr,  # [num_seqs]
    cu_seq_lens_ptr,  # [num_seqs + 1] int64: output row of each sequence's first token
    stride_bt_seq,
    stride_k_block,
    stride_k_slot,
    stride_k_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    num_kv_heads,
    head_size,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,  # tokens per program
    BLOCK_HD: tl.constexpr,  # (head, dim) elements per program, flattened
):
    seq = tl.program_id(0).to(tl.int64)
    tok_tile = tl.program_id(1)
    hd_tile = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    out_start = tl.load(cu_seq_lens_ptr + seq).to(tl.int64)
    pos = tok_tile * BLOCK_T + tl.arange(0, BLOCK_T)
    pos_valid = pos < seq_len
    block_ids = tl.load(
        block_table_ptr + seq * stride_bt_seq + pos // KV_BLOCK_SIZE, mask=pos_valid, other=0
    ).to(tl.int64)
    block_offsets = (pos % KV_BLOCK_SIZE).to(tl.int64)
    hd = hd_tile * BLOCK_HD + tl.arange(0, BLOCK_HD)
    hd_valid = hd < num_kv_heads * head_size
    heads = (hd // head_size).to(tl.int64)
    dims = hd % head_size
    mask = pos_valid[:, None] & hd_valid[None, :]
    k = tl.load(
        key_cache_ptr + (block_ids * stride_k_block + block_offsets * stride_k_slot)[:, None]
        + (heads * stride_k_head + dims)[None, :],
        mask=mask,
    )
    v = tl.load(
        value_cache_ptr + (block_ids * stride_v_block + block_offsets * stride_v_slot)[:, None]
        + (heads * stride_v_head + dims)[None, :],
        mask=mask,
    )
    out_off = (out_start + pos)[:, None] * (num_kv_heads * head_size) + hd[None, :]
    tl.store(key_out_ptr + out_off, k, mask=mask)
    tl.store(value_out_ptr + out_off, v, mask=mask)


def gather_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    layout: str = "NHD",
    cu_seq_lens: torch.Tensor | None = None,
    max_seq_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy each sequence's K/V out of the paged cache into contiguous tensors (for checks).

    Sequence ``s`` fills output rows ``[cu_seq_lens[s], cu_seq_lens[s] + seq_lens[s])``; its
    position ``p`` comes from block ``block_table[s, p // block_size]``, row ``p % block_size``.
    E.g. seq_lens ``[3, 18]``, block_size 16: rows 0..2 are sequence 0, rows 3..20 sequence 1,
    whose row 20 (position 17) comes from ``block_table[1, 1]``, row 1.

    Args:
        key_cache, value_cache: NHD or HND (``layout``) caches of any dtype (fp8 is copied as
            raw bytes, not dequantised), head dim contiguous.
        block_table: ``[num_seqs, max_num_blocks_per_seq]`` int32 (or int64).
        seq_lens: ``[num_seqs]`` int32 (or int64).
        cu_seq_lens: optional ``[num_seqs + 1]`` int64 prefix sums of ``seq_lens``; with
            ``max_seq_len`` it avoids the host syncs that size the output and the grid.

    Returns:
        ``(key, value)``, each ``[sum(seq_lens), num_kv_heads, head_size]`` in the cache dtype.
    """
    _host.check_rank(key_cache, 4, "key_cache", f"[num_blocks, ...] ({layout})")
    _host.check_rank(value_cache, 4, "value_cache", f"[num_blocks, ...] ({layout})")
    if key_cache.shape != value_cache.shape or key_cache.dtype != value_cache.dtype:
        raise KVCheckInputError(
            f"key_cache {tuple(key_cache.shape)} {key_cache.dtype} and value_cache "
            f"{tuple(value_cache.shape)} {value_cache.dtype} must match"
        )
    for name, tensor in (("key_cache", key_cache), ("value_cache", value_cache)):
        _host.check_head_dim_contiguous(tensor, name)
    _host.check_index_tensor(
        block_table, "block_table", 2, "[num_seqs, max_num_blocks_per_seq]",
        (torch.int32, torch.int64),
    )
    _host.check_index_tensor(seq_lens, "seq_lens", 1, "[num_seqs]", (torch.int32, torch.int64))
    num_seqs = seq_lens.shape[0]
    if block_table.shape[0] < num_seqs:
        raise KVCheckInputError(
            f"block_table has {block_table.shape[0]} rows, need num_seqs={num_seqs}")
    _host.check_same_device(key_cache=key_cache, block_table=block_table, seq_lens=seq_lens)
    k_nhd, v_nhd = as_nhd(key_cache, layout), as_nhd(value_cache, layout)
    _, block_size, num_kv_heads, head_size = k_nhd.shape
    if cu_seq_lens is None:
        cu_seq_lens = torch.zeros(num_seqs + 1, dtype=torch.int64, device=seq_lens.device)
        cu_seq_lens[1:] = torch.cumsum(seq_lens.to(torch.int64), 0)
    else:
        _host.check_index_tensor(cu_seq_lens, "cu_seq_lens", 1, "[num_seqs + 1]", (torch.int64,))
    total_tokens = int(cu_seq_lens[-1].item()) if num_seqs else 0
    key_out = k_nhd.new_empty((total_tokens, num_kv_heads, head_size))
    value_out = v_nhd.new_empty((total_tokens, num_kv_heads, head_size))
    if total_tokens == 0:
        return key_out, value_out
    _host.check_device_runnable(_gather_kv_kernel, key_cache)
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())
    block_t = 16
    block_hd = min(triton.next_power_of_2(num_kv_heads * head_size), 1024)
    grid = (
        num_seqs,
        triton.cdiv(max_seq_len, block_t),
        triton.cdiv(num_kv_heads * head_size, block_hd),
    )
    kb, vb = _as_bits(k_nhd), _as_bits(v_nhd)
    _gather_kv_kernel[grid](
        _as_bits(key_out), _as_bits(value_out), kb, vb, block_table, seq_lens, cu_seq_lens,
        block_table.stride(0),
        kb.stride(0), kb.stride(1), kb.stride(2), vb.stride(0), vb.stride(1), vb.stride(2),
        num_kv_heads, head_size,
        KV_BLOCK_SIZE=block_size, BLOCK_T=block_t, BLOCK_HD=block_hd,
    )
    return key_out, value_out
