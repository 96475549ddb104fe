"""Named kernel test cases and the deterministic inputs they describe (used by ``conformance``).

A case is a small frozen dataclass (``case_sweeps``: the cases and their sweeps, without
torch); ``build_*_inputs(case)`` turns it into tensors on ``case.device`` from a CPU generator
seeded with ``case.seed``, so a case name reproduces the same inputs on any machine. The
sweeps follow the style guide's rule for kernel tests: ragged lengths (1, block_size - 1,
block_size, block_size + 1, primes), block sizes 1 / 16 / 32, GQA ratios 1 / 4 / 8, head sizes
64 / 128, block ids permuted and shared (never ``arange``), padded slots, and every cache form
of ``kvcheck.gpu_kernels.layout``.

Attention inputs are *poisoned*: every cache slot that belongs to no sequence (the tail of each
last block, unused blocks and block 0, which unused block-table entries point at) holds NaN, so a
kernel that reads past ``seq_len`` or through an unused table entry produces NaN. Cases with
``null_padded_window`` also null-pad the tables the way a sliding-window KV-cache group does
(``kvcheck.gpu_kernels.null_blocks``): the blocks before each sequence's window become block 0,
and the blocks they held are poisoned like any unused block.
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

import torch

from kvcheck.errors import KVCheckInputError
from kvcheck.gpu_kernels.case_sweeps import (
    AttentionCase,
    StoreCase,
    decode_cases,
    store_cases,
    varlen_cases,
)
from kvcheck.gpu_kernels.layout import PAD_SLOT_ID, KVCachePair, allocate_kv_cache
from kvcheck.gpu_kernels.reference import first_key_position

__all__ = [
    "DTYPES",
    "AttentionCase",
    "StoreCase",
    "build_attention_inputs",
    "build_store_inputs",
    "clone_kv_cache",
    "decode_cases",
    "store_cases",
    "varlen_cases",
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def clone_kv_cache(pair: KVCachePair, form: str) -> KVCachePair:
    """A fresh allocation of the same form holding the same bits (views re-derived)."""
    k = pair.key_cache
    layout_nhd = pair.layout == "NHD"
    num_blocks = k.shape[0]
    block_size = k.shape[1] if layout_nhd else k.shape[2]
    num_kv_heads = k.shape[2] if layout_nhd else k.shape[1]
    new = allocate_kv_cache(form, num_blocks, block_size, num_kv_heads, k.shape[3], k.dtype,
                            k.device)
    if isinstance(pair.storage, tuple) and isinstance(new.storage, tuple):
        for dst, src in zip(new.storage, pair.storage, strict=True):
            dst.copy_(src)
    elif isinstance(pair.storage, torch.Tensor) and isinstance(new.storage, torch.Tensor):
        new.storage.copy_(pair.storage)
    else:
        raise AssertionError("one form allocates one kind of storage")
    return new


def _random_fp8(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random finite e4m3 values (every code except the two NaNs), as float32."""
    codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32)
    codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes).to(torch.uint8)
    return codes.view(torch.float8_e4m3fn).float()


class StoreOptions(TypedDict, total=False):
    """The optional arguments of a store case (``store_kv_cache``'s keywords)."""

    kv_cache_dtype: str
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    layout: str


class StoreInputs(TypedDict):
    """``build_store_inputs``' answer (see there)."""

    key: torch.Tensor
    value: torch.Tensor
    cache: KVCachePair
    slot_mapping: torch.Tensor
    kwargs: StoreOptions


class _AttentionInputs(TypedDict):
    query: torch.Tensor
    cache: KVCachePair
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    # Any: the keywords forwarded to the kernel and its reference: the options built here and
    # any a case adds (``extra_kwargs``), which each function takes or ignores.
    kwargs: dict[str, Any]


class AttentionInputs(_AttentionInputs, total=False):
    """``build_attention_inputs``' answer (see there); ``query_start_loc`` varlen only."""

    query_start_loc: torch.Tensor


