"""Boring references for every kernel: fp32, per-sequence (or per-token) Python loops, no tiling.

Each ``<op>_ref`` states the same contract as ``<op>`` and is what the kernels and any third
party's kernels are checked against (``kvcheck.gpu_kernels.conformance``). Attention references
return **float32** so a comparison sees the reference's full precision; the store and copy
references write the cache dtype exactly like the kernels must (fp8: ``fp8(x / scale)``, torch's
round-to-nearest-even).
"""

from __future__ import annotations

import math

import torch

from kvcheck.gpu_kernels.layout import as_nhd

__all__ = [
    "attention_ref",
    "copy_blocks_ref",
    "dequantize_ref",
    "first_key_position",
    "gather_kv_ref",
    "paged_attention_decode_ref",
    "paged_attention_varlen_ref",
    "store_kv_cache_ref",
]

_FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")


def _fp8_view(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(torch.float8_e4m3fn) if cache.dtype == torch.uint8 else cache


def _scale_value(scale: torch.Tensor | float | None) -> float:
    if scale is None:
        return 1.0
    return float(scale.reshape(-1)[0]) if isinstance(scale, torch.Tensor) else float(scale)


def dequantize_ref(
    cache: torch.Tensor, kv_cache_dtype: str = "auto", scale: torch.Tensor | float | None = None
) -> torch.Tensor:
    """A cache (or slice of one) as float32: ``x.float() * scale`` for fp8, ``x.float()`` else."""
    if kv_cache_dtype in _FP8_KV_CACHE_DTYPES:
        return _fp8_view(cache).float() * _scale_value(scale)
    return cache.float()


def store_kv_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    *,
    layout: str = "NHD",
) -> None:
    """Reference of ``store_kv_cache``: ``cache[slot // bs, slot % bs] = key[i]`` per token.

    Shapes as ``store_kv_cache``; writes in place. Tokens with a negative slot are skipped. fp8:
    ``(x.float() / scale).to(float8_e4m3fn)``. Duplicate slots: the last token wins.
    """
    k_nhd, v_nhd = as_nhd(key_cache, layout), as_nhd(value_cache, layout)
    is_fp8 = kv_cache_dtype in _FP8_KV_CACHE_DTYPES
    if is_fp8:
        k_nhd, v_nhd = _fp8_view(k_nhd), _fp8_view(v_nhd)
    block_size = k_nhd.shape[1]
    k_s, v_s = _scale_value(k_scale), _scale_value(v_scale)
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:  # PAD_SLOT_ID
            continue
        block_id, block_offset = slot // block_size, slot % block_size
        if is_fp8:
            k_nhd[block_id, block_offset] = (key[i].float() / k_s).to(k_nhd.dtype)
            v_nhd[block_id, block_offset] = (value[i].float() / v_s).to(v_nhd.dtype)
        else:
            k_nhd[block_id, block_offset] = key[i].to(k_nhd.dtype)
            v_nhd[block_id, block_offset] = value[i].to(v_nhd.dtype)


