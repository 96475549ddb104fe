"""The kernel area's test ids come from ``gpu_kernels.case_sweeps`` without torch: stable
names, and collecting the area imports no torch on a machine without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.gpu_kernels.case_sweeps import kernel_case_ids

#: Ids users' skip files and this project's tests name (tests/gpu_kernels): renaming a case
#: breaks them, so the names are pinned here, not derived from the sweeps under test.
NAMED = ["store_kv_cache[nhd-f16-bs16-h2-d64]", "paged_attention_decode[decode-split3-f16-gqa4]",
         "paged_attention_varlen[varlen-nullpad-window6-f16-gqa4-bs4]",
         "paged_attention_decode[decode-nullpad-window33-split3-bf16-hnd]"]


@pytest.mark.parametrize(("device", "quick", "count"), [("cpu", True, 58), ("cuda", False, 60)])
def test_the_ids_are_stable_and_unique(device: str, quick: bool, count: int) -> None:
    ids = kernel_case_ids(device, quick=quick)
    assert len(ids) == len(set(ids)) == count
    assert set(NAMED) <= set(ids)


def test_collecting_the_kernel_area_imports_no_torch() -> None:
    from kvcheck.conformance import test_kernels

    if test_kernels._DEVICE != "cpu" or any(Path(n).exists() for n in test_kernels._GPU_NODES):
        pytest.skip("a GPU machine: the area asks torch which device to use")
    probe = ("import sys, kvcheck.conformance.test_kernels as area; "
             "print(len(area._CASES), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(len(kernel_case_ids("cpu", quick=True))), "False"]
