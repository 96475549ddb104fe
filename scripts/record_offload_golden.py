#!/usr/bin/env python3
"""Record the offload area's golden scenarios from vLLM's own ``CPUOffloadingManager``
(``conformance/offload_golden.json``, read by ``test_golden_offload_scenario``).

Run it in an environment with vLLM 0.33 (``scripts/vllm-cpu-env.sh 0.33.0 DIR``)::

    DIR/venv/bin/python scripts/record_offload_golden.py            # rewrite the file
    DIR/venv/bin/python scripts/record_offload_golden.py --check    # exit 1 if it differs

Each scenario is a list of calls made through the vLLM adapter (``--kv-impl=vllm``) with every
answer as vLLM gave it (slots left out: where a tier puts a key is its own business). The
scenarios: hand-written ones for each rule of the area, and seeded scheduler-like workloads
(``kvcheck.conformance.offload_workloads``) for both policies, with and without the admission
filter and with two KV-cache groups.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.offload_driver import OffloadRun
from kvcheck.conformance.offload_protocol import OffloadSpec
from kvcheck.conformance.offload_workloads import block_keys, run_actions
from kvcheck.results.io import write_atomic

GOLDEN = Path(__file__).resolve().parent.parent / "conformance" / "offload_golden.json"


def _encode(value: Any, table: dict[bytes, int]) -> Any:
    """Keys as ``{"k": i}``, ``i`` their index in the scenario's ``keys`` (hex), positions as
    ``{"positions": [[i, end_token], ...]}``."""
    if isinstance(value, bytes):
        return {"k": table.setdefault(value, len(table))}
    if isinstance(value, list):
        return [_encode(v, table) for v in value]
    if isinstance(value, dict):
        if value and all(isinstance(k, bytes) for k in value):
            return {"positions": [[table.setdefault(k, len(table)), v] for k, v in value.items()]}
        return {k: _encode(v, table) for k, v in value.items()}
    return value


class _Recording(OffloadRun):
    """An ``OffloadRun`` (laws checked) that keeps every call's answer."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.answers: list[Any] = []

    def call(self, name: str, *args: Any) -> Any:
        answer = super().call(name, *args)
        shown = answer
        if name == "prepare_store" and answer is not None:
            shown = {k: answer[k] for k in ("keys_to_store", "evicted_keys")}
        elif name == "prepare_load":
            shown = None
        self.answers.append(shown)
        return answer


def _keys(document: int, n: int) -> tuple[list[bytes], dict[bytes, int]]:
    blocks = block_keys(document, n, 1)
    return [k for k, _ in blocks], dict(blocks)


def _store(run: OffloadRun, rid: str, keys: list[bytes], success: bool = True) -> None:
    answer = run.call("prepare_store", keys, rid)
    if answer is not None and answer["keys_to_store"]:
        run.call("complete_store", answer["keys_to_store"], rid, success)


def _lru_recency(run: OffloadRun) -> None:
    """Tail before head, touch, a finished request's head newest, pinned keys re-ranked."""
    keys, pos = _keys(2, 6)
    other, other_pos = _keys(0, 6)
    run.call("on_new_request", "a")
    run.call("set_key_positions", "a", pos)
    _store(run, "a", keys[:4])
    run.call("prepare_load", keys[:1], "a")
    run.call("touch", keys[2:4], "a")
    run.call("on_request_finished", "a")
    run.call("on_new_request", "b")
    run.call("set_key_positions", "b", other_pos)
    _store(run, "b", other[:2])
    run.call("complete_load", keys[:1], "a")
    _store(run, "b", other[2:5])
    run.call("take_events")


def _arc_adaptation(run: OffloadRun) -> None:
    """T1 to T2 on reuse, ghost hits on B1 and B2 moving the target, eviction from each list."""
    keys, pos = _keys(2, 8)
    other, other_pos = _keys(0, 8)
    for i, (ks, ps) in enumerate([(keys[:3], pos), (other[:3], other_pos)]):
        rid = f"s{i}"
        run.call("on_new_request", rid)
        run.call("set_key_positions", rid, ps)
        _store(run, rid, ks)
        run.call("on_request_finished", rid)
    run.call("on_new_request", "reuse")
    run.call("set_key_positions", "reuse", pos)
    run.call("prepare_load", keys[:2], "reuse")
    run.call("complete_load", keys[:2], "reuse")
    run.call("on_request_finished", "reuse")
    for i, (ks, ps) in enumerate([(keys[3:6], pos), (keys[:3], pos), (other[:4], other_pos)]):
        rid = f"t{i}"
        run.call("on_new_request", rid)
        run.call("set_key_positions", rid, ps)
        _store(run, rid, ks)
        run.call("on_request_finished", rid)
    run.call("take_events")


