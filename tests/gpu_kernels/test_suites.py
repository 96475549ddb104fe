"""Cross-mode checks run in subprocesses: CUDA compilation without a GPU, CPU suite on GPU hosts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

HERE = Path(__file__).parent


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this host compiles and runs the real "
                    "kernels; the offline compile check is for CPU-only hosts")
def test_kernels_compile_for_cuda():
    """Every launch configuration the wrappers produce compiles to a cubin for sm_90.

    The interpreter accepts things compiled Triton rejects (tl.dot below 16, type changes
    across loop iterations, fp8 on old GPUs), so without a GPU this is the check that the
    kernels build at all. ~30 s with a cold Triton cache, a few seconds warm. Set
    KVCHECK_COMPILE_ARCHS="80 90" for more targets.
    """
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    archs = os.environ.get("KVCHECK_COMPILE_ARCHS", "90").split()
    result = subprocess.run(
        [sys.executable, str(HERE / "_compile_for_cuda.py"), *archs],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    failed = [line for line in result.stdout.splitlines() if "FAILED" in line]
    assert result.returncode == 0 and not failed, (
        "kernels failed to compile for CUDA:\n" + "\n".join(failed) + result.stderr[-3000:]
    )
    assert result.stdout.count(": ok") >= 20, result.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="without CUDA this process already "
                    "runs the CPU (interpreter) suite")
def test_cpu_interpreter_suite():
    """On a GPU host, also run this folder on CPU tensors in Triton's interpreter.

    One process runs Triton kernels either compiled or interpreted, so the CPU sweep runs in a
    subprocess with TRITON_INTERPRET=1 and no visible GPU.
    """
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE), "-q", "-p", "no:cacheprovider",
         "-x", "--import-mode=importlib"],
        env=env, capture_output=True, text=True, timeout=1800, check=False,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
