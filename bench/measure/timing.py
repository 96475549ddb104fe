"""Timing: measured clocks for pytest-benchmark, CUDA events, L2 flushing and bandwidth peaks.

pytest-benchmark times a round as ``timer()`` before and after the target. Our targets measure
exactly what should count themselves (the implementation's calls for the allocator, one kernel
between two CUDA events for the kernels) and advance a ``MeasuredClock`` by that much, and
the clock's ``now`` is the benchmark's ``timer``: pytest-benchmark's statistics, table and JSON
then describe the measured work only, never the harness bookkeeping, an L2 flush or input
generation. (``@pytest.mark.benchmark(timer=allocator_time)``; ``benchmark.pedantic(setup=...)``
supplies fresh inputs per round.)

CUDA functions import torch lazily and are only called with a CUDA device; their arithmetic
(``theoretical_dram_gbps``, ``l2_flush_bytes``, ``copy_bytes``) is plain Python and tested on
the CPU.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from kvcheck.errors import KVCheckInputError

if TYPE_CHECKING:
    import torch

R = TypeVar("R")

__all__ = [
    "ALLOCATOR_CLOCK",
    "KERNEL_CLOCK",
    "CallTimer",
    "CudaEventTimer",
    "HostTimer",
    "L2Flusher",
    "MeasuredClock",
    "allocator_time",
    "collector_off",
    "copy_bytes",
    "kernel_time",
    "l2_flush_bytes",
    "long_lived_frozen",
    "measure_copy_gbps",
    "theoretical_dram_gbps",
    "timed_call",
]


class MeasuredClock:
    """A monotonic clock that only moves when told: ``advance(seconds)``.

    ``now()`` returns the accumulated seconds; used as pytest-benchmark's ``timer`` so that a
    round's duration is exactly what the target measured and added.
    """

    def __init__(self) -> None:
        self._elapsed_s = 0.0

    def now(self) -> float:
        """Accumulated measured seconds."""
        return self._elapsed_s

    def advance(self, seconds: float) -> None:
        """Add one measurement (seconds >= 0)."""
        if seconds < 0:
            raise KVCheckInputError(f"a measured duration cannot be negative: {seconds} s")
        self._elapsed_s += seconds


#: Clock of the allocator benchmarks: time inside the implementation's protocol calls.
ALLOCATOR_CLOCK = MeasuredClock()
#: Clock of the kernel benchmarks: CUDA-event (or, on the CPU, host) time of one kernel call.
KERNEL_CLOCK = MeasuredClock()


@contextmanager
def collector_off(*, collect: bool = True) -> Iterator[None]:
    """The benchmarks' one garbage-collection policy around a measured region: a full
    collection first (``collect``; so garbage made before is not collected inside), the
    collector off inside, and put back as it was after. Both sides of a pair, the tools and
    the counting child all measure this way (pytest-benchmark's ``disable_gc=True`` does the
    same around its own rounds, after the bench's ``setup`` collected)."""
    if collect:
        gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def long_lived_frozen() -> Iterator[None]:
    """What is alive on entry (the modules, the workload, both sides' benches) out of the
    collector's generations for the block (``gc.freeze`` after a full collection;
    ``gc.unfreeze`` on exit), so that the full collection ``collector_off`` makes before each
    round walks only what the rounds made. A ``kvcheck bench stability`` run of one scenario:
    3.7 s instead of 6.4 s, a third of it spent walking the same workload before every round.

    Nothing is done when objects are frozen already: a pytest session froze its own at the end
    of collection (``kvcheck.plugin.resources``), and unfreezing here would give those back
    too."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()  # the garbage made so far is freed, not frozen
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def timed_call(samples: list[int], fn: Callable[..., R], *args: object) -> R:
    """``fn(*args)``, appending its wall time in nanoseconds (``perf_counter_ns``) to
    ``samples``: how the scheduler loop and the recorded replay time each protocol call."""
    start = time.perf_counter_ns()
    result = fn(*args)
    samples.append(time.perf_counter_ns() - start)
    return result


def allocator_time() -> float:
    """pytest-benchmark ``timer`` of the allocator benchmarks (``ALLOCATOR_CLOCK.now()``)."""
    return ALLOCATOR_CLOCK.now()


def kernel_time() -> float:
    """pytest-benchmark ``timer`` of the kernel benchmarks (``KERNEL_CLOCK.now()``)."""
    return KERNEL_CLOCK.now()


class CallTimer:
    """Times one call of a zero-argument function; returns ``(result, seconds)``."""

    device = "none"

    def __call__(self, fn: Callable[[], R]) -> tuple[R, float]:  # pragma: no cover
        raise NotImplementedError


class HostTimer(CallTimer):
    """``time.perf_counter`` around the call (CPU tensors: the call is synchronous)."""

    device = "cpu"

    def __call__(self, fn: Callable[[], R]) -> tuple[R, float]:
        start = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - start


class CudaEventTimer(CallTimer):
    """Two CUDA events around the call on the current stream, then a wait on the end event.

    Measures GPU time from the start event to the end event: the kernel(s) the call enqueues,
    plus any GPU idle time while the host is still launching them. With a cold L2 the flush
    kernel enqueued just before keeps the GPU busy while the host records the start event and
    launches the call (as in Triton's ``do_bench``), so a kernel's Python launch path is hidden
    when the flush outlasts it; with a warm L2 launch overhead shows for microsecond kernels,
    and a multi-kernel call (the torch references) always includes its own host work.
    """

    device = "cuda"

    def __init__(self) -> None:
        import torch

        event: Any = torch.cuda.Event  # Any: torch leaves its __init__ unannotated
        self._start = event(enable_timing=True)
        self._end = event(enable_timing=True)

    def __call__(self, fn: Callable[[], R]) -> tuple[R, float]:
        self._start.record()
        result = fn()
        self._end.record()
        self._end.synchronize()
        return result, self._start.elapsed_time(self._end) * 1e-3  # ms -> s


def l2_flush_bytes(l2_cache_bytes: int | None, minimum_bytes: int = 256 * 2**20) -> int:
    """Size of the buffer written between timed calls to evict L2: ``max(2 * L2, 256 MiB)``.

    Twice the L2 (FlashInfer's rule) and never less than Triton's 256 MiB, so an unknown or
    small L2 report still flushes. E.g. H100/H200 report 50 MiB -> 256 MiB; a 129 MiB L2 ->
    258 MiB.
    """
    l2 = max(0, int(l2_cache_bytes or 0))
    return max(2 * l2, minimum_bytes)


class L2Flusher:
    """Zeroes a ``l2_flush_bytes`` device buffer before each timed call (outside the events).

    ``mode="cold"`` flushes; ``mode="warm"`` does nothing (and the record says so).
    """

    def __init__(self, device: torch.device | str, l2_cache_bytes: int | None,
                 mode: str = "cold") -> None:
        if mode not in ("cold", "warm"):
            raise KVCheckInputError(f"L2 mode must be 'cold' or 'warm', got {mode!r}")
        self.mode = mode
        self.num_bytes = l2_flush_bytes(l2_cache_bytes) if mode == "cold" else 0
        self._buffer = None
        if mode == "cold":
            import torch

            self._buffer = torch.empty(self.num_bytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        if self._buffer is not None:
            self._buffer.zero_()


def theoretical_dram_gbps(mem_clock_khz: float, bus_width_bits: int) -> float:
    """Theoretical DRAM bandwidth in decimal GB/s from the driver's memory clock and bus width.

    ``clock_kHz * 1e3 * bus_bits / 8 * 2 (double data rate) / 1e9``; e.g. 2_619_000 kHz on a
    5120-bit bus (H100 SXM's HBM3) -> 3352.32 GB/s. Triton's ``get_dram_gbps`` uses the same
    formula; the clock and width come from the driver, never from a table of marketing names.
    """
    if mem_clock_khz <= 0 or bus_width_bits <= 0:
        raise KVCheckInputError(
            f"memory clock ({mem_clock_khz} kHz) and bus width ({bus_width_bits} bits) must be > 0"
        )
    return mem_clock_khz * 1e3 * bus_width_bits / 8 * 2 / 1e9


def copy_bytes(num_bytes: int) -> int:
    """Bytes a device-to-device copy of ``num_bytes`` moves: read once plus write once."""
    return 2 * num_bytes


def measure_copy_gbps(device: torch.device | str, num_bytes: int, repeats: int = 10
                      ) -> tuple[float, list[float]]:
    """Achievable copy bandwidth: ``dst.copy_(src)`` of ``num_bytes`` timed ``repeats`` times.

    CUDA: CUDA events per copy (the buffers should be >= 4x L2 so the copy streams from DRAM).
    CPU: ``perf_counter``. Returns ``(median GB/s, per-repeat GB/s)``; one untimed warm-up
    copy comes first.
    """
    import torch

    from kvcheck.bench.measure.metrics import gbps, percentile

    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    timer: CallTimer = CudaEventTimer() if src.is_cuda else HostTimer()
    dst.copy_(src)
    if src.is_cuda:
        torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        _, seconds = timer(partial(dst.copy_, src))
        samples.append(gbps(copy_bytes(src.numel() * 4), seconds))
    del src, dst
    return percentile(samples, 50), samples