def _threshold(run: OffloadRun) -> None:
    """The admission filter with a tracker of 3 keys: counts, tracker overflow."""
    keys, pos = _keys(2, 6)
    run.call("on_new_request", "a")
    run.call("set_key_positions", "a", pos)
    for span in (keys[:2], keys[1:3], keys[3:6], keys[:2], keys[4:6], keys[:3]):
        _store(run, "a", span)
    run.call("take_events")


def _failures_and_reset(run: OffloadRun) -> None:
    """A failed store re-stored before the drain, a reset with work in flight."""
    keys, pos = _keys(1, 5)
    run.call("on_new_request", "a")
    run.call("set_key_positions", "a", pos)
    _store(run, "a", keys[:2], success=False)
    _store(run, "a", keys[1:3])
    run.call("take_events")
    run.call("prepare_store", keys[3:5], "a")
    run.call("prepare_load", keys[1:2], "a")
    run.call("reset_cache")
    run.call("take_events")
    _store(run, "a", keys[:3])
    run.call("on_request_finished", "a")
    run.call("take_events")


_SCRIPTED = [
    ("lru_recency", {"num_chunks": 5}, _lru_recency),
    ("arc_adaptation", {"num_chunks": 6, "cache_policy": "arc"}, _arc_adaptation),
    ("lru_threshold", {"num_chunks": 4, "store_threshold": 2, "max_tracker_size": 3}, _threshold),
    ("arc_threshold", {"num_chunks": 4, "cache_policy": "arc", "store_threshold": 2,
                       "max_tracker_size": 3}, _threshold),
    ("lru_failures_and_reset", {"num_chunks": 4}, _failures_and_reset),
    ("arc_failures_and_reset", {"num_chunks": 4, "cache_policy": "arc"}, _failures_and_reset),
]


def _random_specs() -> list[tuple[str, dict[str, Any], int, int]]:
    out = []
    for seed in range(12):
        policy = ("lru", "arc")[seed % 2]
        spec: dict[str, Any] = {"num_chunks": 3 + seed % 6, "cache_policy": policy}
        if seed % 4 == 3:
            spec.update(store_threshold=2, max_tracker_size=4)
        out.append((f"random_{policy}_{seed}", spec, seed, 1 + (seed % 3 == 2)))
    return out


def record() -> dict[str, Any]:
    vllm = load_impl("vllm")
    scenarios = []

    def one(name: str, spec_fields: dict[str, Any], body: Any) -> None:
        spec = OffloadSpec(**spec_fields)
        run = _Recording(vllm.make_offloading_manager(spec), None, spec, "vllm")
        body(run)
        table: dict[bytes, int] = {}
        calls = [{"call": n, "args": _encode(list(a), table), "answer": _encode(r, table)}
                 for (n, a), r in zip(run.log, run.answers, strict=True)]
        scenarios.append({"name": name, "spec": spec_fields, "vllm": vllm.info.version,
                          "keys": [k.hex() for k in table], "calls": calls})

    for name, spec_fields, body in _SCRIPTED:
        one(name, spec_fields, body)
    for name, spec_fields, seed, groups in _random_specs():
        rng = random.Random(seed)
        actions = [(rng.randrange(10), rng.randrange(256), rng.randrange(256))
                   for _ in range(50)]
        one(name, spec_fields, lambda run, a=actions, g=groups: run_actions(run, a, g))
    return {"recorded_with": f"vllm {vllm.info.version}", "scenarios": scenarios}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed file instead of writing it")
    args = parser.parse_args()
    text = json.dumps(record(), separators=(",", ":"), sort_keys=True) + "\n"
    if args.check:
        same = GOLDEN.read_text() == text
        print(f"{GOLDEN.name}: {'up to date' if same else 'differs from what vLLM answers now'}")
        return 0 if same else 1
    write_atomic(GOLDEN, text)
    print(f"wrote {GOLDEN} ({len(json.loads(text)['scenarios'])} scenarios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
