"""Kernel benchmarks: store_kv_cache, paged_attention_decode, paged_attention_varlen.

Providers side by side on the same cases: ``torch_ref`` (kvcheck's fp32 references),
``kvcheck_triton``, ``impl`` (the implementation's ``kernels()``), ``vllm`` and ``flashinfer``
when importable. CUDA only (CUDA events, L2 flushed before every timed call); with
``--kv-bench-device=cpu`` only the torch references run, host-timed, on tiny shapes. See
``kvcheck.bench.kernels.measure`` for the measurement steps and ``kernel_inputs`` for the inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.bench.kernels.inputs import kernel_cases
from kvcheck.bench.kernels.providers import PROVIDERS, ProviderUnavailable, make_provider
from kvcheck.bench.measure.timing import kernel_time
from kvcheck.bench.plugin import BENCH_STATE
from kvcheck.bench.session import BenchResult

if TYPE_CHECKING:
    from kvcheck.bench.kernels.inputs import KernelBenchCase
    from kvcheck.bench.measure.rounds import BenchmarkFixture
    from kvcheck.bench.session import BenchSession
    from kvcheck.conformance.loader import ImplHandle


_THIRD_PARTY = ("vllm", "flashinfer")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """(case, provider) pairs for the test's op, case-major so one input pool serves all the
    providers of a case; CUDA shapes unless the session times on the CPU."""
    if "kernel_case" not in metafunc.fixturenames:
        return
    op = metafunc.function.__name__.removeprefix("test_")
    device = metafunc.config.stash[BENCH_STATE].session.resolve_device() or "cuda"
    pairs = [(case, provider) for case in kernel_cases(op, device) for provider in PROVIDERS]
    metafunc.parametrize(("kernel_case", "provider"), pairs,
                         ids=[f"{c.name}-{p}" for c, p in pairs])


def _measure(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kernel_case: KernelBenchCase, provider: str) -> None:
    from kvcheck.bench.kernels.measure import measure_kernel

    device = kv_bench.kernel_device()  # skips (with the reason) when kernels cannot run here
    if device.device == "cpu" and provider != "torch_ref":
        pytest.skip("--kv-bench-device=cpu times only the torch references (kvcheck's Triton "
                    "kernels would run in the interpreter; vLLM and FlashInfer need CUDA)")
    case_id = f"{kernel_case.op}/{kernel_case.name}"
    if provider != "impl":
        reason = kv_bench.claim_comparator(provider, case_id, kv_impl.name)
        if reason:
            pytest.skip(reason)
    try:
        prov = make_provider(provider, kv_impl)
    except ProviderUnavailable as exc:
        pytest.skip(str(exc))
    pool = kv_bench.kernel_pool(kernel_case)
    rounds, warmup = kv_bench.options.rounds_for(f"kernels-{device.device}")
    try:
        metrics, info = measure_kernel(benchmark, pool, prov, device, rounds, warmup)
    except ProviderUnavailable as exc:
        pytest.skip(str(exc))
    except (TypeError, RuntimeError, ValueError) as exc:
        if provider not in _THIRD_PARTY:
            raise
        # An API drift in a third-party release: report it, never a made-up figure.
        pytest.skip(f"{prov.label} could not run {case_id}: {type(exc).__name__}: {exc}")
    subject = kv_impl.name if provider == "impl" else provider
    result = BenchResult("kernels", case_id, subject, prov.version, request.node.nodeid,
                         device.device, metrics, info,
                         implementation=kv_impl if provider == "impl" else None)
    kv_bench.add(result, benchmark)


@pytest.mark.benchmark(group="kernels-store_kv_cache", timer=kernel_time)
def test_store_kv_cache(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kernel_case: KernelBenchCase, provider: str) -> None:
    """K/V rows of a decode step / a prefill into fragmented blocks (GB/s of the store)."""
    _measure(benchmark, request, kv_bench, kv_impl, kernel_case, provider)


@pytest.mark.benchmark(group="kernels-paged_attention_decode", timer=kernel_time)
def test_paged_attention_decode(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kernel_case: KernelBenchCase, provider: str) -> None:
    """One query token per sequence over ragged contexts (GB/s of the KV read)."""
    _measure(benchmark, request, kv_bench, kv_impl, kernel_case, provider)


@pytest.mark.benchmark(group="kernels-paged_attention_varlen", timer=kernel_time)
def test_paged_attention_varlen(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kernel_case: KernelBenchCase, provider: str) -> None:
    """A mixed batch of prefills and decodes (GB/s of the compulsory traffic)."""
    _measure(benchmark, request, kv_bench, kv_impl, kernel_case, provider)
