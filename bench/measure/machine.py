"""What the benchmarks ran on: the kvcheck commit, the GPU and its bandwidth peaks.

``KernelDevice`` is built once per session, on the first kernel benchmark: it resolves the
device, the timer (CUDA events or ``perf_counter``), the L2 flusher, the theoretical DRAM peak
(``--kv-bench-peak-gbps``, else the driver's memory clock x bus width) and a copy bandwidth
measured right then (device-to-device copy of at least 4x L2). Nothing here initialises CUDA
unless a kernel benchmark runs on it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from kvcheck.bench.measure.timing import (
    CallTimer,
    CudaEventTimer,
    HostTimer,
    L2Flusher,
    measure_copy_gbps,
    theoretical_dram_gbps,
)

__all__ = ["KernelDevice", "kvcheck_commit", "theoretical_peak"]


def kvcheck_commit() -> dict[str, object] | None:
    """``{"id": sha, "dirty": bool}`` of the kvcheck checkout this code runs from, or None
    (an installed wheel, no git). ``KVCHECK_COMMIT=<sha>`` in the environment wins (a copied
    tree without ``.git``, e.g. on a benchmark machine); its ``dirty`` is then unknown."""
    import kvcheck

    pinned = os.environ.get("KVCHECK_COMMIT")
    if pinned:
        return {"id": pinned, "dirty": None, "source": "KVCHECK_COMMIT"}
    root = Path(kvcheck.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                 "--untracked-files=no"], capture_output=True, text=True,
                                timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"id": sha, "dirty": bool(status.strip())}


def theoretical_peak(device_index: int = 0) -> tuple[float | None, str]:
    """``(GB/s, source)`` of the theoretical DRAM bandwidth from the driver, or ``(None, why)``.

    Sources in order: torch's device properties (``memory_clock_rate`` kHz and
    ``memory_bus_width`` bits, when this torch exposes them), Triton's driver utilities, NVML.
    """
    import torch

    props = torch.cuda.get_device_properties(device_index)
    clock, width = getattr(props, "memory_clock_rate", None), getattr(props,
                                                                     "memory_bus_width", None)
    if clock and width:
        return theoretical_dram_gbps(clock, width), "torch device properties"
    try:
        from triton.runtime import driver

        p = driver.active.utils.get_device_properties(device_index)
        return theoretical_dram_gbps(p["mem_clock_rate"], p["mem_bus_width"]), "triton driver"
    except Exception:  # noqa: BLE001 - fall through to NVML
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        width = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        return theoretical_dram_gbps(clock_mhz * 1000, width), "nvml"
    except Exception:  # noqa: BLE001
        return None, "unknown: no memory clock / bus width from torch, triton or NVML"


class DeviceInfo(TypedDict):
    """``KernelDevice.describe()``: the kernel device as records and tables show it."""

    device: str
    name: str
    timer: str
    l2_mode: str
    l2_bytes: int | None
    flush_bytes: int
    theoretical_gbps: float | None
    theoretical_source: str
    copy_gbps: float
    copy_samples_gbps: list[float]
    copy_buffer_bytes: int
    cpu_threads: int | None


@dataclass
class KernelDevice:
    """The timing context of the kernel benchmarks (one per session)."""

    device: str  # "cuda" or "cpu"
    name: str
    timer: CallTimer
    flush: Callable[[], None]  # zero-argument L2 flush (no-op when warm or on the CPU)
    l2_mode: str  # "cold" (flushed before every timed call), "warm" or "uncontrolled"
    l2_bytes: int | None
    flush_bytes: int
    theoretical_gbps: float | None
    theoretical_source: str
    copy_gbps: float
    copy_samples: list[float] = field(default_factory=list)
    copy_buffer_bytes: int = 0
    cpu_threads: int | None = None  # torch intra-op threads while timing on the CPU
    _restore_threads: int | None = None

    @classmethod
    def create(cls, device: str, l2_mode: str = "cold",
               peak_override_gbps: float | None = None) -> KernelDevice:
        """Resolve everything for ``device`` and measure the copy bandwidth now."""
        import torch

        if device == "cuda":
            props = torch.cuda.get_device_properties(0)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0) or None
            flusher = L2Flusher("cuda", l2, l2_mode)
            peak: float | None
            if peak_override_gbps:
                peak, source = peak_override_gbps, "--kv-bench-peak-gbps"
            else:
                peak, source = theoretical_peak(0)
            buffer = max(4 * (l2 or 0), 2**30)
            copy, samples = measure_copy_gbps("cuda", buffer)
            torch.cuda.empty_cache()
            return cls("cuda", props.name, CudaEventTimer(), flusher, flusher.mode, l2,
                       flusher.num_bytes, peak, source, copy, samples, buffer)
        import platform

        # One intra-op thread: on a small or shared machine OpenMP contention between
        # torch's threads and other processes dominates (100x swings were seen on 2 cores).
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        buffer = 64 * 2**20
        copy, samples = measure_copy_gbps("cpu", buffer)
        peak = peak_override_gbps or None
        source = "--kv-bench-peak-gbps" if peak else "unknown on the CPU"
        return cls("cpu", platform.processor() or platform.machine(), HostTimer(),
                   lambda: None, "uncontrolled", None, 0, peak, source, copy, samples, buffer,
                   cpu_threads=1, _restore_threads=previous)

    def restore(self) -> None:
        """Undo ``create``'s process-wide settings (torch's CPU thread count)."""
        if self._restore_threads is not None:
            import torch

            torch.set_num_threads(self._restore_threads)
            self._restore_threads = None

    def describe(self) -> DeviceInfo:
        """Plain data for records and pytest-benchmark's machine info."""
        return {
            "device": self.device, "name": self.name, "timer": type(self.timer).__name__,
            "l2_mode": self.l2_mode, "l2_bytes": self.l2_bytes, "flush_bytes": self.flush_bytes,
            "theoretical_gbps": self.theoretical_gbps,
            "theoretical_source": self.theoretical_source, "copy_gbps": self.copy_gbps,
            "copy_samples_gbps": self.copy_samples, "copy_buffer_bytes": self.copy_buffer_bytes,
            "cpu_threads": self.cpu_threads,
        }