def build_store_inputs(case: StoreCase) -> StoreInputs:
    """Tensors for one store case.

    Returns a dict: ``key``, ``value`` (strided ``[num_tokens, H, D]`` slices of a fused QKV-like
    tensor), ``cache`` (a ``KVCachePair`` pre-filled with random data, so a missing or stray
    write is visible), ``slot_mapping`` (int64, unique random slots, ``num_pad`` entries
    ``PAD_SLOT_ID``), ``k_scale``/``v_scale`` (float32 ``[1]`` tensors) and ``kwargs`` (the
    optional arguments to pass).
    """
    gen = _generator(case.seed)
    dtype = DTYPES[case.dtype]
    is_fp8 = case.kv_cache_dtype != "auto"
    shape = (case.num_tokens, 3, case.num_kv_heads, case.head_size)
    if is_fp8 and case.fp8_exact:
        # x = q * 2**-1 with q an e4m3 value: x / 0.5 == q exactly, so no rounding happens.
        qkv = (_random_fp8(shape, gen) * 0.5).to(dtype)
        k_scale = v_scale = torch.tensor([0.5])
    else:
        qkv = (torch.randn(shape, generator=gen) * 3.0).to(dtype)
        # vLLM's test_cache.py convention: scale = amax / 64, keeping x / scale inside e4m3.
        k_scale = (qkv[:, 1].float().abs().amax() / 64.0).reshape(1)
        v_scale = (qkv[:, 2].float().abs().amax() / 64.0).reshape(1)
    num_slots = case.num_blocks * case.block_size
    num_real = case.num_tokens - case.num_pad
    if num_real > num_slots:
        raise KVCheckInputError(
            f"case {case.name}: {num_real} tokens need more than {num_slots} slots")
    slots = torch.randperm(num_slots, generator=gen)[:num_real]  # unique, any order
    slot_mapping = torch.full((case.num_tokens,), PAD_SLOT_ID, dtype=torch.int64)
    real_rows = torch.randperm(case.num_tokens, generator=gen)[:num_real]
    slot_mapping[real_rows] = slots

    cache_dtype = torch.float8_e4m3fn if is_fp8 else dtype
    cache = allocate_kv_cache(case.form, case.num_blocks, case.block_size, case.num_kv_heads,
                              case.head_size, cache_dtype, case.device)
    for view in (cache.key_cache, cache.value_cache):
        init = (_random_fp8(tuple(view.shape), gen) if is_fp8 else
                torch.randn(tuple(view.shape), generator=gen))
        view.copy_(init.to(cache_dtype).to(case.device))
    qkv = qkv.to(case.device)
    kwargs: StoreOptions = {}
    if is_fp8:
        kwargs.update({"kv_cache_dtype": case.kv_cache_dtype, "k_scale": k_scale.to(case.device),
                       "v_scale": v_scale.to(case.device)})
    if cache.layout != "NHD":
        kwargs["layout"] = cache.layout
    return StoreInputs(key=qkv[:, 1], value=qkv[:, 2], cache=cache,
                       slot_mapping=slot_mapping.to(case.device), kwargs=kwargs)


