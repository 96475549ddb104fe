"""The two Triton interpreter defects of ``docs/triton-interpreter.md``, as its minimal
reproductions: present in the interpreter of the Triton the document describes (3.9), absent
from compiled kernels on CUDA.

* ``tl.dot`` of two bfloat16 tiles multiplies their raw bit patterns (the interpreter stores
  bfloat16 as uint16): ones give 16 * 0x3F80**2 instead of 16.
* The fp32 -> float8e4nv (e4m3) cast rounds ties away from zero and, when rounding up overflows
  the mantissa, loses the carry into the exponent whenever the exponent field is odd
  (7.77 -> 4.0, 1.99 -> 1.0).

With another Triton the interpreter may have been fixed: each test then accepts the defective
or the correct answer and nothing else, and says which it saw. kvcheck's kernels and tests
avoid both (the document says how); their own tests check that. ``device`` comes from this
folder's conftest: ``cpu`` (the interpreter) without CUDA, ``cuda`` with it (where
``test_cpu_interpreter_suite`` reruns this folder under the interpreter too).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

#: The Triton release whose interpreter docs/triton-interpreter.md describes.
DOCUMENTED = triton.__version__.startswith("3.9.")


@triton.jit
def _dot16(a_ptr, b_ptr, c_ptr):
    i = tl.arange(0, 16)
    tile = i[:, None] * 16 + i[None, :]
    tl.store(c_ptr + tile, tl.dot(tl.load(a_ptr + tile), tl.load(b_ptr + tile)))


@triton.jit
def _to_e4m3(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y_ptr + i, tl.load(x_ptr + i).to(tl.float8e4nv))


def check(device: str, got: list[float], defective: list[float], correct: list[float]) -> None:
    """Compiled kernels (CUDA) are correct; the interpreter (CPU) is defective under the
    documented Triton, and either defective or correct under another."""
    if device == "cuda":
        assert got == correct
    elif DOCUMENTED:
        assert got == defective, f"Triton {triton.__version__}: the interpreter changed"
    else:
        assert got in (defective, correct), got


def test_bf16_dot_multiplies_bit_patterns_in_the_interpreter(device: str) -> None:
    ones = torch.ones(16, 16, dtype=torch.bfloat16, device=device)
    out = torch.empty(16, 16, dtype=torch.float32, device=device)
    _dot16[(1,)](ones, ones, out)
    bits = ones.view(torch.int16)[0, 0].item()  # 0x3F80 = 16256
    check(device, [out[0, 0].item()], defective=[16.0 * bits * bits], correct=[16.0])
    # The same kernel on float16 is exact: the defect is bfloat16's storage as uint16.
    halves = ones.to(torch.float16)
    _dot16[(1,)](halves, halves, out)
    assert out[0, 0].item() == 16.0


def test_e4m3_cast_rounds_ties_away_and_drops_the_carry_in_the_interpreter(device: str) -> None:
    x = torch.tensor([7.77, 1.99, 1.0625, 2.125, 3.9, 0.99, 1.09375, 448.0], device=device)
    y = torch.empty(8, dtype=torch.float8_e4m3fn, device=device)
    _to_e4m3[(1,)](x, y, 8)
    correct = x.cpu().to(torch.float8_e4m3fn).float().tolist()  # torch: round to nearest even
    assert correct == [8.0, 2.0, 1.0, 2.0, 4.0, 1.0, 1.125, 448.0]
    check(device, y.cpu().float().tolist(), correct=correct,
          # carry lost at odd exponents (7.77, 1.99), kept at even ones (3.9, 0.99); ties
          # (1.0625, 2.125) away from zero; the rest right.
          defective=[4.0, 1.0, 1.125, 2.25, 4.0, 1.0, 1.125, 448.0])
