"""Paged KV-cache layouts: shapes, names and zero-copy views between vLLM's and FlashInfer's forms.

Glossary: **page == block**, ``page_size == block_size``. FlashInfer and SGLang say "page"; kvcheck
always says "block". A *slot* is one token's row in the cache: ``slot = block_id * block_size +
block_offset`` (int64), and ``PAD_SLOT_ID`` (-1) marks a token that kernels must skip.

Per-tensor layouts (one tensor for K, one for V):

* **NHD** ``[num_blocks, block_size, num_kv_heads, head_size]``: vLLM's FlashAttention/Triton
  backends and the default everywhere in kvcheck.
* **HND** ``[num_blocks, num_kv_heads, block_size, head_size]``: head-major; FlashInfer's choice
  for low-precision kernels.

Combined forms (K and V in one allocation), each turned into a ``(key_cache, value_cache)`` pair of
*views* by the functions below; no function here copies data:

* vLLM ``2 x NHD``: ``[2, num_blocks, block_size, H, D]``; ``kv[0]`` is K, ``kv[1]`` is V.
* FlashInfer ``[num_blocks, 2, block_size, H, D]`` (NHD) or ``[num_blocks, 2, H, block_size, D]``
  (HND); ``kv[:, 0]`` is K. vLLM's tensor ``.transpose(0, 1)`` is FlashInfer's NHD tensor.
* Packed K||V (vLLM 0.33 TRITON_ATTN): ``[num_blocks, H, block_size, 2 * D]``; K is the first D
  channels of each row. ``kv.transpose(1, 2).split(D, -1)`` gives two strided NHD views.

Every kernel in ``kvcheck.gpu_kernels`` takes caches as one of the two per-tensor layouts with
arbitrary strides, as long as the head dimension is contiguous (``stride(-1) == 1``), so all the
combined forms above can be passed without a copy.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from kvcheck.errors import KVCheckInputError

try:  # The reference manager owns the sentinel; fall back if it is not installed.
    from kvcheck.reference_impl.block_table import PAD_SLOT_ID
except ImportError:  # pragma: no cover - only without kvcheck.reference_impl
    PAD_SLOT_ID = -1  # vLLM v1/attention/backends/utils.py: PAD_SLOT_ID = -1

__all__ = [
    "KV_CACHE_FORMS",
    "PAD_SLOT_ID",
    "KVCacheForm",
    "KVCachePair",
    "KVLayout",
    "allocate_kv_cache",
    "as_nhd",
    "block_table_to_flashinfer_csr",
    "flashinfer_csr_to_block_table",
    "flashinfer_kv_cache_shape",
    "flashinfer_to_vllm",
    "hnd_to_nhd",
    "kv_cache_shape",
    "nhd_to_hnd",
    "packed_kv_cache_shape",
    "slot_to_block",
    "split_flashinfer_kv_cache",
    "split_packed_kv_cache",
    "split_vllm_kv_cache",
    "vllm_kv_cache_shape",
    "vllm_to_flashinfer",
]

#: "NHD" = ``[num_blocks, block_size, num_kv_heads, head_size]``;
#: "HND" = ``[num_blocks, num_kv_heads, block_size, head_size]``.
KVLayout = Literal["NHD", "HND"]

#: How one K/V pair is allocated; see ``allocate_kv_cache``.
KVCacheForm = Literal[
    "nhd", "hnd", "vllm_2nhd", "flashinfer_nhd", "flashinfer_hnd", "packed_kv"
]
KV_CACHE_FORMS: tuple[str, ...] = (
    "nhd",
    "hnd",
    "vllm_2nhd",
    "flashinfer_nhd",
    "flashinfer_hnd",
    "packed_kv",
)


class KVCachePair(NamedTuple):
    """A K/V cache pair as the kernels take it.

    Attributes:
        key_cache, value_cache: 4-D views in ``layout`` (possibly strided, never copied).
        layout: "NHD" or "HND".
        storage: the tensor that owns the memory (the pair itself for "nhd"/"hnd").
    """

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    layout: str
    storage: torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def kv_cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, layout: str = "NHD"
) -> tuple[int, int, int, int]:
    """Shape of one K (or V) cache tensor.

    >>> kv_cache_shape(100, 16, 8, 128)
    (100, 16, 8, 128)
    >>> kv_cache_shape(100, 16, 8, 128, "HND")
    (100, 8, 16, 128)
    """
    _check_layout(layout)
    if layout == "NHD":
        return (num_blocks, block_size, num_kv_heads, head_size)
    return (num_blocks, num_kv_heads, block_size, head_size)


def vllm_kv_cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
) -> tuple[int, int, int, int, int]:
    """vLLM FlashAttention backend's combined shape ``(2, num_blocks, block_size, H, D)``."""
    return (2, num_blocks, block_size, num_kv_heads, head_size)


