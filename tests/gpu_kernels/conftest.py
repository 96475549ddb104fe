"""Kernel tests: CPU (Triton interpreter, small shapes) always, CUDA (larger sweeps) when present.

Triton decides at ``@triton.jit`` decoration time whether a function is interpreted (triton 3.9
reads ``TRITON_INTERPRET`` through ``triton.knobs``), and ``triton.language``'s own jit helpers
(``tl.zeros``, ``tl.cdiv``) are decorated when ``triton`` is first imported. So the variable is
set here, at conftest import, before anything in this process imports triton (``import torch``
does not). If something imported triton earlier, the kernels refuse CPU tensors with a message
saying so. ``kvcheck.gpu_kernels`` loads its kernel modules lazily and its conformance module
does not import triton, so an earlier import of those by a plugin is harmless.

With CUDA present the kernels are compiled (TRITON_INTERPRET is left alone). One process runs
Triton kernels either interpreted (CPU tensors) or compiled (CUDA tensors), not both, so on a
CUDA machine this process runs the ``cuda`` sweeps and ``test_cpu_interpreter_suite`` reruns this
folder in a subprocess with ``TRITON_INTERPRET=1`` and no visible GPU: ``pytest tests/gpu_kernels``
covers cpu always + cuda when present.

Tests that take a ``device`` argument run on ``DEVICES``; tests that take ``store_case`` /
``decode_case`` / ``varlen_case`` run every case of the matching sweep in
``kvcheck.gpu_kernels.cases``: small ones on CPU, the larger ``quick=False`` sweep on CUDA.
"""

from __future__ import annotations

import os

try:
    import torch  # `import torch` does not import triton (checked with torch 2.13)
except ImportError:  # the `kernels` extra is absent: each test module skips itself
    torch = None

HAS_CUDA = torch is not None and torch.cuda.is_available()
if torch is not None and not HAS_CUDA:
    # Must precede `import triton`: triton.language's own @jit helpers (tl.zeros, tl.cdiv, ...)
    # are decorated when triton is imported, and compiled helpers cannot run in the interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# One process runs kernels either interpreted (CPU tensors) or compiled (CUDA tensors).
DEVICES = ["cpu"] if INTERPRET else (["cuda"] if HAS_CUDA else [])

_CASE_FIXTURES = {
    "store_case": "store_cases",
    "decode_case": "decode_cases",
    "varlen_case": "varlen_cases",
}


def pytest_generate_tests(metafunc):
    if torch is None:
        return
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICES)
    for fixture, generator_name in _CASE_FIXTURES.items():
        if fixture in metafunc.fixturenames:
            from kvcheck.gpu_kernels import cases as case_module

            generator = getattr(case_module, generator_name)
            all_cases = [
                case
                for device in DEVICES
                for case in generator(device, quick=device == "cpu")
            ]
            metafunc.parametrize(
                fixture, all_cases, ids=[f"{c.device}-{c.name}" for c in all_cases]
            )
