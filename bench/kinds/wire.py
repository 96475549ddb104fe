"""The wire's cost per call (``exec:`` implementations, docs/wire-protocol.md): the round trip
of a call that carries nothing (``num_free_blocks``) and of one that carries a 512-token request
(``get_computed_blocks`` on an empty cache), in microseconds, paired with the same calls on
kvcheck's reference in process (the ratio is then the wire's factor over a Python call).

A round makes ``calls`` of each on a fresh manager (made untimed); each call is timed alone
(``perf_counter_ns``), so the figure is the engine's answer time plus the two pipes and two
JSON codecs, nothing of kvcheck's own bookkeeping.
"""

from __future__ import annotations

import gc
import time
from typing import Final

from kvcheck.bench.measure.allocator import per_round
from kvcheck.bench.measure.metrics import Metric
from kvcheck.bench.measure.rounds import RoundBench, SetupArgs
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.protocol import KVCacheSpec, ManagerWithCapabilities, RequestView

__all__ = ["WireRoundTripBench"]

#: Tokens of the request the carrying call sends.
REQUEST_TOKENS: Final = 512
#: Calls of each kind per round at scale 1 (CI's scale 0.1: 200).
_CALLS_AT_SCALE_1: Final = 2000


class WireRoundTripBench(RoundBench[tuple[int, int, int]]):
    """Per round: ``calls`` empty calls, then ``calls`` lookups of one 512-token request."""

    def __init__(self, impl: ImplHandle, scale: float = 1.0) -> None:
        super().__init__()
        self.impl = impl
        self.calls = max(50, round(_CALLS_AT_SCALE_1 * scale))
        self.request = RequestView("wire-bench", tuple(range(1, REQUEST_TOKENS + 1)))

    def setup(self) -> SetupArgs:
        spec = KVCacheSpec(num_blocks=64, block_size=16)
        manager = self.impl.make_manager(spec, guard=False)
        gc.collect()
        return (manager,), {}

    def run(self, manager: ManagerWithCapabilities) -> None:
        clock = time.perf_counter_ns
        empty = carrying = 0
        for _ in range(self.calls):
            start = clock()
            manager.num_free_blocks()
            empty += clock() - start
        request = self.request
        for _ in range(self.calls):
            start = clock()
            manager.get_computed_blocks(request)
            carrying += clock() - start
        self.results.append((self.calls, empty, carrying))
        self.advance((empty + carrying) / 1e9)

    def info(self) -> dict[str, object]:
        return {"calls_per_kind": self.calls, "request_tokens": REQUEST_TOKENS}

    def metrics(self, results: list[tuple[int, int, int]]) -> list[Metric]:
        return [
            per_round("empty_call_us", "us/call", "lower_is_better",
                      [ns / n / 1e3 for n, ns, _ in results]),
            per_round(f"lookup_{REQUEST_TOKENS}_tokens_us", "us/call", "lower_is_better",
                      [ns / n / 1e3 for n, _, ns in results]),
        ]
