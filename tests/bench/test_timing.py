"""Clocks, timers, L2 flush sizing and bandwidth peaks (the arithmetic of the CUDA paths runs
here on the CPU; the CUDA calls themselves are exercised by bench/run_gpu.sh)."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from kvcheck.bench.measure.timing import (
    HostTimer,
    L2Flusher,
    MeasuredClock,
    copy_bytes,
    l2_flush_bytes,
    theoretical_dram_gbps,
)


def test_measured_clock_moves_only_by_measurements() -> None:
    """pytest-benchmark's round time = what the target added, nothing else."""
    clock = MeasuredClock()
    start = clock.now()
    time.sleep(0.01)  # wall time passes; the clock does not
    clock.advance(0.25)
    clock.advance(0.5)
    assert clock.now() - start == 0.75
    with pytest.raises(ValueError, match="cannot be negative"):
        clock.advance(-1e-9)


def test_host_timer_returns_the_result_and_a_duration() -> None:
    result, seconds = HostTimer()(lambda: 42)
    assert result == 42 and 0 <= seconds < 1


def test_l2_flush_is_twice_l2_and_at_least_256_mib() -> None:
    """50 MiB (H100/H200) -> 256 MiB floor; 129 MiB -> 258 MiB; unknown -> 256 MiB."""
    mib = 2**20
    assert l2_flush_bytes(50 * mib) == 256 * mib
    assert l2_flush_bytes(129 * mib) == 258 * mib
    assert l2_flush_bytes(None) == 256 * mib
    assert L2Flusher("cpu", 50 * mib, mode="warm").num_bytes == 0
    L2Flusher("cpu", None, mode="warm")()  # a warm flusher is a no-op
    with pytest.raises(ValueError, match="'cold' or 'warm'"):
        L2Flusher("cpu", None, mode="lukewarm")


def test_theoretical_dram_bandwidth_formula() -> None:
    """2_619_000 kHz on a 5120-bit bus, double data rate: 2.619e9 * 640 B * 2 = 3352.32 GB/s."""
    assert theoretical_dram_gbps(2_619_000, 5120) == pytest.approx(3352.32)
    with pytest.raises(ValueError, match="must be > 0"):
        theoretical_dram_gbps(0, 5120)


def test_copy_moves_each_byte_twice() -> None:
    assert copy_bytes(2**30) == 2 * 2**30


def test_measured_copy_bandwidth_on_the_cpu() -> None:
    """The copy-peak probe runs anywhere torch runs: positive GB/s, one sample per repeat."""
    pytest.importorskip("torch")
    from kvcheck.bench.measure.timing import measure_copy_gbps

    median, samples = measure_copy_gbps("cpu", 4 * 2**20, repeats=3)
    assert len(samples) == 3 and median > 0


def test_theoretical_peak_prefers_torch_properties(monkeypatch) -> None:
    """With memory clock and bus width in torch's device properties, those are used."""
    torch = pytest.importorskip("torch")
    from kvcheck.bench.measure.machine import theoretical_peak

    props = SimpleNamespace(memory_clock_rate=2_619_000, memory_bus_width=5120)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    peak, source = theoretical_peak(0)
    assert peak == pytest.approx(3352.32) and source == "torch device properties"


@pytest.mark.parametrize("was_enabled", [True, False])
def test_collector_off_collects_first_and_restores_the_collector(was_enabled: bool) -> None:
    """The one GC policy: a full collection before the region (``collect=True``), none with
    ``collect=False``, the collector off inside, and afterwards as it was before."""
    import gc

    from kvcheck.bench.measure.timing import collector_off

    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    (gc.enable if was_enabled else gc.disable)()
    gc.callbacks.append(seen)
    try:
        with collector_off():
            assert not gc.isenabled()
            assert collections == [2]  # one full collection, before the region
        assert gc.isenabled() is was_enabled
        collections.clear()
        with collector_off(collect=False):
            assert not gc.isenabled()
        assert collections == [] and gc.isenabled() is was_enabled
    finally:
        gc.callbacks.remove(seen)
        gc.enable()


#: Run in a fresh interpreter: here, unfreezing the heap this file's fixture froze
#: (``_frozen_heap``) would hand an xdist worker's millions of objects to the collections
#: below (2.2 s instead of 0.1 s).
_FROZEN_PROBE = """
import gc, weakref
from kvcheck.bench.measure.timing import collector_off, long_lived_frozen

class Cycle:  # garbage only the collector frees
    def __init__(self):
        self.me = self

def frozen(obj):  # in the permanent generation: tracked, in no generation a collection walks
    return gc.is_tracked(obj) and not any(o is obj for o in gc.get_objects())

assert gc.get_freeze_count() == 0
alive = Cycle()
garbage = weakref.ref(Cycle())
with long_lived_frozen():
    assert garbage() is None  # collected first, not frozen
    made = Cycle()
    with collector_off():  # a round's full collection
        pass
    assert frozen(alive) and not frozen(made)
assert not frozen(alive) and not frozen(made) and gc.get_freeze_count() == 0
gc.freeze()  # a pytest session's, say
late = Cycle()
with long_lived_frozen():
    assert frozen(alive) and not frozen(late)
assert frozen(alive)  # not given back
print("ok")
"""


def test_long_lived_frozen_freezes_what_is_alive_and_gives_it_back() -> None:
    """Around a tool's rounds: the garbage made before is collected, not frozen; what is alive
    is frozen (so each round's full collection skips it) and what the rounds make is not;
    everything is given back at the end. Where objects are frozen already (a pytest
    session's), nothing changes."""
    proc = subprocess.run([sys.executable, "-c", _FROZEN_PROBE], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr[-2000:]
