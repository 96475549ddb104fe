"""Kernel conformance: any implementation's store / attention callables against the references.

An implementation's adapter may declare a ``kernels`` capability returning a ``KernelSet``; the
conformance plugin then runs ``check_*`` over the case sweeps of ``kvcheck.gpu_kernels.cases``.
kvcheck's own Triton kernels are checked the same way (``kvcheck_kernel_set()``)::

    ks = kvcheck_kernel_set()
    for case in decode_cases("cuda", quick=False):
        if ks.skip_reason("paged_attention_decode", case) is None:
            check_paged_attention_decode(ks.paged_attention_decode, case)

Contract checked (see each ``check_*``):

* stores are bit-exact against ``store_kv_cache_ref`` (fp8: the same code or the neighbouring
  one, i.e. one rounding step); padding tokens and every slot no token maps to stay unchanged;
* attention matches the fp32 reference within ``attention_tolerance(query dtype, cache kind)``:
  ``|out - ref| <= atol + rtol * |ref|`` elementwise, and never NaN (the caches hold NaN in
  every slot outside the sequences, so NaN means a read past ``seq_len``);
* feature ``null_padded_window``: with a sliding window, the table may hold the null block 0
  (NaN) before each sequence's window, as a sliding-window KV-cache group's table does; it must
  never be read.

Failures raise ``AssertionError`` naming the case, the max abs error, the tolerance, the first
mismatching index and the values there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch

from kvcheck.errors import KVCheckInputError
from kvcheck.gpu_kernels.case_sweeps import KERNEL_CASE_SWEEPS, kernel_case_id
from kvcheck.gpu_kernels.cases import (
    AttentionCase,
    StoreCase,
    build_attention_inputs,
    build_store_inputs,
    clone_kv_cache,
    decode_cases,
    store_cases,
    varlen_cases,
)
from kvcheck.gpu_kernels.errors import KernelMismatch
from kvcheck.gpu_kernels.layout import as_nhd
from kvcheck.gpu_kernels.reference import (
    paged_attention_decode_ref,
    paged_attention_varlen_ref,
    store_kv_cache_ref,
)

__all__ = [
    "ATTENTION_TOLERANCES",
    "FP8_TOLERANCE_FACTOR",
    "AttentionCase",
    "KernelSet",
    "StoreCase",
    "assert_attention_close",
    "attention_tolerance",
    "check_paged_attention_decode",
    "check_paged_attention_varlen",
    "check_store_kv_cache",
    "decode_cases",
    "kernel_checks",
    "kvcheck_kernel_set",
    "store_cases",
    "varlen_cases",
]

#: ``(atol, rtol)`` per query dtype, for outputs against the fp32 reference. The kernel keeps
#: scores and the softmax in fp32 but rounds P to the value dtype before P @ V and rounds the
#: output, so the bound is a few units in the last place of the dtype (fp16 eps 2**-10, bf16
#: 2**-7; fp32 dots must not use TF32).
ATTENTION_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (2e-5, 2e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
}
#: fp8 caches: the reference dequantises the very same fp8 values, but kernels (vLLM's too) cast
#: the dequantised K/V to the query dtype before the dots, one more rounding per element.
FP8_TOLERANCE_FACTOR = 2.0


def attention_tolerance(dtype: str, kv_cache_dtype: str = "auto") -> tuple[float, float]:
    """``(atol, rtol)`` for a query dtype and cache kind (fp8 widens by FP8_TOLERANCE_FACTOR)."""
    atol, rtol = ATTENTION_TOLERANCES[dtype]
    if kv_cache_dtype != "auto":
        atol, rtol = atol * FP8_TOLERANCE_FACTOR, rtol * FP8_TOLERANCE_FACTOR
    return atol, rtol

_OPS = ("store_kv_cache", "paged_attention_decode", "paged_attention_varlen")


@dataclass(frozen=True)
class KernelSet:
    """Kernel callables of one implementation plus what they support.

    Each callable takes the same arguments as kvcheck's kernel of that name (optional keywords
    are only passed when a case needs them: ``layout`` for HND, ``kv_cache_dtype``/``k_scale``/
    ``v_scale`` for fp8, ``sliding_window``, ``softcap``, ``num_splits``). ``None`` = not
    provided; its checks are skipped.
    """

    name: str = "unnamed"
    store_kv_cache: Callable[..., None] | None = None
    paged_attention_decode: Callable[..., torch.Tensor] | None = None
    paged_attention_varlen: Callable[..., torch.Tensor] | None = None
    layouts: frozenset[str] = frozenset({"NHD", "HND"})
    forms: frozenset[str] = frozenset(
        {"nhd", "hnd", "vllm_2nhd", "flashinfer_nhd", "flashinfer_hnd", "packed_kv"}
    )
    dtypes: frozenset[str] = frozenset({"float32", "float16", "bfloat16"})
    kv_cache_dtypes: frozenset[str] = frozenset({"auto", "fp8"})
    #: ``"null_padded_window"``: sliding-window attention through a table whose entries before
    #: the window are the null block 0 (a sliding-window KV-cache group's table), never reading
    #: block 0. Not in the default: a set opts in.
    features: frozenset[str] = frozenset({"sliding_window", "softcap", "num_splits"})

    def skip_reason(self, op: str, case: StoreCase | AttentionCase) -> str | None:
        """Why ``case`` does not apply to this set's ``op`` (None: run it)."""
        if op not in _OPS:
            raise KVCheckInputError(f"unknown kernel op {op!r}; one of {_OPS}")
        if getattr(self, op) is None:
            return f"{self.name} provides no {op}"
        layout = "HND" if case.form in ("hnd", "flashinfer_hnd") else "NHD"
        if layout not in self.layouts or case.form not in self.forms:
            return f"{self.name} does not support cache form {case.form!r} ({layout})"
        if case.dtype not in self.dtypes:
            return f"{self.name} does not support {case.dtype}"
        kv_kind = "auto" if case.kv_cache_dtype == "auto" else "fp8"
        if kv_kind not in self.kv_cache_dtypes:
            return f"{self.name} does not support kv_cache_dtype={case.kv_cache_dtype!r}"
        if isinstance(case, AttentionCase):
            for feature, used in (
                ("sliding_window", case.sliding_window is not None),
                ("softcap", case.softcap is not None),
                ("num_splits", case.num_splits is not None),
                ("null_padded_window", case.null_padded_window),
            ):
                if used and feature not in self.features:
                    return f"{self.name} does not support {feature}"
        return None


