"""The manager-level benchmark hook: same call sequence as the protocol level, the paired
ratio machinery, and an implementation without the hook."""

from __future__ import annotations

import sys
import types

import pytest

from kvcheck.adapters import reference as reference_adapter
from kvcheck.bench.measure.allocator import workload_spec
from kvcheck.bench.replay import native
from kvcheck.bench.replay.harness import record_answers
from kvcheck.bench.workload.scenarios import make_workload
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, UnsupportedSpec
from kvcheck.errors import KVCheckInputError

SCENARIOS = ("shared_system_prompt", "multi_turn_chat", "eviction_pressure", "burst_short")


@pytest.fixture(scope="module")
def reference():
    return load_impl("reference", call_timeout=None)


def _hooked_reference(reference):
    """The reference handle with the hook on its module (whether or not the coordinator has
    re-exported it from kvcheck.adapters.reference yet)."""
    module = types.SimpleNamespace(**vars(reference.module))
    module.make_native_manager = reference_adapter.make_native_manager
    return types.SimpleNamespace(name=reference.name, module=module, info=reference.info)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_native_replay_makes_the_protocol_levels_calls(reference, scenario: str) -> None:
    """Every answer, call by call (hits, new block ids, refusals, frees, pool usage), is the
    protocol level's on the same workload: the loop and the engine state are the same."""
    workload = make_workload(scenario, seed=0, scale=0.15)
    spec = workload_spec(workload)
    protocol = record_answers(lambda s: reference.make_manager(s, guard=False), spec, workload)
    run = native.run_native_workload(reference_adapter.make_native_manager(spec), workload,
                                     record=True)
    assert len(run.answers) == len(protocol)
    assert run.answers == [tuple(a) if isinstance(a, tuple) else a for a in protocol]
    # The same counters as a protocol-level replay.
    from kvcheck.bench.replay.scheduler import run_workload

    proto_run = run_workload(reference.make_manager(spec, guard=False), workload)
    for name in ("scheduled_tokens", "hit_tokens", "preemptions", "steps", "finished",
                 "peak_used_blocks"):
        assert getattr(run, name) == getattr(proto_run, name), name
    assert len(run.allocate_ns) == len(proto_run.allocate_ns)
    assert len(run.lookup_ns) == len(proto_run.lookup_ns)
    assert len(run.free_ns) == len(proto_run.free_ns)


def test_eviction_pressure_preempts_at_the_manager_level_too(reference) -> None:
    workload = make_workload("eviction_pressure", seed=0, scale=0.25)
    run = native.run_native_workload(
        reference_adapter.make_native_manager(workload_spec(workload)), workload)
    assert run.preemptions > 0
    assert 0 < run.request_ns < run.impl_ns


def test_native_factory_lookup(reference) -> None:
    assert native.native_factory(reference_adapter) is reference_adapter.make_native_manager
    assert native.native_factory(types.SimpleNamespace()) is None
    with pytest.raises(KVCheckInputError, match="not a function"):
        native.native_factory(types.SimpleNamespace(make_native_manager=3))


def test_absent_hook_is_reported_not_estimated(reference) -> None:
    workload = make_workload("burst_short", seed=0, scale=0.05)
    bare = types.SimpleNamespace(name="bare", module=types.SimpleNamespace(),
                                 info=reference.info)
    metrics, info = native.manager_level_metrics(bare, _hooked_reference(reference), workload,
                                                 rounds=2, warmup=0)
    assert metrics == []
    assert "manager level not reported" in info["manager_level"]
    assert "bare" in info["manager_level"]


def test_paired_manager_level_ratio(reference) -> None:
    """Two distinct handles on the reference's hook: interleaved pairs, the ratio of every
    pair recorded, the median near 1 (same code on both sides)."""
    workload = make_workload("burst_short", seed=0, scale=0.1)
    hooked = _hooked_reference(reference)
    other = types.SimpleNamespace(name="copy", module=types.SimpleNamespace(
        make_native_manager=reference_adapter.make_native_manager), info=reference.info)
    metrics, info = native.manager_level_metrics(other, hooked, workload, rounds=3, warmup=1)
    names = [m.name for m in metrics]
    assert names == ["manager_scheduled_tokens_per_s", "manager_allocate_slots_calls_per_s"]
    tokens = metrics[0]
    assert tokens.paired is not None and tokens.paired.pairs == 3
    assert len(tokens.samples) == len(tokens.reference_samples or []) == 3
    assert 0.2 < tokens.ratio_to_reference < 5
    assert info["manager_level"].startswith("engine objects")
    assert 0 < info["manager_request_share"] < 1


def test_same_module_is_measured_once(reference) -> None:
    workload = make_workload("burst_short", seed=0, scale=0.05)
    hooked = _hooked_reference(reference)
    metrics, _ = native.manager_level_metrics(hooked, hooked, workload, rounds=2, warmup=0)
    assert all(m.reference_value == m.value and m.paired is None for m in metrics)


def test_hook_declines_multi_group_specs() -> None:
    spec = KVCacheSpec(num_blocks=16, block_size=4,
                       kv_cache_groups=(KVCacheGroupSpec("full_attention"),))
    with pytest.raises(UnsupportedSpec):
        reference_adapter.make_native_manager(spec)


