"""``EventWireBench``: a round times take_event_batch after every step and counts the events
its payloads decode to; bytes no consumer could decode stop the benchmark, naming the step."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("msgspec")

from kvcheck.bench.kinds.event_wire import EventWireBench
from kvcheck.bench.workload.scenarios import make_workload
from kvcheck.conformance.loader import load_impl
from kvcheck.errors import KVCheckFailure


class _Garbled:
    """A reference manager whose third payload is cut short."""

    def __init__(self, manager: Any) -> None:
        self._manager, self._calls = manager, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)

    def take_event_batch(self, ts: float) -> bytes:
        self._calls += 1
        payload = self._manager.take_event_batch(ts)
        return payload[:-3] if self._calls == 3 else payload


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_a_round_counts_every_event_of_the_stream(profile: str) -> None:
    impl = load_impl("reference", call_timeout=None)
    bench = EventWireBench(impl, make_workload("eviction_pressure", 0, 0.05), profile)
    (manager,), _ = bench.setup()
    bench.run(manager)
    events, size, ns = bench.results[0]
    assert events > 50 and size > events * 10 and ns > 0
    assert bench.info()["events_per_round"] == events and bench.info()["release"] == profile
    names = [m.name for m in bench.metrics(bench.results)]
    assert names == ["events_encoded_per_s", "payload_bytes_per_s"]


def test_bytes_no_consumer_decodes_stop_the_benchmark() -> None:
    impl = load_impl("reference", call_timeout=None)
    bench = EventWireBench(impl, make_workload("eviction_pressure", 0, 0.05), "vllm-0.33")
    (manager,), _ = bench.setup()
    with pytest.raises(KVCheckFailure, match=r"take_event_batch\(2\.0\) after step 2 of "
                                             r"eviction_pressure is not a vllm-0\.33 "):
        bench.run(_Garbled(manager))
