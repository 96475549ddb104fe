"""The kernel area's test ids come from ``gpu_kernels.case_sweeps`` without torch: the same ids
``kernel_checks`` runs, and collecting the area imports no torch on a machine without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.gpu_kernels.case_sweeps import kernel_case_ids


@pytest.mark.parametrize(("device", "quick"), [("cpu", True), ("cuda", False)])
def test_the_ids_are_the_checks_ids(device: str, quick: bool) -> None:
    pytest.importorskip("torch")
    from kvcheck.gpu_kernels.conformance import KernelSet, kernel_checks

    ids = kernel_case_ids(device, quick=quick)
    assert ids == [tid for tid, _, _ in kernel_checks(KernelSet(), device, quick=quick)]
    assert len(ids) == len(set(ids)) > 50


def test_collecting_the_kernel_area_imports_no_torch() -> None:
    from kvcheck.conformance import test_kernels

    if test_kernels._DEVICE != "cpu" or any(Path(n).exists() for n in test_kernels._GPU_NODES):
        pytest.skip("a GPU machine: the area asks torch which device to use")
    probe = ("import sys, kvcheck.conformance.test_kernels as area; "
             "print(len(area._CASES), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(len(kernel_case_ids("cpu", quick=True))), "False"]