# ---------------------------------------------------------------------------------------------
# Assertions
# ---------------------------------------------------------------------------------------------


def _fmt_index(index: tuple[int, ...], names: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"{n}={i}" for n, i in zip(names, index, strict=True)) + ")"


def assert_attention_close(
    op: str,
    case_name: str,
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: str,
    index_names: tuple[str, ...],
    kv_cache_dtype: str = "auto",
    *,
    null_padded: bool = False,
) -> None:
    """``|out - ref| <= atol + rtol * |ref|`` everywhere (and no NaN), else a full explanation.

    ``null_padded``: the case's block table holds the null block before each window; a NaN
    output then most likely comes from reading it, and the message says so.
    """
    atol, rtol = attention_tolerance(dtype, kv_cache_dtype)
    if out.shape != ref.shape:
        raise KernelMismatch(
            f"{op}[{case_name}]: output shape {tuple(out.shape)} != expected {tuple(ref.shape)}"
        )
    got = out.float()
    err = (got - ref).abs()
    bad = ~(err <= atol + rtol * ref.abs())  # NaN in `got` counts as bad
    if not bool(bad.any()):
        return
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    finite_err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
    worst = tuple(int(i) for i in torch.unravel_index(finite_err.argmax(), err.shape))
    nan_note = ""
    if bool(torch.isnan(got).any()):
        nan_note = (
            " The output has NaN: the caches hold NaN in every slot outside the sequences, so "
            "the kernel read past seq_len, through an unused block-table entry, or from the "
            "wrong block."
        )
        if null_padded:
            nan_note += (
                " The block table is null-padded (a sliding-window group's: block 0, which "
                "holds NaN, before each window): the kernel read keys before the window instead "
                "of skipping those tiles and masking those loads."
            )
    raise KernelMismatch(
        f"{op}[{case_name}]: {int(bad.sum())} of {bad.numel()} elements outside tolerance "
        f"(atol={atol:g}, rtol={rtol:g} for {dtype}, kv_cache_dtype={kv_cache_dtype}; "
        f"|out - ref| <= atol + rtol * |ref|); "
        f"max abs err {float(finite_err.max()):.3g} at {_fmt_index(worst, index_names)}; "
        f"first mismatch at {_fmt_index(first, index_names)}: got {float(got[first]):.6g}, "
        f"expected {float(ref[first]):.6g} (fp32 reference).{nan_note}"
    )


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits as non-negative int64 (so messages print 0xbc00, not -0x4400)."""
    width = t.element_size()
    raw = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[width]).to(torch.int64)
    return raw & ((1 << (8 * width)) - 1)


def _assert_cache_matches(
    op: str, case: StoreCase, which: str, got: torch.Tensor, want: torch.Tensor,
    before: torch.Tensor, slot_of_token: dict[int, int],
) -> None:
    """Bitwise compare of NHD views; fp8 allows the neighbouring code (one rounding step)."""
    got_bits, want_bits = _bits(got), _bits(want)
    diff = got_bits != want_bits
    is_fp8 = case.kv_cache_dtype != "auto"
    if is_fp8:
        same_sign = (got_bits & 0x80) == (want_bits & 0x80)
        one_step = same_sign & ((got_bits - want_bits).abs() == 1)
        block_size = got.shape[1]
        written = torch.zeros(got.shape[:2], dtype=torch.bool, device=got.device)
        for slot in slot_of_token.values():
            written[slot // block_size, slot % block_size] = True
        diff &= ~(one_step & written[:, :, None, None])
    if not bool(diff.any()):
        return
    idx = tuple(int(i) for i in diff.nonzero()[0].tolist())
    block_id, row = idx[0], idx[1]
    slot = block_id * got.shape[1] + row
    tokens = [t for t, s in slot_of_token.items() if s == slot]
    if tokens:
        who = f"written by token {tokens[0]}"
    elif bool(_bits(before)[idx] == got_bits[idx]):
        who = "no token maps to it"
    else:
        who = ("no token maps to this slot, yet it changed: a PAD_SLOT_ID (negative) slot was "
               "written, or a slot was computed wrongly")
    err = float((got.float() - want.float()).abs().nan_to_num(float("inf")).max())
    tol = "one fp8 rounding step (neighbouring code)" if is_fp8 else "bit-exact"
    raise KernelMismatch(
        f"{op}[{case.name}]: {which} differs from store_kv_cache_ref at {int(diff.sum())} "
        f"elements (tolerance: {tol}; max abs err {err:.3g}); first at "
        f"{_fmt_index(idx, ('block_id', 'block_offset', 'head', 'dim'))} = slot {slot} "
        f"({slot} = {block_id} * {got.shape[1]} + {row}), {who}: got bits "
        f"{int(got_bits[idx]):#x} ({float(got[idx].float()):.6g}), expected "
        f"{int(want_bits[idx]):#x} ({float(want[idx].float()):.6g})"
    )


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def check_store_kv_cache(fn: Callable[..., None], case: StoreCase) -> None:
    """Run ``fn`` and ``store_kv_cache_ref`` on identical caches; compare every cache bit."""
    inputs = build_store_inputs(case)
    cache = inputs["cache"]
    got, want = clone_kv_cache(cache, case.form), clone_kv_cache(cache, case.form)
    args = (inputs["key"], inputs["value"])
    fn(*args, got.key_cache, got.value_cache, inputs["slot_mapping"], **inputs["kwargs"])
    store_kv_cache_ref(*args, want.key_cache, want.value_cache, inputs["slot_mapping"],
                       **inputs["kwargs"])
    slot_of_token = {t: s for t, s in enumerate(inputs["slot_mapping"].tolist()) if s >= 0}
    for which, g, w, b in (
        ("key_cache", got.key_cache, want.key_cache, cache.key_cache),
        ("value_cache", got.value_cache, want.value_cache, cache.value_cache),
    ):
        _assert_cache_matches(
            "store_kv_cache", case, which, as_nhd(g, got.layout), as_nhd(w, want.layout),
            as_nhd(b, cache.layout), slot_of_token,
        )


def check_paged_attention_decode(fn: Callable[..., torch.Tensor], case: AttentionCase) -> None:
    """``fn`` vs ``paged_attention_decode_ref`` within ``ATTENTION_TOLERANCES``."""
    if case.query_lens is not None:
        raise KVCheckInputError(f"case {case.name} is a varlen case (query_lens set)")
    inputs = build_attention_inputs(case)
    cache = inputs["cache"]
    args = (inputs["query"], cache.key_cache, cache.value_cache, inputs["block_table"],
            inputs["seq_lens"], inputs["scale"])
    out = fn(*args, **inputs["kwargs"])
    ref = paged_attention_decode_ref(*args, **inputs["kwargs"])
    assert_attention_close("paged_attention_decode", case.name, out, ref, case.dtype,
                           ("seq", "head", "dim"), case.kv_cache_dtype,
                           null_padded=case.null_padded_window)


def check_paged_attention_varlen(fn: Callable[..., torch.Tensor], case: AttentionCase) -> None:
    """``fn`` vs ``paged_attention_varlen_ref`` within ``ATTENTION_TOLERANCES``."""
    if case.query_lens is None:
        raise KVCheckInputError(f"case {case.name} is a decode case (query_lens is None)")
    inputs = build_attention_inputs(case)
    cache = inputs["cache"]
    args = (inputs["query"], cache.key_cache, cache.value_cache, inputs["block_table"],
            inputs["query_start_loc"], inputs["seq_lens"], inputs["scale"])
    out = fn(*args, **inputs["kwargs"])
    ref = paged_attention_varlen_ref(*args, **inputs["kwargs"])
    assert_attention_close("paged_attention_varlen", case.name, out, ref, case.dtype,
                           ("token", "head", "dim"), case.kv_cache_dtype,
                           null_padded=case.null_padded_window)


#: Op -> its check, called as ``check(kernel, case)`` with a case of that op's sweep (a
#: ``StoreCase`` or an ``AttentionCase``: each check takes its own).
_CHECK_OF: dict[str, Callable[..., None]] = {
    "store_kv_cache": check_store_kv_cache,
    "paged_attention_decode": check_paged_attention_decode,
    "paged_attention_varlen": check_paged_attention_varlen,
}
#: Op -> (its case sweep, its check), in the kernel area's order (``case_sweeps``).
_CHECKS: dict[str, tuple[Callable[..., Iterator[StoreCase | AttentionCase]],
                         Callable[..., None]]] = {
    op: (sweep, _CHECK_OF[op]) for op, sweep in KERNEL_CASE_SWEEPS.items()}


def kernel_checks(
    kernel_set: KernelSet, device: str, quick: bool = True
) -> Iterator[tuple[str, Callable[[], None], str | None]]:
    """Every (test id, zero-argument check, skip reason or None) for ``kernel_set`` on ``device``.

    Test ids are ``"<op>[<case name>]"``; they are stable and usable in skip files.
    """
    for op, (cases, check) in _CHECKS.items():
        fn = getattr(kernel_set, op)
        for case in cases(device, quick=quick):
            reason = kernel_set.skip_reason(op, case)
            yield kernel_case_id(op, case), partial(check, fn, case), reason


def kvcheck_kernel_set() -> KernelSet:
    """kvcheck's own Triton kernels as a ``KernelSet`` (imports Triton on first call)."""
    from kvcheck.gpu_kernels.paged_decode import paged_attention_decode
    from kvcheck.gpu_kernels.paged_varlen import paged_attention_varlen
    from kvcheck.gpu_kernels.store_kv import store_kv_cache

    return KernelSet(
        name="kvcheck-triton",
        store_kv_cache=store_kv_cache,
        paged_attention_decode=paged_attention_decode,
        paged_attention_varlen=paged_attention_varlen,
        features=frozenset({"sliding_window", "softcap", "num_splits", "null_padded_window"}),
    )
