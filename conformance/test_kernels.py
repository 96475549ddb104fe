"""Kernels (capability ``kernels``): the implementation's store / paged-attention callables
against kvcheck's fp32 torch references, over the sweeps of ``kvcheck.gpu_kernels.cases``
(ragged lengths, block sizes 1/16/32, GQA 1/4/8, head sizes 64/128, permuted and shared block
ids, padded slots, NHD/HND and packed K||V views, fp32/fp16/bf16/fp8), and sliding-window
attention through a KV-cache group's null-padded table (feature ``null_padded_window``: the
entries before each window are the null block 0, which holds NaN and must never be read; a
``KernelSet`` that does not declare the feature skips those cases with a reason).

Runs on CUDA when a device is visible (the full sweep), else on the CPU with small shapes; a
Triton implementation then runs in ``TRITON_INTERPRET`` mode, which must be enabled before
Triton is first imported (this module does it when it is imported first).
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvcheck.conformance.loader import ImplHandle

# Kernel numerics do not depend on a vLLM release: checked under every profile, generic too.
pytestmark = [pytest.mark.kv_capability("kernels"), pytest.mark.kv_generic]

_HAS_KERNEL_DEPS = all(importlib.util.find_spec(m) is not None for m in ("torch", "triton"))
if _HAS_KERNEL_DEPS:
    import torch

    _DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    if _DEVICE == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from kvcheck.gpu_kernels.conformance import KernelSet, kernel_checks

    # The case list is the same for every implementation; what applies is decided per set.
    _CASES = [tid for tid, _, _ in kernel_checks(KernelSet(), _DEVICE, quick=_DEVICE == "cpu")]
else:
    _DEVICE, _CASES = "cpu", ["unavailable"]

_kernel_sets: dict[str, KernelSet] = {}


def _kernel_set(kv_impl: ImplHandle) -> KernelSet:
    if kv_impl.name not in _kernel_sets:
        ks = kv_impl.module.kernels()
        if not isinstance(ks, KernelSet):
            raise AssertionError(
                f"{kv_impl.name}: kernels() returned {type(ks).__name__}; it must return a "
                "kvcheck.gpu_kernels.conformance.KernelSet")
        _kernel_sets[kv_impl.name] = ks
    return _kernel_sets[kv_impl.name]


@pytest.mark.parametrize("case_id", _CASES)
def test_kernel_matches_reference(kv_impl: ImplHandle, case_id: str) -> None:
    """One kernel case: stores bit-exact (fp8 within one rounding step), attention within the
    per-dtype tolerance of the fp32 reference, padded slots untouched."""
    if not _HAS_KERNEL_DEPS:
        pytest.skip("kernel checks need torch and triton: pip install 'kvcheck[kernels]'")
    if os.environ.get("TRITON_INTERPRET") != "1" and _DEVICE == "cpu":
        pytest.skip("no CUDA device and TRITON_INTERPRET is not enabled")
    ks = _kernel_set(kv_impl)
    checks = {tid: (fn, reason) for tid, fn, reason in
              kernel_checks(ks, _DEVICE, quick=_DEVICE == "cpu")}
    check, reason = checks[case_id]
    if reason is not None:
        pytest.skip(reason)
    check()
