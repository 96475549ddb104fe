"""Each scenario reports what it produced; eviction_pressure really preempts."""

from __future__ import annotations

import pytest

from kvcheck.adapters.reference import make_kv_cache_manager
from kvcheck.bench.measure.allocator import workload_spec
from kvcheck.bench.replay.scheduler import run_workload
from kvcheck.bench.workload.scenarios import RequestSpec, make_workload, trace_profile

#: Preemptions the reference must at least produce on eviction_pressure at the default
#: scale and seed (it produces 31; at the old 50 % pool and 16 running it produced 0).
EVICTION_PREEMPTION_FLOOR = 20


def test_eviction_pressure_preempts_at_the_default_scale() -> None:
    workload = make_workload("eviction_pressure")
    run = run_workload(make_kv_cache_manager(workload_spec(workload)), workload)
    assert run.preemptions >= EVICTION_PREEMPTION_FLOOR
    assert run.peak_usage == 1.0
    assert 0.3 < run.prefix_hit_rate < 0.9  # still a prefix-caching workload


def test_trace_profile_hand_computed() -> None:
    """Block size 2. r0 = [1 2 | 3 4 | 5]; r1 = [1 2 | 3 4 | 9 9]; r2 = [3 4]: r1 shares
    blocks [1 2] and [3 4] (same parents); r2's [3 4] has no parent, so it is new.
    Full prompt blocks 2 + 3 + 1 = 6, shared 2 -> 1/3. Lengths [5, 6, 2]."""
    reqs = [RequestSpec("r0", 0, (1, 2, 3, 4, 5), (7,)),
            RequestSpec("r1", 0, (1, 2, 3, 4, 9, 9), (7,)),
            RequestSpec("r2", 0, (3, 4), (7,))]
    profile = trace_profile(reqs, block_size=2)
    assert profile["shared_prefix_fraction"] == pytest.approx(2 / 6)
    assert profile["prompt_tokens_max"] == 6.0
    assert profile["prompt_tokens_p50"] == 5.0  # nearest rank: index 3 * 50 // 100 = 1
    assert profile["prompt_tokens_p10"] == 2.0
