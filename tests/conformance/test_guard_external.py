"""The guard and external-KV answers (capability ``external_kv``): an adapter that answers
what vLLM 0.33 itself returns (the blocks after the external ones) instead of every block the
call added is a protocol violation naming the call and the rule; a correct answer passes, and
so does a Mamba group's table with nulls between its external state block and its running one
(vLLM 0.33's own), but not one with its blocks out of order. Traces carry the external-KV ops
and refuse malformed ones."""

from __future__ import annotations

from typing import Any

import pytest

from kvcheck.adapters.reference import ReferenceManager
from kvcheck.conformance.call_limit import CallLimit
from kvcheck.conformance.guard import GuardedManager, ProtocolViolation
from kvcheck.conformance.ops import add, cache, evict, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, RequestView
from kvcheck.conformance.trace_check import TraceError, check_ops

SPEC = KVCacheSpec(num_blocks=16, block_size=4)
#: Full attention at 4 beside a Mamba "align" group at 8 (vLLM 0.33).
MAMBA = KVCacheSpec(num_blocks=16, block_size=4, kv_cache_groups=(
    KVCacheGroupSpec("full_attention", 4), KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")))


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


class MambaBlocksSwapped(ReferenceManager):
    """Reads the Mamba group's two real blocks back in the wrong order."""

    def get_block_ids(self, request_id: str) -> Any:
        full, mamba = super().get_block_ids(request_id)
        real = [i for i, b in enumerate(mamba) if b != 0]
        if len(real) == 2:
            mamba[real[0]], mamba[real[1]] = mamba[real[1]], mamba[real[0]]
        return [full, mamba]


def _guarded(raw: object, spec: KVCacheSpec = SPEC) -> GuardedManager:
    return GuardedManager(raw, impl="fake", spec=spec, reserved=(0,), limit=CallLimit(None))


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


@pytest.mark.parametrize(("num_tokens", "external", "table"), [
    (17, 6, [3, 0, 7]),  # the external state block, a null, the running state's block
    (29, 9, [0, 4, 0, 10]),  # a skipped block's null first, another between
    (25, 17, [0, 0, 6, 9]),  # the nulls before the external block, as for a window
])
def test_a_mamba_groups_nulls_around_its_external_block_pass(num_tokens: int, external: int,
                                                             table: list[int]) -> None:
    """vLLM 0.33's Mamba table after external tokens (the reference's, recorded from vLLM in
    ``hybrid_edge_golden``): the nulls of the skipped blocks may sit before the external state
    block and between it and the running one; the real blocks keep the answer's order."""
    guarded = _guarded(ReferenceManager(MAMBA), MAMBA)
    view = RequestView("a", tuple(range(num_tokens)))
    new = guarded.allocate_slots_per_group(view, num_tokens - external, 0, [[], []],
                                           num_external_computed_tokens=external)
    assert new[1] == [b for b in table if b] and guarded.get_block_ids_per_group("a")[1] == table


def test_a_mamba_groups_blocks_out_of_order_are_a_protocol_violation() -> None:
    guarded = _guarded(MambaBlocksSwapped(MAMBA), MAMBA)
    view = RequestView("a", tuple(range(17)))
    with pytest.raises(ProtocolViolation, match=r"get_block_ids\('a'\) returned "
                       r"\[\[1, 2, 4, 5, 6\], \[7, 0, 3\]\]: group 1's table must be "
                       r"\[0, 3, 7\]"):
        guarded.allocate_slots_per_group(view, 11, 0, [[], []], num_external_computed_tokens=6)


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
