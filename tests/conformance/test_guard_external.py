"""The guard and external-KV answers (capability ``external_kv``): an adapter that answers
what vLLM 0.33 itself returns (the blocks after the external ones) instead of every block the
call added is a protocol violation naming the call and the rule; a correct answer passes, and
so does a Mamba group's table with nulls between its external state block and its running one
(vLLM 0.33's own), but not one with its blocks out of order, nor a hit ending inside a Mamba
block whose copy-on-write block replaces the hit in place (outside the answer), while a copy
that is never drained or lands on a hit block is one. Traces carry the external-KV ops and
refuse malformed ones."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest

from kvcheck.adapters.reference import IMPL_INFO, ReferenceManager
from kvcheck.conformance.call_limit import CallLimit
from kvcheck.conformance.driver import Driver
from kvcheck.conformance.guard import GuardedManager, ProtocolViolation
from kvcheck.conformance.hybrid_edge_golden import HYBRID_EDGE_SCENARIOS
from kvcheck.conformance.laws import check_laws
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.ops import Op, add, cache, evict, free, schedule
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


#: Full attention at 4 beside Mamba prefill checkpoints at 8 (alignment 4): request d's
#: 12-token hit ends inside its Mamba block, and 2 external tokens load asynchronously.
_IN_PLACE = next(sc for sc in HYBRID_EDGE_SCENARIOS
                 if sc.name == "checkpoint_partial_hit_with_an_async_load")


def _driver(cls: type[ReferenceManager]) -> Driver:
    handle = ImplHandle("fake", "fake_cow", ModuleType("fake_cow"), IMPL_INFO, cls, None,
                        call_timeout=None)
    return Driver(handle, _IN_PLACE.spec())


def _run(driver: Driver, ops: Sequence[Op]) -> None:
    for op in ops:
        driver.apply(op)


class CopyNeverDrained(ReferenceManager):
    """Leaves the copy into d's copy-on-write block (source 5) out of the drained pairs."""

    def take_kv_cache_block_copies(self) -> list[tuple[int, int]]:
        return [(src, dst) for src, dst in super().take_kv_cache_block_copies()
                if (src, dst) != (5, 12)]


class CopyOntoAHeldBlock(ReferenceManager):
    """Shows d's copy-on-write block replaced by the Mamba block request c still holds."""

    def get_block_ids(self, request_id: str) -> Any:
        full, mamba = super().get_block_ids(request_id)
        if request_id == "d" and len(mamba) == 2 and mamba[1] != 5:
            mamba = [0, super().get_block_ids("c")[1][-1]]
        return [full, mamba]


def test_a_copy_on_write_in_place_under_external_tokens_passes_and_is_followed() -> None:
    """vLLM 0.33.0's answer (the scenario's recording): d's hit block 5 is replaced in its
    Mamba table by block 12, which allocate_slots does not return (with external tokens it
    answers only the blocks after the hits); the guard follows the table, owes the copy
    (5, 12), and every law holds after each op. Before, the guard refused vLLM's own table."""
    driver = _driver(ReferenceManager)
    for i, (op, want) in enumerate(zip(_IN_PLACE.ops, _IN_PLACE.recorded.answers,
                                       strict=True)):
        assert driver.apply(op) == want, (i, op)
        assert not check_laws(driver), (i, op)
    assert tuple(driver.drained) == _IN_PLACE.recorded.copies == ((5, 8), (5, 12))


def test_a_copy_in_place_never_drained_is_a_protocol_violation() -> None:
    driver = _driver(CopyNeverDrained)
    with pytest.raises(ProtocolViolation, match=r"allocate_slots\('d'\) replaced its hit block "
                       r"5 at index 1 of group 1 by the new block 12"):
        _run(driver, _IN_PLACE.ops)


def test_a_copy_in_place_onto_another_requests_block_is_a_protocol_violation() -> None:
    """c stays alive through d's admission (its free moved to the end)."""
    ops = [op for op in _IN_PLACE.ops if op != free("c")] + [free("c")]
    driver = _driver(CopyOntoAHeldBlock)
    with pytest.raises(ProtocolViolation, match=r"block \d+ is handed out anew but request\(s\) "
                       r"\['c'\] still hold it"):
        _run(driver, ops)


def test_traces_accept_external_kv_ops_and_refuse_bad_fields() -> None:
    """Traces (``kvcheck replay``) carry the external-KV ops; bad fields are trace errors."""
    ops = [add("a", list(range(12))), schedule("a", external=8, delay=True), cache("a", 8),
           evict([1, 2]), free("a", preempt=True)]
    assert check_ops(ops, "t.json") == ops
    bad: list[tuple[dict[str, Any], str]] = [
        ({"op": "schedule", "rid": "a", "num_tokens": None, "external": -1},
         r"external=-1: must be an int"),
        ({"op": "schedule", "rid": "a", "num_tokens": None, "delay": 1},
         r"field 'delay'=1: must be true or false"),
        ({"op": "cache", "rid": "a", "num_tokens": "8"}, r"num_tokens='8': must be an int"),
        ({"op": "evict", "block_ids": [1, -2]}, r"field 'block_ids'=\[1, -2\]: must be a list"),
        ({"op": "evict", "block_ids": [1], "rid": "a"}, r"'evict' op has unknown fields \['rid'\]"),
        ({"op": "free", "rid": "a", "preempt": "yes"},
         r"field 'preempt'='yes': must be true or false"),
    ]
    for op, words in bad:
        with pytest.raises(TraceError, match=words):
            check_ops([add("a", [1, 2, 3]), op], "t.json")