def attention_ref(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of one sequence over contiguous K/V, in float32.

    Args:
        query: ``[query_len, num_heads, head_size]``, the *last* ``query_len`` tokens: query
            row ``i`` sits at position ``kv_len - query_len + i``.
        key, value: ``[kv_len, num_kv_heads, head_size]`` (already dequantised if needed).
        scale, sliding_window, softcap: as ``paged_attention_decode``.

    Returns:
        ``[query_len, num_heads, head_size]`` float32; rows with no visible key are 0.
    """
    query_len, num_heads, _ = query.shape
    kv_len, num_kv_heads, _ = key.shape
    group = num_heads // num_kv_heads
    q = query.float()
    # Query head h reads KV head h // group (GQA): repeat each KV head `group` times.
    k = key.float().repeat_interleave(group, dim=1)
    v = value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    q_pos = torch.arange(query_len, device=query.device) + (kv_len - query_len)
    k_pos = torch.arange(kv_len, device=query.device)
    visible = k_pos[None, :] <= q_pos[:, None]
    if sliding_window is not None:
        visible &= k_pos[None, :] > q_pos[:, None] - sliding_window
    scores = scores.masked_fill(~visible[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-masked rows -> 0, not NaN
    return torch.einsum("hqk,khd->qhd", probs, v)


def _gather_sequence(
    cache_nhd: torch.Tensor, block_ids: list[int], seq_len: int, start: int = 0
) -> torch.Tensor:
    """``[seq_len - start, H, D]``: rows ``[start, seq_len)`` of a sequence, block by block.

    ``block_ids`` are the table entries from block ``start // block_size`` on: entries before
    it are never looked at (a sliding-window table holds the null block there).
    """
    if seq_len <= start:
        return cache_nhd.new_empty((0, *cache_nhd.shape[2:]))
    offset = start - (start // cache_nhd.shape[1]) * cache_nhd.shape[1]
    blocks = cache_nhd[torch.tensor(block_ids, dtype=torch.long, device=cache_nhd.device)]
    return blocks.reshape(-1, *cache_nhd.shape[2:])[offset : offset + seq_len - start]


def first_key_position(seq_len: int, query_len: int, sliding_window: int | None) -> int:
    """The oldest key any of a sequence's ``query_len`` new tokens attends to.

    Without a window 0; with one, the first query (position ``seq_len - query_len``) sees keys
    from ``seq_len - query_len - W + 1`` on, i.e. ``get_num_skipped_tokens(num_computed_tokens)``
    of vLLM's sliding-window manager with ``num_computed_tokens = seq_len - query_len``. Every
    block wholly before it may be the null block in that group's table.
    """
    if sliding_window is None:
        return 0
    return max(0, seq_len - query_len - sliding_window + 1)


def _sequence_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq: int,
    seq_len: int,
    start: int,
    layout: str,
    kv_cache_dtype: str,
    k_scale: torch.Tensor | float | None,
    v_scale: torch.Tensor | float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of positions ``[start, seq_len)``, dequantised to float32."""
    k_nhd, v_nhd = as_nhd(key_cache, layout), as_nhd(value_cache, layout)
    block_size = k_nhd.shape[1]
    num_blocks = math.ceil(seq_len / block_size)
    block_ids = block_table[seq, start // block_size : num_blocks].tolist()
    key = _gather_sequence(k_nhd, block_ids, seq_len, start)
    value = _gather_sequence(v_nhd, block_ids, seq_len, start)
    return (dequantize_ref(key, kv_cache_dtype, k_scale),
            dequantize_ref(value, kv_cache_dtype, v_scale))


def paged_attention_decode_ref(
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
    **_ignored: object,
) -> torch.Tensor:
    """Reference of ``paged_attention_decode``: gather each sequence, then ``attention_ref``.

    With a sliding window only the window's keys are gathered (table entries before block
    ``(seq_len - W) // block_size`` are not read), so null-padded tables work as in the kernel.

    Returns ``[num_seqs, num_heads, head_size]`` float32. Launch-only options of the kernel
    (``num_splits``, ``max_seq_len``, ``block_n``, ``out``) are accepted and ignored.
    """
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    for seq, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        # Keys before the window are never gathered; attention_ref only needs the positions
        # relative to the last key, so dropping a prefix of keys changes nothing else.
        start = first_key_position(seq_len, 1, sliding_window)
        key, value = _sequence_kv(
            key_cache, value_cache, block_table, seq, seq_len, start, layout, kv_cache_dtype,
            k_scale, v_scale,
        )
        out[seq] = attention_ref(
            query[seq : seq + 1], key, value, scale, sliding_window=sliding_window,
            softcap=softcap,
        )[0]
    return out


def paged_attention_varlen_ref(
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
    **_ignored: object,
) -> torch.Tensor:
    """Reference of ``paged_attention_varlen``: per sequence, the last ``query_len`` positions.

    With a sliding window only keys from ``first_key_position`` on are gathered.

    Returns ``[num_tokens, num_heads, head_size]`` float32.
    """
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    qsl = query_start_loc.tolist()
    for seq, seq_len in enumerate(seq_lens.tolist()):
        start, end = qsl[seq], qsl[seq + 1]
        if end == start:
            continue
        first = first_key_position(seq_len, end - start, sliding_window)
        key, value = _sequence_kv(
            key_cache, value_cache, block_table, seq, seq_len, first, layout, kv_cache_dtype,
            k_scale, v_scale,
        )
        out[start:end] = attention_ref(
            query[start:end], key, value, scale, sliding_window=sliding_window, softcap=softcap
        )
    return out


def copy_blocks_ref(caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Reference of ``copy_blocks``: ``cache[dst] = cache[src]`` for every pair and cache."""
    for src, dst in block_mapping.tolist():
        for cache in caches:
            cache[dst] = cache[src]


def gather_kv_ref(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    layout: str = "NHD",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of ``gather_kv``: ``[sum(seq_lens), H, D]`` K and V in the cache dtype."""
    keys, values = [], []
    k_nhd, v_nhd = as_nhd(key_cache, layout), as_nhd(value_cache, layout)
    block_size = k_nhd.shape[1]
    for seq, seq_len in enumerate(seq_lens.tolist()):
        block_ids = block_table[seq, : math.ceil(seq_len / block_size)].tolist()
        keys.append(_gather_sequence(k_nhd, block_ids, seq_len))
        values.append(_gather_sequence(v_nhd, block_ids, seq_len))
    empty = k_nhd.new_empty((0, *k_nhd.shape[2:]))
    return (torch.cat(keys) if keys else empty, torch.cat(values) if values else empty)

