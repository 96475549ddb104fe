"""Named kernel test cases and the deterministic inputs they describe (used by ``conformance``).

A case is a small frozen dataclass; ``build_*_inputs(case)`` turns it into tensors on
``case.device`` from a CPU generator seeded with ``case.seed``, so a case name reproduces the
same inputs on any machine. The sweeps follow the style guide's rule for kernel tests: ragged
lengths (1, block_size - 1, block_size, block_size + 1, primes), block sizes 1 / 16 / 32, GQA
ratios 1 / 4 / 8, head sizes 64 / 128, block ids permuted and shared (never ``arange``), padded
slots, and every cache form of ``kvcheck.gpu_kernels.layout``.

Attention inputs are *poisoned*: every cache slot that belongs to no sequence (the tail of each
last block, unused blocks and block 0, which unused block-table entries point at) holds NaN, so a
kernel that reads past ``seq_len`` or through an unused table entry produces NaN. Cases with
``null_padded_window`` also null-pad the tables the way a sliding-window KV-cache group does
(``kvcheck.gpu_kernels.null_blocks``): the blocks before each sequence's window become block 0,
and the blocks they held are poisoned like any unused block.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from kvcheck.errors import KVCheckInputError
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
_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class StoreCase:
    """One ``store_kv_cache`` call: shapes, dtypes, cache form and padding."""

    name: str
    device: str
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    num_tokens: int  # rows of key/value, PAD_SLOT_ID ones included
    dtype: str = "float16"  # key/value dtype; also the cache dtype when kv_cache_dtype="auto"
    kv_cache_dtype: str = "auto"
    form: str = "nhd"  # a kvcheck.gpu_kernels.layout.KV_CACHE_FORMS entry
    num_pad: int = 0  # tokens whose slot is PAD_SLOT_ID
    fp8_exact: bool = False  # fp8: inputs exactly representable after scaling (no rounding)
    seed: int = 0


@dataclass(frozen=True)
class AttentionCase:
    """One paged-attention call. ``query_lens is None`` means decode (one token per sequence)."""

    name: str
    device: str
    block_size: int
    num_kv_heads: int
    queries_per_kv: int  # GQA ratio: num_heads = num_kv_heads * queries_per_kv
    head_size: int
    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...] | None = None
    dtype: str = "float16"
    kv_cache_dtype: str = "auto"
    form: str = "nhd"
    sliding_window: int | None = None
    softcap: float | None = None
    num_splits: int | None = None  # decode only; None = the kernel's own choice
    shared_blocks: int = 0  # leading full blocks every sequence shares with sequence 0
    # A sliding-window group's table (needs sliding_window): the blocks before each sequence's
    # window are the null block 0 (remove_skipped_blocks), and block 0 and the dropped blocks
    # hold NaN, so a kernel that reads through a null entry produces NaN.
    null_padded_window: bool = False
    seed: int = 0
    extra_kwargs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads * self.queries_per_kv


# ---------------------------------------------------------------------------------------------
# Sweeps
# ---------------------------------------------------------------------------------------------


def _ragged_lens(block_size: int, quick: bool) -> tuple[int, ...]:
    """1, block_size - 1, block_size, block_size + 1 and primes (deduplicated, order kept)."""
    lens = [1, max(1, block_size - 1), block_size, block_size + 1, 37 if quick else 1013]
    if not quick:
        lens += [2 * block_size + 3, 4099, 257]
    return tuple(dict.fromkeys(lens))


def store_cases(device: str, quick: bool = True) -> Iterator[StoreCase]:
    """``store_kv_cache`` cases: every cache form, dtype, block size 1/16/32, fp8, padding.

    On CPU (Triton's interpreter) fp8 cases use exactly representable inputs: the 3.9
    interpreter's fp32 -> e4m3 cast loses the mantissa carry (1.99 becomes 1.0), so only CUDA
    exercises real fp8 rounding. ``quick=False`` adds larger shapes for GPU runs.
    """
    tokens = 37 if quick else 1021  # prime, so no tile divides it
    case = partial(StoreCase, device=device, num_blocks=11 if quick else 257, num_tokens=tokens,
                   num_pad=5)
    for form in ("nhd", "hnd", "vllm_2nhd", "flashinfer_nhd", "flashinfer_hnd", "packed_kv"):
        yield case(f"{form}-f16-bs16-h2-d64", block_size=16, num_kv_heads=2, head_size=64,
                   form=form)
    for dtype in ("float32", "bfloat16"):
        yield case(f"nhd-{_SHORT[dtype]}-bs16-h3-d128", block_size=16, num_kv_heads=3,
                   head_size=128, dtype=dtype, seed=1)
    yield case("nhd-f16-bs1-h4-d128", block_size=1, num_kv_heads=4, head_size=128, seed=2,
               num_blocks=64 if quick else 2048)
    yield case("hnd-f32-bs32-h1-d64", block_size=32, num_kv_heads=1, head_size=64,
               dtype="float32", form="hnd", seed=3)
    yield case("nhd-f16-all-padding", block_size=16, num_kv_heads=2, head_size=64,
               num_tokens=4, num_pad=4)
    fp8_exact = device == "cpu"
    for form, dtype in (("nhd", "float16"), ("hnd", "bfloat16"), ("packed_kv", "float32")):
        tag = "exact" if fp8_exact else "rounded"
        yield case(f"{form}-fp8-{tag}-{_SHORT[dtype]}-bs16-h2-d64", block_size=16,
                   num_kv_heads=2, head_size=64, dtype=dtype, kv_cache_dtype="fp8", form=form,
                   fp8_exact=fp8_exact, seed=4)
    if not quick:
        yield case("nhd-bf16-bs32-h8-d128-big", block_size=32, num_kv_heads=8, head_size=128,
                   dtype="bfloat16", seed=5)
        yield case("nhd-fp8-exact-f16-bs16-h8-d128", block_size=16, num_kv_heads=8,
                   head_size=128, kv_cache_dtype="fp8", fp8_exact=True, seed=6)


_DTYPE_CYCLE = ("float16", "bfloat16", "float32")
_FORM_CYCLE = ("nhd", "hnd", "packed_kv", "flashinfer_nhd", "vllm_2nhd", "flashinfer_hnd")


def decode_cases(device: str, quick: bool = True) -> Iterator[AttentionCase]:
    """``paged_attention_decode`` cases (``query_lens=None``): ragged lengths, GQA, features."""
    i = 0
    for block_size in (1, 16, 32):
        for qpk in (1, 4, 8):
            for head_size in (64, 128):
                dtype = _DTYPE_CYCLE[i % 3]
                form = _FORM_CYCLE[i % len(_FORM_CYCLE)]
                yield AttentionCase(
                    f"{form}-{_SHORT[dtype]}-bs{block_size}-gqa{qpk}-d{head_size}",
                    device, block_size, num_kv_heads=2 if qpk < 8 else 1, queries_per_kv=qpk,
                    head_size=head_size, seq_lens=_ragged_lens(block_size, quick), dtype=dtype,
                    form=form, shared_blocks=1 if block_size > 1 else 3, seed=i,
                )
                i += 1
    yield from _feature_cases(device, quick, decode=True)
    yield from _null_padded_cases(device, quick, decode=True)


def varlen_cases(device: str, quick: bool = True) -> Iterator[AttentionCase]:
    """``paged_attention_varlen`` cases: mixed prefill / extend / decode batches."""
    for i, (block_size, qpk, head_size) in enumerate(
        ((16, 4, 64), (1, 1, 128), (32, 8, 64), (16, 1, 128))
    ):
        dtype = _DTYPE_CYCLE[i % 3]
        form = _FORM_CYCLE[i % len(_FORM_CYCLE)]
        seq_lens, query_lens = _mixed_batch(block_size, quick)
        yield AttentionCase(
            f"{form}-{_SHORT[dtype]}-bs{block_size}-gqa{qpk}-d{head_size}-mixed",
            device, block_size, num_kv_heads=2 if qpk < 8 else 1, queries_per_kv=qpk,
            head_size=head_size, seq_lens=seq_lens, query_lens=query_lens, dtype=dtype,
            form=form, shared_blocks=1 if block_size > 1 else 4, seed=100 + i,
        )
    yield from _feature_cases(device, quick, decode=False)
    yield from _null_padded_cases(device, quick, decode=False)


def _mixed_batch(block_size: int, quick: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(seq_lens, query_lens): prefill, decode, extends across block edges, an empty query."""
    bs = block_size
    pairs = [
        (bs + 1, bs + 1),  # prefill (context 0) one past a block edge
        (2 * bs + 5, 1),  # decode
        (37, 3),  # extend, prime length
        (bs + 2, bs - 1 if bs > 1 else 1),  # extend ending just past a block edge
        (13, 0),  # no new tokens this step
        (1, 1),  # first token of a prompt
    ]
    if not quick:
        pairs += [(1013, 517), (2 * bs, 2 * bs), (4099, 1), (300, 97)]
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def _feature_cases(device: str, quick: bool, decode: bool) -> Iterator[AttentionCase]:
    """Sliding window, softcap, fp8 and (decode) split-KV, each on its own."""
    long = 100 if quick else 3001
    if decode:
        lens: tuple[int, ...] = (1, 15, 16, 17, long, 37)
        qlens = None
    else:
        lens, qlens = (17, long, 9, 40), (17, 1, 4, 23)
    kind = "decode" if decode else "varlen"
    case = partial(AttentionCase, device=device, block_size=16, num_kv_heads=2, head_size=64,
                   seq_lens=lens, query_lens=qlens, shared_blocks=1)
    yield case(f"{kind}-window5-f16-gqa4", queries_per_kv=4, sliding_window=5, seed=200)
    yield case(f"{kind}-window33-bf16-gqa1-hnd", queries_per_kv=1, sliding_window=33,
               dtype="bfloat16", form="hnd", seed=201)
    yield case(f"{kind}-softcap1-f32-gqa4", queries_per_kv=4, softcap=1.0, dtype="float32",
               seed=202)
    yield case(f"{kind}-softcap30-window7-f16-gqa8", queries_per_kv=8, softcap=30.0,
               sliding_window=7, seed=203)
    for dtype, form in (("float16", "nhd"), ("bfloat16", "hnd"), ("float32", "packed_kv")):
        yield case(f"{kind}-fp8-{_SHORT[dtype]}-{form}-gqa4", queries_per_kv=4, dtype=dtype,
                   kv_cache_dtype="fp8", form=form, seed=204)
    if decode:
        for num_splits in (2, 3, 7):
            yield case(f"decode-split{num_splits}-f16-gqa4", queries_per_kv=4,
                       num_splits=num_splits, seed=210 + num_splits)
        yield case("decode-split4-window20-fp8-bf16", queries_per_kv=4, num_splits=4,
                   sliding_window=20, dtype="bfloat16", kv_cache_dtype="fp8", seed=215)


def _null_padded_cases(device: str, quick: bool, decode: bool) -> Iterator[AttentionCase]:
    """Sliding-window groups' null-padded tables: block size 4 (many null entries, one KV tile
    spanning null and live blocks), block size 16 with split-KV (decode) or multi-tile queries."""
    kind = "decode" if decode else "varlen"
    case = partial(AttentionCase, device=device, num_kv_heads=2, head_size=64,
                   null_padded_window=True)
    if decode:
        yield case("decode-nullpad-window7-f16-gqa4-bs4", block_size=4, queries_per_kv=4,
                   sliding_window=7, shared_blocks=1, seed=300,
                   seq_lens=(1, 4, 5, 9, 30, 67) if quick else (1, 4, 5, 9, 30, 1027, 4099))
        yield case("decode-nullpad-window33-split3-bf16-hnd", block_size=16, queries_per_kv=1,
                   sliding_window=33, num_splits=3, dtype="bfloat16", form="hnd", seed=301,
                   seq_lens=(1, 33, 34, 100, 81) if quick else (1, 33, 34, 100, 2049, 4099))
        return
    yield case(f"{kind}-nullpad-window6-f16-gqa4-bs4", block_size=4, queries_per_kv=4,
               sliding_window=6, shared_blocks=1, seed=302,
               seq_lens=(30, 67, 9, 40, 13) if quick else (30, 1027, 9, 540, 13, 4099),
               query_lens=(3, 1, 9, 20, 0) if quick else (3, 1, 9, 300, 0, 1))
    yield case(f"{kind}-nullpad-window20-f32-gqa1-bs16-packed", block_size=16,
               queries_per_kv=1, sliding_window=20, dtype="float32", form="packed_kv",
               seed=303, seq_lens=(17, 100, 50) if quick else (17, 1000, 500, 3001),
               query_lens=(17, 1, 30) if quick else (17, 1, 300, 64))


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


def build_store_inputs(case: StoreCase) -> dict[str, Any]:
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
    kwargs: dict[str, Any] = {}
    if is_fp8:
        kwargs.update(kv_cache_dtype=case.kv_cache_dtype, k_scale=k_scale.to(case.device),
                      v_scale=v_scale.to(case.device))
    if cache.layout != "NHD":
        kwargs["layout"] = cache.layout
    return dict(key=qkv[:, 1], value=qkv[:, 2], cache=cache,
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


def build_attention_inputs(case: AttentionCase) -> dict[str, Any]:
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
    kwargs: dict[str, Any] = {}
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
    inputs = dict(
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
