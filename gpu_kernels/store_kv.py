"""K/V store into the paged cache: the Triton equivalent of vLLM's ``reshape_and_cache_flash``.

Token ``i`` is written to slot ``slot_mapping[i]``, i.e. block ``slot // block_size``, row
``slot % block_size``; a negative slot (``PAD_SLOT_ID``) writes nothing, so padding tokens leave
the cache bit-identical. All address arithmetic is int64, so caches with more than 2**31
elements are addressed correctly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvcheck.errors import KVCheckInputError
from kvcheck.gpu_kernels import _host
from kvcheck.gpu_kernels.layout import as_nhd

__all__ = ["store_kv_cache"]


@triton.jit
def _store_kv_cache_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_size] new keys (head dim contiguous)
    value_ptr,  # [num_tokens, num_kv_heads, head_size] new values
    key_cache_ptr,  # NHD view [num_blocks, KV_BLOCK_SIZE, num_kv_heads, head_size], strided
    value_cache_ptr,  # NHD view, same shape (strides may differ from key_cache's)
    slot_mapping_ptr,  # [num_tokens] int32/int64 flat slots; < 0 means "skip this token"
    k_scale_ptr,  # [1] float32 per-tensor K scale; read only when IS_FP8
    v_scale_ptr,  # [1] float32 per-tensor V scale; read only when IS_FP8
    key_stride_token,  # elements between tokens of `key`
    key_stride_head,  # elements between heads of `key`
    value_stride_token,
    value_stride_head,
    key_cache_stride_block,  # elements between blocks (NHD view's stride(0))
    key_cache_stride_slot,  # elements between rows of a block (stride(1))
    key_cache_stride_head,  # elements between heads (stride(2))
    value_cache_stride_block,
    value_cache_stride_slot,
    value_cache_stride_head,
    num_kv_heads,  # H
    head_size,  # D (may be below BLOCK_D; the tail is masked)
    KV_BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_H: tl.constexpr,  # heads per program (power of two)
    BLOCK_D: tl.constexpr,  # next power of two >= head_size
    IS_FP8: tl.constexpr,  # quantize: stored = (x / scale) cast to fp8 e4m3
):
    token_idx = tl.program_id(0)
    head_tile = tl.program_id(1)

    # int64 from here on: slot * strides exceeds 2**31 on large caches.
    slot = tl.load(slot_mapping_ptr + token_idx).to(tl.int64)
    if slot < 0:
        # PAD_SLOT_ID: padding (CUDA graphs) or a token stored by another rank.
        return
    block_id = slot // KV_BLOCK_SIZE
    block_offset = slot % KV_BLOCK_SIZE

    heads = (head_tile * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads < num_kv_heads)[:, None] & (dims < head_size)[None, :]
    token = token_idx.to(tl.int64)

    key = tl.load(
        key_ptr + token * key_stride_token + heads[:, None] * key_stride_head + dims[None, :],
        mask=mask,
    )
    value = tl.load(
        value_ptr + token * value_stride_token + heads[:, None] * value_stride_head + dims[None, :],
        mask=mask,
    )
    if IS_FP8:
        # vLLM semantics: divide by the per-tensor scale in fp32, then round to fp8.
        key = key.to(tl.float32) / tl.load(k_scale_ptr)
        value = value.to(tl.float32) / tl.load(v_scale_ptr)

    key_dst = (
        key_cache_ptr
        + block_id * key_cache_stride_block
        + block_offset * key_cache_stride_slot
        + heads[:, None] * key_cache_stride_head
        + dims[None, :]
    )
    value_dst = (
        value_cache_ptr
        + block_id * value_cache_stride_block
        + block_offset * value_cache_stride_slot
        + heads[:, None] * value_cache_stride_head
        + dims[None, :]
    )
    tl.store(key_dst, key.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_dst, value.to(value_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_cache(
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
    """Write new K/V rows into the paged caches, in place (vLLM ``reshape_and_cache_flash``).

    Args:
        key, value: ``[num_tokens', num_kv_heads, head_size]`` float32/float16/bfloat16, head
            dimension contiguous (other strides free, e.g. slices of a fused QKV output).
            ``num_tokens' >= num_tokens``: rows past ``len(slot_mapping)`` are ignored.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_size]`` (NHD) or
            ``[num_blocks, num_kv_heads, block_size, head_size]`` (HND, ``layout="HND"``); any
            strides with a contiguous head dimension, so the split views of vLLM's
            ``[2, N, ...]``, FlashInfer's ``[N, 2, ...]`` and the packed K||V form all work
            (see ``kvcheck.gpu_kernels.layout``).
        slot_mapping: ``[num_tokens]`` int64 (or int32). Token ``i`` goes to block
            ``slot // block_size``, row ``slot % block_size``; e.g. block_size 16, slot 45 ->
            block 2, row 13 (``45 = 2 * 16 + 13``). Negative slots (``PAD_SLOT_ID``) write
            nothing. Non-negative slots must be unique and ``< num_blocks * block_size``.
        kv_cache_dtype: "auto" (cache in a float dtype; values are cast to it) or "fp8" /
            "fp8_e4m3" (cache ``torch.float8_e4m3fn`` or uint8; stored value is
            ``fp8(x / scale)`` with round-to-nearest-even).
        k_scale, v_scale: per-tensor float32 scales (1-element tensors or floats; ``None``
            = 1.0); used only for fp8.
        layout: "NHD" or "HND", the layout of both caches.

    Raises:
        KVCheckInputError: wrong ranks or shapes, mismatched heads or head sizes, a non-contiguous
            head dimension, a non-integer ``slot_mapping``, an unsupported ``kv_cache_dtype``
            or cache dtype, tensors on different devices, or CPU tensors without
            ``TRITON_INTERPRET=1``.
    """
    _host.check_rank(key, 3, "key", "[num_tokens, num_kv_heads, head_size]")
    _host.check_rank(value, 3, "value", "[num_tokens, num_kv_heads, head_size]")
    if key.shape != value.shape:
        raise KVCheckInputError(
            f"key {tuple(key.shape)} and value {tuple(value.shape)} shapes differ")
    cache_doc = f"[num_blocks, ...] ({layout})"
    _host.check_rank(key_cache, 4, "key_cache", cache_doc)
    _host.check_rank(value_cache, 4, "value_cache", cache_doc)
    if key_cache.shape != value_cache.shape:
        raise KVCheckInputError(
            f"key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} "
            f"shapes differ"
        )
    k_nhd, v_nhd = as_nhd(key_cache, layout), as_nhd(value_cache, layout)
    _, block_size, num_kv_heads, head_size = k_nhd.shape
    if key.shape[1] != num_kv_heads:
        raise KVCheckInputError(
            f"key has {key.shape[1]} heads but the {layout} cache has {num_kv_heads} KV heads; "
            f"check layout= (NHD is [blocks, block_size, heads, dim], HND [blocks, heads, "
            f"block_size, dim])"
        )
    if key.shape[2] != head_size:
        raise KVCheckInputError(f"key head_size {key.shape[2]} != cache head_size {head_size}")
    for name, tensor in (("key", key), ("value", value), ("key_cache", key_cache),
                         ("value_cache", value_cache)):
        _host.check_head_dim_contiguous(tensor, name)
    _host.check_index_tensor(
        slot_mapping, "slot_mapping", 1, "[num_tokens]", (torch.int64, torch.int32)
    )
    num_tokens = slot_mapping.shape[0]
    if key.shape[0] < num_tokens:
        raise KVCheckInputError(
            f"slot_mapping has {num_tokens} entries but key has only {key.shape[0]} tokens"
        )
    if key.dtype not in _host.FLOAT_DTYPES or value.dtype != key.dtype:
        raise KVCheckInputError(
            f"key/value must share a float32/float16/bfloat16 dtype, got {key.dtype} and "
            f"{value.dtype} (fp8 inputs are not supported; pass the unquantized activations)"
        )
    _host.check_same_device(
        key=key, value=value, key_cache=key_cache, value_cache=value_cache,
        slot_mapping=slot_mapping,
    )
    k_nhd, v_nhd, is_fp8 = _host.resolve_kv_cache(k_nhd, v_nhd, kv_cache_dtype)
    k_scale_t = _host.resolve_scale(k_scale, "k_scale", key.device)
    v_scale_t = _host.resolve_scale(v_scale, "v_scale", key.device)
    _host.check_device_runnable(_store_kv_cache_kernel, key)
    if num_tokens == 0 or num_kv_heads == 0:
        return

    block_d = triton.next_power_of_2(head_size)
    # ~2K elements per program: enough work per program, few programs under the interpreter.
    block_h = min(triton.next_power_of_2(num_kv_heads), max(1, 2048 // block_d))
    grid = (num_tokens, triton.cdiv(num_kv_heads, block_h))
    _store_kv_cache_kernel[grid](
        key, value, k_nhd, v_nhd, slot_mapping, k_scale_t, v_scale_t,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_nhd.stride(0), k_nhd.stride(1), k_nhd.stride(2),
        v_nhd.stride(0), v_nhd.stride(1), v_nhd.stride(2),
        num_kv_heads, head_size,
        KV_BLOCK_SIZE=block_size, BLOCK_H=block_h, BLOCK_D=block_d, IS_FP8=is_fp8,
    )
