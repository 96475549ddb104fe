"""The kernel test cases by name: their dataclasses and sweeps, without torch.

Case names make the kernel area's test ids (``"<op>[<case name>]"``, ``kernel_case_ids``),
which the suite needs while collecting, for every implementation: this module imports no torch,
so collecting the suite for an implementation without kernels does not pay for importing it.
``kvcheck.gpu_kernels.cases`` builds each case's tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Final

__all__ = [
    "KERNEL_CASE_SWEEPS",
    "AttentionCase",
    "StoreCase",
    "decode_cases",
    "kernel_case_id",
    "kernel_case_ids",
    "store_cases",
    "varlen_cases",
]

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
    extra_kwargs: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

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


#: Each kernel op the kernel area checks, in the area's order, with its case sweep.
KERNEL_CASE_SWEEPS: Final[dict[str, Callable[..., Iterator[StoreCase | AttentionCase]]]] = {
    "store_kv_cache": store_cases,
    "paged_attention_decode": decode_cases,
    "paged_attention_varlen": varlen_cases,
}


def kernel_case_id(op: str, case: StoreCase | AttentionCase) -> str:
    """A kernel check's test id, ``"<op>[<case name>]"``: stable, usable in skip files."""
    return f"{op}[{case.name}]"


def kernel_case_ids(device: str, quick: bool = True) -> list[str]:
    """The kernel area's test ids on ``device``, in ``kernel_checks``' order."""
    return [kernel_case_id(op, case) for op, sweep in KERNEL_CASE_SWEEPS.items()
            for case in sweep(device, quick=quick)]