def _block_tables(case: AttentionCase, gen: torch.Generator) -> tuple[list[list[int]], int]:
    """Per-sequence block ids (permuted, prefix-shared) and the pool size; block 0 stays unused."""
    bs = case.block_size
    needed = [math.ceil(n / bs) for n in case.seq_lens]
    shared = [0] + [
        min(case.shared_blocks, n // bs, case.seq_lens[0] // bs) for n in case.seq_lens[1:]
    ]
    num_distinct = sum(need - share for need, share in zip(needed, shared, strict=True))
    num_blocks = 1 + num_distinct + 3  # null block 0 + spares that nobody references
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    rows: list[list[int]] = []
    for seq, (need, share) in enumerate(zip(needed, shared, strict=True)):
        own = [ids.pop() for _ in range(need - share)]
        rows.append((rows[0][:share] if seq else []) + own)
    return rows, num_blocks


def _null_pad(case: AttentionCase, rows: list[list[int]]) -> list[list[int]]:
    """``rows`` with each sequence's blocks before its window replaced by the null block 0."""
    if case.sliding_window is None:
        raise KVCheckInputError(f"case {case.name}: null_padded_window needs a sliding_window")
    query_lens = (1,) * len(case.seq_lens) if case.query_lens is None else case.query_lens
    if len(query_lens) != len(case.seq_lens) or any(
            q > n for q, n in zip(query_lens, case.seq_lens, strict=True)):
        raise KVCheckInputError(f"case {case.name}: a query_len exceeds its seq_len")
    padded = []
    for row, seq_len, query_len in zip(rows, case.seq_lens, query_lens, strict=True):
        first = first_key_position(seq_len, query_len, case.sliding_window)
        skipped = first // case.block_size
        padded.append([0] * skipped + row[skipped:])
    return padded


def build_attention_inputs(case: AttentionCase) -> AttentionInputs:
    """Tensors for one attention case (decode when ``case.query_lens is None``).

    Returns a dict: ``query`` (``[num_seqs or num_tokens, num_heads, head_size]``), ``cache``
    (``KVCachePair``, poisoned with NaN outside the sequences), ``block_table`` (int32, width
    one more than needed, unused entries 0), ``seq_lens`` (int32), ``query_start_loc`` (int32,
    varlen only), ``scale`` and ``kwargs`` (the optional arguments to pass). With
    ``null_padded_window`` the table's entries before each sequence's window are 0 (the null
    block, NaN like every slot no live entry maps to); the blocks it dropped are poisoned too.
    """
    gen = _generator(case.seed)
    dtype = DTYPES[case.dtype]
    rows, num_blocks = _block_tables(case, gen)
    if case.null_padded_window:
        rows = _null_pad(case, rows)
    shape = (num_blocks, case.block_size, case.num_kv_heads, case.head_size)
    key = torch.randn(shape, generator=gen)
    value = torch.randn(shape, generator=gen)
    used = torch.zeros(num_blocks, case.block_size, dtype=torch.bool)
    for row, seq_len in zip(rows, case.seq_lens, strict=True):
        for pos in range(seq_len):
            if row[pos // case.block_size] != 0:  # null entries (null_padded_window) hold no key
                used[row[pos // case.block_size], pos % case.block_size] = True
    key[~used] = float("nan")
    value[~used] = float("nan")

    is_fp8 = case.kv_cache_dtype != "auto"
    kwargs: dict[str, object] = {}
    if is_fp8:
        k_scale = (key[used].abs().amax() / 64.0).reshape(1)
        v_scale = (value[used].abs().amax() / 64.0).reshape(1)
        key, value = (key / k_scale).to(torch.float8_e4m3fn), (value / v_scale).to(
            torch.float8_e4m3fn)
        kwargs.update(kv_cache_dtype=case.kv_cache_dtype, k_scale=k_scale.to(case.device),
                      v_scale=v_scale.to(case.device))
    else:
        key, value = key.to(dtype), value.to(dtype)
    cache = allocate_kv_cache(case.form, *shape, key.dtype, case.device)
    for view, data in ((cache.key_cache, key), (cache.value_cache, value)):
        view.copy_((data if cache.layout == "NHD" else data.permute(0, 2, 1, 3)).to(case.device))

    width = max(len(r) for r in rows) + 1
    block_table = torch.zeros((len(rows), width), dtype=torch.int32)
    for seq, row in enumerate(rows):
        block_table[seq, : len(row)] = torch.tensor(row, dtype=torch.int32)
    num_q = len(case.seq_lens) if case.query_lens is None else sum(case.query_lens)
    query = torch.randn((num_q, case.num_heads, case.head_size), generator=gen).to(dtype)
    if cache.layout != "NHD":
        kwargs["layout"] = cache.layout
    if case.sliding_window is not None:
        kwargs["sliding_window"] = case.sliding_window
    if case.softcap is not None:
        kwargs["softcap"] = case.softcap
    if case.num_splits is not None:
        kwargs["num_splits"] = case.num_splits
    kwargs.update(case.extra_kwargs)
    inputs = AttentionInputs(
        query=query.to(case.device), cache=cache, block_table=block_table.to(case.device),
        seq_lens=torch.tensor(case.seq_lens, dtype=torch.int32, device=case.device),
        scale=case.head_size**-0.5, kwargs=kwargs,
    )
    if case.query_lens is not None:
        if any(q > s for q, s in zip(case.query_lens, case.seq_lens, strict=False)):
            raise KVCheckInputError(f"case {case.name}: a query_len exceeds its seq_len")
        qsl = [0]
        for q in case.query_lens:
            qsl.append(qsl[-1] + q)
        inputs["query_start_loc"] = torch.tensor(qsl, dtype=torch.int32, device=case.device)
    return inputs
