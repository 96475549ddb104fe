"""kvcheck's Triton kernels against vLLM's own Triton kernels, on identical inputs.

``kvcheck bench kernels`` runs the ``kvcheck_triton`` and ``vllm`` kernel
providers of the benchmarks (the very calls the kernel benchmarks time, so the cross-check also
proves the benchmark's calling convention) on small cases: vLLM's
``triton_reshape_and_cache_flash`` against ``store_kv_cache`` (the caches must then hold the
same bits), and vLLM's ``unified_attention`` against ``paged_attention_decode`` and
``paged_attention_varlen`` (outputs within kvcheck's attention tolerance of the dtype). It
prints one line per case and exits 1 on any disagreement, 2 when vLLM's Triton kernels are not
importable.

On a machine without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set
by ``main`` before Triton is first imported). Two things of vLLM's need help there, and only
there:

* vLLM disables Triton when no GPU driver is active (``vllm.triton_utils.HAS_TRITON``), unless
  the device list is set and empty (its lenient check for distributed start-up), so ``main``
  sets ``CUDA_VISIBLE_DEVICES=""`` before vLLM is imported;
* ``triton_reshape_and_cache_flash`` asks ``torch.cuda.get_device_capability`` to pick a tile
  size, which a CPU build of torch cannot answer: the call is made as on an sm_90 GPU.

On a GPU nothing is patched. The benchmarks then time both providers side by side
(``--kv-bench`` with the kernel benchmarks, ``bench/run_gpu.sh``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvcheck.bench.cli_args import BenchTool, run_tool
from kvcheck.bench.kernels.inputs import KERNEL_OPS, KernelBenchCase
from kvcheck.errors import KVCheckError

if TYPE_CHECKING:
    from kvcheck.bench.kernels.inputs import KernelInputs
    from kvcheck.bench.kernels.providers import Provider

__all__ = ["CROSSCHECK_CASES", "CaseOutcome", "crosscheck", "main"]

#: Small cases (interpreter-sized): ragged contexts over fragmented blocks, GQA, a partial
#: last block, a fused-QKV store with padding tokens, and a varlen batch mixing a prefill, an
#: extend and decodes. Head size 32 keeps the interpreter fast; both float32 and float16.
CROSSCHECK_CASES: tuple[KernelBenchCase, ...] = tuple(
    case
    for dtype in ("float32", "float16")
    for case in (
        KernelBenchCase(f"store-decode-{dtype}", "store_kv_cache", (5, 17, 33), (1, 1, 1),
                        num_kv_heads=2, queries_per_kv=2, head_size=32, block_size=16,
                        dtype=dtype, num_pad=2, num_input_sets=1),
        KernelBenchCase(f"store-prefill-{dtype}", "store_kv_cache", (20, 9), (20, 4),
                        num_kv_heads=2, queries_per_kv=2, head_size=32, block_size=16,
                        dtype=dtype, num_input_sets=1),
        KernelBenchCase(f"decode-{dtype}", "paged_attention_decode", (5, 17, 40), (1, 1, 1),
                        num_kv_heads=2, queries_per_kv=2, head_size=32, block_size=16,
                        dtype=dtype, num_input_sets=1),
        KernelBenchCase(f"varlen-{dtype}", "paged_attention_varlen", (24, 37, 9), (24, 5, 1),
                        num_kv_heads=2, queries_per_kv=2, head_size=32, block_size=16,
                        dtype=dtype, num_input_sets=1),
    )
)


@dataclass(frozen=True)
class CaseOutcome:
    """One case: ``error`` is None when vLLM's and kvcheck's kernels agree."""

    case: KernelBenchCase
    max_abs_diff: float
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@contextlib.contextmanager
def _as_sm90_if_interpreted() -> Iterator[None]:
    """Answer ``torch.cuda.get_device_capability`` as an sm_90 GPU while interpreting (a CPU
    torch raises there); on a real GPU, leave it alone."""
    import torch

    if not _interpreted() or torch.cuda.is_available():
        yield
        return
    saved = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *args, **kwargs: (9, 0)
    try:
        yield
    finally:
        torch.cuda.get_device_capability = saved


def _run(provider: Provider, inputs: KernelInputs) -> Any:  # Any: Prepared's result
    with _as_sm90_if_interpreted():
        return provider.prepare(inputs)()


def _check_case(case: KernelBenchCase, device: str, ours: Provider, theirs: Provider
                ) -> CaseOutcome:
    import torch

    from kvcheck.bench.kernels.inputs import KernelInputPool
    from kvcheck.gpu_kernels.conformance import assert_attention_close

    inputs = KernelInputPool(case, device).next_round()
    if case.op == "store_kv_cache":
        mine = dataclasses.replace(inputs, key_cache=inputs.key_cache.clone(),
                                   value_cache=inputs.value_cache.clone())
        other = dataclasses.replace(inputs, key_cache=inputs.key_cache.clone(),
                                    value_cache=inputs.value_cache.clone())
        _run(ours, mine)
        _run(theirs, other)
        diff = max((a.float() - b.float()).abs().max().item()
                   for a, b in ((mine.key_cache, other.key_cache),
                                (mine.value_cache, other.value_cache)))
        same = (torch.equal(mine.key_cache, other.key_cache)
                and torch.equal(mine.value_cache, other.value_cache))
        written = int((mine.key_cache != 0).any(dim=(-1, -2)).sum())
        if not same:
            return CaseOutcome(case, diff, f"the caches differ after the store (max |diff| "
                                           f"{diff:g}; {written} slots written by kvcheck)")
        if written != case.num_new_tokens:
            return CaseOutcome(case, diff, f"{written} slots written, expected "
                                           f"{case.num_new_tokens}: the inputs are degenerate")
        return CaseOutcome(case, diff, None)
    out_ours = _run(ours, inputs).float()
    out_theirs = _run(theirs, inputs).float()
    diff = (out_ours - out_theirs).abs().max().item()
    try:
        assert_attention_close(case.op, case.name, out_theirs, out_ours, case.dtype,
                               ("token", "head", "dim"))
    except AssertionError as exc:
        return CaseOutcome(case, diff, str(exc).splitlines()[0])
    return CaseOutcome(case, diff, None)


def crosscheck(cases: Sequence[KernelBenchCase] = CROSSCHECK_CASES,
               device: str | None = None) -> list[CaseOutcome]:
    """Run both providers on each case (``device``: CUDA when available, else the CPU in the
    interpreter). Raises ``ProviderUnavailable`` when vLLM's kernels cannot be imported; an
    op vLLM's release lacks (0.10.2 has no Triton store) becomes a failed outcome naming it."""
    import torch

    from kvcheck.bench.kernels.providers import ProviderUnavailable, make_provider

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and not _interpreted():
        raise KVCheckError("kernels on the CPU need TRITON_INTERPRET=1 set before Triton is "
                           "imported (kvcheck bench kernels sets it)")
    ours = make_provider("kvcheck_triton")
    theirs = make_provider("vllm")
    triton_store = _has_triton_store()
    outcomes = []
    for case in cases:
        if case.op == "store_kv_cache" and not triton_store:
            outcomes.append(CaseOutcome(case, float("nan"), (
                f"not run: {theirs.label} ships no Triton K/V store "
                "(triton_reshape_and_cache_flash); its CUDA op is not a Triton kernel")))
            continue
        try:
            outcomes.append(_check_case(case, device, ours, theirs))
        except ProviderUnavailable as exc:
            outcomes.append(CaseOutcome(case, float("nan"), f"not run: {exc}"))
        except Exception as exc:  # noqa: BLE001  (a third-party kernel that raises disagrees)
            outcomes.append(CaseOutcome(case, float("nan"), (
                f"{theirs.label} raised {type(exc).__name__}: {str(exc).splitlines()[0]}")))
    return outcomes