def flashinfer_kv_cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, layout: str = "NHD"
) -> tuple[int, int, int, int, int]:
    """FlashInfer's 5-D shape: ``(N, 2, P, H, D)`` (NHD) or ``(N, 2, H, P, D)`` (HND)."""
    return (num_blocks, 2, *kv_cache_shape(1, block_size, num_kv_heads, head_size, layout)[1:])


def packed_kv_cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
) -> tuple[int, int, int, int]:
    """vLLM 0.33 TRITON_ATTN's packed K||V shape ``(num_blocks, H, block_size, 2 * D)``."""
    return (num_blocks, num_kv_heads, block_size, 2 * head_size)


def nhd_to_hnd(cache: torch.Tensor) -> torch.Tensor:
    """View an NHD cache as HND (``permute(0, 2, 1, 3)``; no copy, strides follow)."""
    _check_rank(cache, 4, "cache")
    return cache.permute(0, 2, 1, 3)


def hnd_to_nhd(cache: torch.Tensor) -> torch.Tensor:
    """View an HND cache as NHD (the same permutation; it is its own inverse)."""
    _check_rank(cache, 4, "cache")
    return cache.permute(0, 2, 1, 3)


def as_nhd(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """The NHD view of a cache in ``layout``; kernels index every cache through this view."""
    _check_layout(layout)
    return cache if layout == "NHD" else hnd_to_nhd(cache)


def split_vllm_kv_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[2, num_blocks, P, H, D]`` -> ``(key_cache, value_cache)``, each a contiguous NHD view."""
    _check_rank(kv_cache, 5, "kv_cache")
    if kv_cache.shape[0] != 2:
        raise KVCheckInputError(
            f"vLLM kv_cache must have shape [2, ...], got {tuple(kv_cache.shape)}")
    return kv_cache[0], kv_cache[1]


def split_flashinfer_kv_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[num_blocks, 2, ...]`` -> ``(kv[:, 0], kv[:, 1])``: strided views, same layout as input.

    The block stride of each view is ``2 * P * H * D``: K and V of block ``b`` are neighbours in
    memory, which is why kernels take ``stride(0)`` instead of assuming ``P * H * D``.
    """
    _check_rank(kv_cache, 5, "kv_cache")
    if kv_cache.shape[1] != 2:
        raise KVCheckInputError(
            f"FlashInfer kv_cache must have shape [num_blocks, 2, ...], got {tuple(kv_cache.shape)}"
        )
    return kv_cache[:, 0], kv_cache[:, 1]


def split_packed_kv_cache(
    kv_cache: torch.Tensor, head_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[num_blocks, H, P, 2 * D]`` -> two strided NHD views ``[num_blocks, P, H, D]``.

    Element ``(b, p, h, d)`` of K is ``kv[b, h, p, d]`` and of V ``kv[b, h, p, D + d]``, so the
    views have ``stride(1) = 2 * D`` (slot), ``stride(2) = P * 2 * D`` (head) and a contiguous
    head dimension. E.g. P=16, H=2, D=64: K's strides are ``(4096, 128, 2048, 1)``.
    """
    _check_rank(kv_cache, 4, "kv_cache")
    if kv_cache.shape[-1] != 2 * head_size:
        raise KVCheckInputError(
            f"packed kv_cache last dim must be 2 * head_size = {2 * head_size}, "
            f"got {kv_cache.shape[-1]}"
        )
    key_cache, value_cache = torch.split(kv_cache.transpose(1, 2), head_size, dim=-1)
    return key_cache, value_cache


def vllm_to_flashinfer(kv_cache: torch.Tensor) -> torch.Tensor:
    """``[2, num_blocks, P, H, D]`` -> ``[num_blocks, 2, P, H, D]`` (a view, no copy)."""
    _check_rank(kv_cache, 5, "kv_cache")
    return kv_cache.transpose(0, 1)


def flashinfer_to_vllm(kv_cache: torch.Tensor) -> torch.Tensor:
    """``[num_blocks, 2, P, H, D]`` -> ``[2, num_blocks, P, H, D]`` (a view, no copy)."""
    _check_rank(kv_cache, 5, "kv_cache")
    return kv_cache.transpose(0, 1)


def allocate_kv_cache(
    form: str,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> KVCachePair:
    """Allocate (uninitialised) K/V caches in one of ``KV_CACHE_FORMS`` and return kernel views.

    Forms: "nhd" / "hnd" (two separate contiguous tensors), "vllm_2nhd" (``[2, N, P, H, D]``),
    "flashinfer_nhd" (``[N, 2, P, H, D]``), "flashinfer_hnd" (``[N, 2, H, P, D]``) and
    "packed_kv" (``[N, H, P, 2 * D]`` viewed as strided NHD). The returned ``layout`` tells the
    kernels how to read the views.
    """
    shape_args = (num_blocks, block_size, num_kv_heads, head_size)
    if form in ("nhd", "hnd"):
        layout = form.upper()
        key_cache = torch.empty(kv_cache_shape(*shape_args, layout), dtype=dtype, device=device)
        value_cache = torch.empty(kv_cache_shape(*shape_args, layout), dtype=dtype, device=device)
        return KVCachePair(key_cache, value_cache, layout, (key_cache, value_cache))
    if form == "vllm_2nhd":
        storage = torch.empty(vllm_kv_cache_shape(*shape_args), dtype=dtype, device=device)
        return KVCachePair(*split_vllm_kv_cache(storage), "NHD", storage)
    if form in ("flashinfer_nhd", "flashinfer_hnd"):
        layout = form.split("_")[1].upper()
        storage = torch.empty(flashinfer_kv_cache_shape(*shape_args, layout), dtype=dtype,
                              device=device)
        return KVCachePair(*split_flashinfer_kv_cache(storage), layout, storage)
    if form == "packed_kv":
        storage = torch.empty(packed_kv_cache_shape(*shape_args), dtype=dtype, device=device)
        return KVCachePair(*split_packed_kv_cache(storage, head_size), "NHD", storage)
    raise KVCheckInputError(f"unknown KV cache form {form!r}; use one of {KV_CACHE_FORMS}")


def slot_to_block(slot: int, block_size: int) -> tuple[int, int]:
    """``(block_id, block_offset)`` of a non-negative slot.

    Worked example, block_size 16: slot 45 is ``(2, 13)`` because ``45 = 2 * 16 + 13``; a
    request whose block table is ``[7, 2, 9]`` stores its position 29 (``block_idx = 29 // 16 =
    1``, ``block_offset = 29 % 16 = 13``) in that slot.

    >>> slot_to_block(45, 16)
    (2, 13)
    """
    if slot < 0:
        raise KVCheckInputError(f"slot {slot} is negative (PAD_SLOT_ID marks padding, not a slot)")
    return slot // block_size, slot % block_size


def block_table_to_flashinfer_csr(
    block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's dense block table -> FlashInfer's CSR page table (all int32, as FlashInfer wants).

    ``num_pages[b] = ceil(seq_lens[b] / P)``; ``kv_indptr = [0, cumsum(num_pages)]``;
    ``kv_indices`` concatenates ``block_table[b, :num_pages[b]]``; ``kv_last_page_len[b] =
    seq_lens[b] - (num_pages[b] - 1) * P`` (in ``(0, P]``; 0 only for an empty sequence, which
    FlashInfer itself rejects). E.g. P = 16, rows ``[[3, 1, 2], [7, 0, 0]]``, seq_lens
    ``[45, 16]`` -> indptr ``[0, 3, 4]``, indices ``[3, 1, 2, 7]``, last ``[13, 16]``
    (``45 = (3 - 1) * 16 + 13``).
    """
    seq_lens = seq_lens.to(torch.int64)
    num_pages = (seq_lens + block_size - 1) // block_size
    kv_indptr = torch.zeros(len(seq_lens) + 1, dtype=torch.int64, device=seq_lens.device)
    kv_indptr[1:] = torch.cumsum(num_pages, 0)
    rows = [block_table[b, : int(n)] for b, n in enumerate(num_pages.tolist())]
    kv_indices = torch.cat(rows) if rows else block_table.new_zeros(0)
    last = torch.where(num_pages > 0, seq_lens - (num_pages - 1) * block_size, 0)
    return kv_indptr.to(torch.int32), kv_indices.to(torch.int32), last.to(torch.int32)


def flashinfer_csr_to_block_table(
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer CSR -> ``(block_table int32 [B, max_pages], seq_lens int32 [B])``.

    Unused table entries are 0 (vLLM's null block); ``seq_lens[b] = P * (num_pages[b] - 1) +
    kv_last_page_len[b]`` for a non-empty row, else 0.
    """
    indptr = kv_indptr.tolist()
    num_pages = [indptr[b + 1] - indptr[b] for b in range(len(indptr) - 1)]
    width = max(num_pages, default=0)
    block_table = torch.zeros((len(num_pages), width), dtype=torch.int32,
                              device=kv_indices.device)
    for b, n in enumerate(num_pages):
        block_table[b, :n] = kv_indices[indptr[b] : indptr[b] + n]
    pages = torch.tensor(num_pages, dtype=torch.int64, device=kv_last_page_len.device)
    seq_lens = torch.where(pages > 0, (pages - 1) * block_size + kv_last_page_len, 0)
    return block_table, seq_lens.to(torch.int32)


def _check_layout(layout: str) -> None:
    if layout not in ("NHD", "HND"):
        raise KVCheckInputError(f"layout must be 'NHD' or 'HND', got {layout!r}")


def _check_rank(tensor: torch.Tensor, rank: int, name: str) -> None:
    if tensor.dim() != rank:
        raise KVCheckInputError(f"{name} must be {rank}-D, got shape {tuple(tensor.shape)}")
