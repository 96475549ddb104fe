"""The harness's own cost: the null adapter replays recorded answers, and the layer split of
an adapter's time (floor, protocol layer, engine)."""

from __future__ import annotations

import pytest

from kvcheck.adapters.reference import make_kv_cache_manager
from kvcheck.bench.measure.allocator import workload_spec
from kvcheck.bench.replay.harness import (
    LayerTimes,
    NullManager,
    measure_layers,
    record_answers,
)
from kvcheck.bench.replay.scheduler import run_workload
from kvcheck.bench.workload.scenarios import make_workload
from kvcheck.errors import KVCheckInputError


def test_null_manager_replays_the_same_run() -> None:
    """Replaying recorded answers reproduces the loop's counters exactly, and the null
    adapter refuses calls beyond the recording."""
    workload = make_workload("eviction_pressure", scale=0.1)
    spec = workload_spec(workload)
    real = run_workload(make_kv_cache_manager(spec), workload)
    answers = record_answers(make_kv_cache_manager, spec, workload)
    null = run_workload(NullManager(answers), workload)
    assert (null.scheduled_tokens, null.preemptions, null.hit_tokens, null.steps) == (
        real.scheduled_tokens, real.preemptions, real.hit_tokens, real.steps)
    assert len(null.allocate_ns) == len(real.allocate_ns)
    with pytest.raises(KVCheckInputError, match="more calls"):
        NullManager([]).free("x")


def test_layer_arithmetic() -> None:
    """adapter 100, engine 60, floor 10, proxy 5 -> protocol 25 = 41.7 % of the engine;
    harness share 10 %."""
    lt = LayerTimes(adapter_ns=100.0, floor_ns=10.0, engine_ns=60.0, proxy_ns=5.0)
    assert lt.protocol_ns == 25.0
    assert lt.protocol_share == pytest.approx(25 / 60)
    assert lt.harness_share == pytest.approx(0.1)
    assert LayerTimes(adapter_ns=100.0, floor_ns=10.0).protocol_share is None


def test_measure_layers_on_the_reference() -> None:
    """The engine's time and the floor are each a strict part of the adapter's time."""
    workload = make_workload("shared_system_prompt", scale=0.1)
    lt = measure_layers(make_kv_cache_manager, workload_spec(workload), workload, rounds=1)
    assert lt.engine_ns is not None
    assert 0 < lt.floor_ns < lt.adapter_ns
    assert 0 < lt.engine_ns < lt.adapter_ns
