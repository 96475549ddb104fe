"""One kernel benchmark: warm-up, timed rounds, re-check, figures.

For a (case, provider):

1. a first call on fresh inputs, host-timed with a device sync (``first_call_s``: Triton JIT
   compile and autotuning land here, not in the statistics);
2. ``warmup`` untimed rounds then ``rounds`` timed rounds through ``benchmark.pedantic``:
   each round gets fresh inputs from ``setup`` (the next disjoint block set, new Q / K / V,
   host-side preparation such as FlashInfer's ``plan``); the target flushes L2 (cold mode),
   then times exactly one call between two CUDA events and advances ``KERNEL_CLOCK``;
3. the last timed round's output is re-checked: stores by reading every written slot back,
   attention against the fp32 torch reference within kvcheck's per-dtype tolerance. A fast but
   wrong kernel fails its benchmark;
4. figures: time per call, GB/s from the bytes model, % of the theoretical and of the measured
   copy peak.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict

from kvcheck.bench.errors import BenchCheckFailure
from kvcheck.bench.kernels.inputs import KernelInputPool, KernelInputs, bytes_per_call
from kvcheck.bench.kernels.providers import Prepared, Provider
from kvcheck.bench.measure.machine import KernelDevice
from kvcheck.bench.measure.metrics import Metric, gbps, pct_of_peak, percentile
from kvcheck.bench.measure.rounds import BenchmarkFixture, SetupArgs
from kvcheck.bench.measure.timing import KERNEL_CLOCK

__all__ = ["kernel_metrics", "measure_kernel", "verify_output"]


def verify_output(inputs: KernelInputs, out: Any, provider: Provider) -> str:  # Any: Prepared's
    """Re-check one call's result; returns what was checked (raises AssertionError if wrong)."""
    import torch

    case = inputs.case
    if case.op == "store_kv_cache":
        valid = (inputs.slot_mapping >= 0).nonzero().flatten()
        slots = inputs.slot_mapping[valid]
        for which, cache, src in (("key_cache", inputs.key_cache, inputs.key),
                                  ("value_cache", inputs.value_cache, inputs.value)):
            got = cache.view(-1, case.num_kv_heads, case.head_size)[slots]
            want = src[valid].to(cache.dtype)
            if not torch.equal(got, want):
                bad = int((got != want).reshape(len(valid), -1).any(dim=1).nonzero()[0, 0])
                raise BenchCheckFailure(
                    f"{provider.label} store_kv_cache[{case.name}]: {which} at slot "
                    f"{int(slots[bad])} (token {int(valid[bad])}) does not hold the token's "
                    f"row after the timed call")
        return f"every written slot read back ({len(valid)} tokens, bit-exact)"
    if provider.is_reference:
        return "not re-checked: this is the reference"
    from kvcheck.gpu_kernels.conformance import assert_attention_close
    from kvcheck.gpu_kernels.reference import (
        paged_attention_decode_ref,
        paged_attention_varlen_ref,
    )

    if case.op == "paged_attention_decode":
        ref = paged_attention_decode_ref(inputs.query, inputs.key_cache, inputs.value_cache,
                                         inputs.block_table, inputs.seq_lens, inputs.scale)
    else:
        ref = paged_attention_varlen_ref(inputs.query, inputs.key_cache, inputs.value_cache,
                                         inputs.block_table, inputs.query_start_loc,
                                         inputs.seq_lens, inputs.scale)
    assert_attention_close(f"{provider.label} {case.op}", case.name, out, ref, case.dtype,
                           ("token", "head", "dim"))
    return "output vs fp32 torch reference within kvcheck's tolerance"


class _Last(TypedDict, total=False):
    """The last timed round's inputs and output (re-checked after the rounds)."""

    inputs: KernelInputs
    out: object


def kernel_metrics(seconds: list[float], bytes_moved: int, device: KernelDevice) -> list[Metric]:
    """Time, GB/s and % of both peaks from per-round seconds (headline = median round)."""
    rates = [gbps(bytes_moved, s) for s in seconds]
    median_rate = percentile(rates, 50)
    out = [
        Metric("time_us", "us", "lower_is_better", percentile(seconds, 50) * 1e6,
               [s * 1e6 for s in seconds]),
        Metric("gbps", "GB/s", "higher_is_better", median_rate, rates),
    ]
    for name, peak in (("pct_theoretical_peak", device.theoretical_gbps),
                       ("pct_copy_peak", device.copy_gbps)):
        pct = pct_of_peak(median_rate, peak)
        if pct is not None:
            out.append(Metric(name, "%", "higher_is_better", pct,
                              [pct_of_peak(r, peak) or 0.0 for r in rates]))
    return out


def _sync(device: KernelDevice) -> None:
    if device.device == "cuda":
        import torch

        torch.cuda.synchronize()


def measure_kernel(benchmark: BenchmarkFixture, pool: KernelInputPool, provider: Provider,
                   device: KernelDevice, rounds: int, warmup: int
                   ) -> tuple[list[Metric], dict[str, object]]:
    """Steps 1-4 of the module docstring; returns ``(metrics, info)``."""
    first_inputs = pool.next_round()
    call = provider.prepare(first_inputs)
    start = time.perf_counter()
    call()
    _sync(device)
    first_call_s = time.perf_counter() - start

    seconds: list[float] = []
    last: _Last = {}

    def setup() -> SetupArgs:
        inputs = pool.next_round()
        last["inputs"] = inputs
        return (provider.prepare(inputs),), {}

    def target(prepared: Prepared) -> None:
        device.flush()
        out, elapsed = device.timer(prepared)
        KERNEL_CLOCK.advance(elapsed)
        seconds.append(elapsed)
        last["out"] = out

    benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=warmup)
    timed = seconds[warmup:] if len(seconds) > warmup else seconds
    _sync(device)
    checked = verify_output(last["inputs"], last["out"], provider)
    bytes_moved = bytes_per_call(pool.case)
    info = {
        **pool.case.describe(), "provider": provider.name, "provider_label": provider.label,
        "bytes_per_call": bytes_moved, "bytes_model": "compulsory (kvcheck.bench.measure.metrics)",
        "first_call_s": first_call_s, "rounds": len(timed), "warmup_rounds": warmup,
        "l2": device.l2_mode, "l2_flush_bytes": device.flush_bytes,
        "timer": type(device.timer).__name__, "recheck": checked,
        "pool_bytes": pool.pool_bytes,
    }
    return kernel_metrics(timed, bytes_moved, device), info
