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
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.errors import ProtocolViolation
from kvcheck.gpu_kernels.case_sweeps import kernel_case_ids

if TYPE_CHECKING:
    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.gpu_kernels.conformance import KernelSet

# Kernel numerics do not depend on a vLLM release: checked under every profile, generic too.
pytestmark = [pytest.mark.kv_capability("kernels"), pytest.mark.kv_generic]

_HAS_KERNEL_DEPS = all(importlib.util.find_spec(m) is not None for m in ("torch", "triton"))
#: The device nodes a GPU torch can use (CUDA, WSL's CUDA, ROCm): without one torch sees no
#: device, so the suite decides "cpu" without importing torch (seconds, paid by every run
#: otherwise, with or without an implementation that has kernels).
_GPU_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def _device() -> str:
    if not _HAS_KERNEL_DEPS or ("torch" not in sys.modules
                                and not any(Path(node).exists() for node in _GPU_NODES)):
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


_DEVICE = _device()
if _DEVICE == "cpu" and _HAS_KERNEL_DEPS:
    # Before Triton's first import (the kernels are imported by the tests, after this).
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The case list is the same for every implementation; what applies is decided per set.
_CASES = kernel_case_ids(_DEVICE, quick=_DEVICE == "cpu") if _HAS_KERNEL_DEPS else ["unavailable"]

_kernel_sets: dict[str, KernelSet] = {}


def _kernel_set(kv_impl: ImplHandle) -> KernelSet:
    from kvcheck.gpu_kernels.conformance import KernelSet

    if kv_impl.name not in _kernel_sets:
        ks = kv_impl.module.kernels()
        if not isinstance(ks, KernelSet):
            raise ProtocolViolation(
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
    from kvcheck.gpu_kernels.conformance import kernel_checks

    ks = _kernel_set(kv_impl)
    checks = {tid: (fn, reason) for tid, fn, reason in
              kernel_checks(ks, _DEVICE, quick=_DEVICE == "cpu")}
    check, reason = checks[case_id]
    if reason is not None:
        pytest.skip(reason)
    check()