@pytest.mark.parametrize("scenario", ["shared_system_prompt", "eviction_pressure"])
def test_vllm_native_replay_makes_the_protocol_levels_calls(scenario: str) -> None:
    """vLLM's hook against the vLLM adapter: the same answers, call by call (runs in an
    environment with vLLM; skipped elsewhere)."""
    pytest.importorskip("vllm")
    from kvcheck.adapters import vllm_native

    vllm = load_impl("vllm", call_timeout=None)
    workload = make_workload(scenario, seed=0, scale=0.15)
    spec = workload_spec(workload)
    protocol = record_answers(lambda s: vllm.make_manager(s, guard=False), spec, workload)
    run = native.run_native_workload(vllm_native.make_native_manager(spec), workload,
                                     record=True)
    assert run.answers == [tuple(a) if isinstance(a, tuple) else a for a in protocol]
    if scenario == "eviction_pressure":
        assert run.preemptions > 0


class _Benchmark:
    """pytest-benchmark's ``benchmark`` fixture, reduced to ``pedantic`` and ``extra_info``."""

    def __init__(self) -> None:
        self.extra_info: dict = {}

    def pedantic(self, target, setup, rounds: int, warmup_rounds: int) -> None:
        for _ in range(rounds + warmup_rounds):
            args, kwargs = setup()
            target(*args, **kwargs)


def _kv_bench_scheduler(impl, reference):
    from kvcheck.bench.measure.allocator import SchedulerBench
    from kvcheck.bench.session import BenchOptions, BenchSession

    session = BenchSession(BenchOptions(enabled=True, rounds=3, warmup=1))
    request = types.SimpleNamespace(node=types.SimpleNamespace(nodeid="bench::x"))
    workload = make_workload("burst_short", scale=0.05)
    result = session.run_allocator(_Benchmark(), request, impl, reference,
                                   lambda i: SchedulerBench(i, workload), "scheduler",
                                   "burst_short")
    (record,) = session.records("vllm-0.33", {"hardware_key": "cpu:test x2"}, {})
    return result, record


def test_kv_bench_scheduler_results_carry_the_manager_level(reference, monkeypatch) -> None:
    from kvcheck.results.schema import validate_record

    monkeypatch.setattr(reference.module, native.NATIVE_HOOK,
                        reference_adapter.make_native_manager, raising=False)
    impl = types.SimpleNamespace(
        module=types.SimpleNamespace(make_native_manager=reference_adapter.make_native_manager),
        name="copy", info=reference.info, make_manager=reference.make_manager)
    result, record = _kv_bench_scheduler(impl, reference)
    validate_record(record)
    names = [m.name for m in result.metrics]
    assert names[:2] == ["scheduled_tokens_per_s", "allocate_slots_calls_per_s"]  # unchanged
    assert names[-2:] == ["manager_scheduled_tokens_per_s", "manager_allocate_slots_calls_per_s"]
    manager = result.metric("manager_scheduled_tokens_per_s")
    assert manager is not None and manager.paired is not None and manager.paired.pairs == 3
    assert result.info["manager_level"].startswith("engine objects")
    by_name = {m["name"]: m for m in record["metrics"]}
    assert by_name["manager_scheduled_tokens_per_s"]["case"] == "scheduler/burst_short"
    assert len(by_name["manager_scheduled_tokens_per_s"]["extra"]["paired_ratios"]) == 3


def test_kv_bench_without_a_hook_reports_no_manager_figure(reference) -> None:
    impl = types.SimpleNamespace(module=types.SimpleNamespace(), name="bare",
                                 info=reference.info, make_manager=reference.make_manager)
    result, record = _kv_bench_scheduler(impl, reference)
    assert not [m for m in result.metrics if m.name.startswith(native.MANAGER_PREFIX)]
    assert "manager level not reported" in result.info["manager_level"]
    assert not [m for m in record["metrics"] if m["name"].startswith(native.MANAGER_PREFIX)]


def test_stability_both_levels(reference, monkeypatch, capsys) -> None:
    """``--level both``: each scenario at both levels, and the agreement line per scenario."""
    from kvcheck.bench import stability

    monkeypatch.setattr(reference.module, native.NATIVE_HOOK,
                        reference_adapter.make_native_manager, raising=False)
    assert stability.main(["--level", "both", "--scenarios", "burst_short", "--hash-algos",
                           "sha256", "--rounds", "2", "--warmup", "0", "--runs", "1",
                           "--scale", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "scheduler/burst_short " in out and "scheduler/burst_short @manager" in out
    assert "protocol-level ratio / manager-level ratio - 1" in out
    assert out.rstrip().splitlines()[-1].startswith("burst_short")


def test_stability_manager_level_without_hook(monkeypatch, capsys) -> None:
    from kvcheck.bench import stability

    monkeypatch.delattr(sys.modules["kvcheck.adapters.reference"], native.NATIVE_HOOK,
                        raising=False)
    assert stability.main(["--level", "manager", "--runs", "1"]) == 2
    assert "manager level not reported" in capsys.readouterr().out


def test_level_agreement() -> None:
    from kvcheck.bench.measure.metrics import PairedRatio
    from kvcheck.bench.stability import CaseRatio, level_agreement

    def ratio(value: float) -> PairedRatio:
        return PairedRatio(value, value, value, 0.9, 1, (value,))

    cases = [CaseRatio("scheduler", "a", ratio(1.1), 0.0, "protocol"),
             CaseRatio("scheduler", "a", ratio(1.0), 0.0, "manager"),
             CaseRatio("scheduler", "b", ratio(0.5), 0.0, "protocol"),  # no manager figure
             CaseRatio("hashing", "sha256", ratio(1.0), 0.0)]
    assert level_agreement(cases) == {"a": pytest.approx(0.1)}
