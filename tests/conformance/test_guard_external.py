"""The guard and external-KV answers (capability ``external_kv``): an adapter that answers
what vLLM 0.33 itself returns (the blocks after the external ones) instead of every block the
call added is a protocol violation naming the call and the rule; a correct answer passes.
Traces carry the external-KV ops and refuse malformed ones."""

from __future__ import annotations

from typing import Any

import pytest

from kvcheck.adapters.reference import ReferenceManager
from kvcheck.conformance.call_limit import CallLimit
from kvcheck.conformance.guard import GuardedManager, ProtocolViolation
from kvcheck.conformance.ops import add, cache, evict, schedule
from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.conformance.trace_check import TraceError, check_ops

SPEC = KVCacheSpec(num_blocks=16, block_size=4)


class RawAnswer(ReferenceManager):
    """Returns vLLM 0.33's own answer: the external tokens' blocks left out."""

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0, new_computed_block_ids: Any = (),
                       num_lookahead_tokens: int = 0, *, num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False) -> Any:
        req = self._requests.sync(request)
        new = self.manager.allocate_slots(
            req, num_new_tokens, num_new_computed_tokens, None, num_lookahead_tokens,
            delay_cache_blocks, num_external_computed_tokens=num_external_computed_tokens)
        return None if new is None else [b.block_id for b in new[0]]


def _guarded(raw: object) -> GuardedManager:
    return GuardedManager(raw, impl="fake", spec=SPEC, reserved=(0,), limit=CallLimit(None))


def test_leaving_out_the_external_blocks_is_a_protocol_violation() -> None:
    guarded = _guarded(RawAnswer(SPEC))
    view = RequestView("a", tuple(range(12)))
    with pytest.raises(ProtocolViolation, match=r"get_block_ids\('a'\) returned \[1, 2, 3\]: "
                       r"the block table must be \[3\].*allocate_slots\('a'\) returned \[3\]"):
        guarded.allocate_slots_per_group(view, 4, 0, [[]], num_external_computed_tokens=8)


def test_every_added_block_is_the_answer() -> None:
    guarded = _guarded(ReferenceManager(SPEC))
    view = RequestView("a", tuple(range(12)))
    new = guarded.allocate_slots_per_group(view, 4, 0, [[]], num_external_computed_tokens=8)
    assert new == [[1, 2, 3]] and guarded.get_block_ids("a") == [1, 2, 3]


def test_traces_accept_external_kv_ops_and_refuse_bad_fields() -> None:
    """Traces (``kvcheck replay``) carry the external-KV ops; bad fields are trace errors."""
    ops = [add("a", list(range(12))), schedule("a", external=8, delay=True), cache("a", 8),
           evict([1, 2])]
    assert check_ops(ops, "t.json") == ops
    bad: list[tuple[dict[str, Any], str]] = [
        ({"op": "schedule", "rid": "a", "num_tokens": None, "external": -1},
         r"external=-1: must be an int"),
        ({"op": "schedule", "rid": "a", "num_tokens": None, "delay": 1},
         r"field 'delay'=1: must be true or false"),
        ({"op": "cache", "rid": "a", "num_tokens": "8"}, r"num_tokens='8': must be an int"),
        ({"op": "evict", "block_ids": [1, -2]}, r"field 'block_ids'=\[1, -2\]: must be a list"),
        ({"op": "evict", "block_ids": [1], "rid": "a"}, r"'evict' op has unknown fields \['rid'\]"),
    ]
    for op, words in bad:
        with pytest.raises(TraceError, match=words):
            check_ops([add("a", [1, 2, 3]), op], "t.json")