def _has_triton_store() -> bool:
    """Whether the installed vLLM ships ``triton_reshape_and_cache_flash`` (0.33 does)."""
    import importlib

    for module in ("vllm.v1.attention.ops.triton_reshape_and_cache_flash",
                   "vllm.attention.ops.triton_reshape_and_cache_flash"):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        return True
    return False


def _prepare_environment() -> None:
    """Before Triton or vLLM is imported: interpret kernels when there is no GPU, and keep
    vLLM from disabling Triton for want of an active driver (see the module docstring)."""
    if "triton" in sys.modules or "vllm" in sys.modules:
        return  # too late to change anything; crosscheck() reports what it finds
    if os.environ.get("TRITON_INTERPRET") is None:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    if _interpreted():
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", choices=KERNEL_OPS, action="append",
                        help="only this op (repeatable); default: every op")
    parser.add_argument("--allow-missing", action="append", default=[], choices=KERNEL_OPS,
                        help="an op the installed vLLM does not ship as a Triton kernel "
                             "(vLLM 0.10.2: store_kv_cache) is reported, not failed")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Returns the exit status (1: a case disagrees; 2: nothing compared)."""
    unselected = sorted(set(args.allow_missing) - set(args.op or KERNEL_OPS))
    if unselected:  # it would allow nothing: a typo for another op, most likely
        parser.error(f"argument --allow-missing: {', '.join(unselected)} is not among the ops "
                     f"--op selects ({', '.join(args.op)}); Fix: add --op {unselected[0]} or "
                     "drop that --allow-missing")
    _prepare_environment()
    from kvcheck.bench.kernels.providers import ProviderUnavailable

    cases = [c for c in CROSSCHECK_CASES if not args.op or c.op in args.op]
    try:
        outcomes = crosscheck(cases)
    except (ProviderUnavailable, KVCheckError) as exc:
        print(f"kernel cross-check: not run: {exc}", file=sys.stderr)
        return 2
    counts = {"agree": 0, "skipped": 0, "DISAGREE": 0}
    for outcome in outcomes:
        missing = outcome.error is not None and outcome.error.startswith("not run:")
        if outcome.ok:
            status = "agree"
        elif missing and outcome.case.op in args.allow_missing:
            status = "skipped"
        else:
            status = "DISAGREE"
        counts[status] += 1
        detail = f"  ({outcome.error})" if outcome.error else ""
        print(f"{status:8} {outcome.case.op:24} {outcome.case.name:24} "
              f"max|diff| {outcome.max_abs_diff:.3g}{detail}")
    print(f"kernel cross-check: {counts['agree']} of {len(outcomes)} cases agree, "
          f"{counts['skipped']} skipped, {counts['DISAGREE']} disagree")
    if counts["DISAGREE"]:
        return 1
    return 0 if counts["agree"] else 2  # nothing compared is not a pass


TOOL = BenchTool("kernels", "kvcheck.bench.kernel_crosscheck",
                 "kvcheck's Triton kernels vs vLLM's Triton kernels on identical inputs.",
                 add_arguments, run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcheck.bench.kernel_crosscheck``: the same as ``kvcheck bench kernels``."""
    return run_tool(TOOL, argv)


if __name__ == "__main__":
    sys.exit(main())
