"""``observe`` (kvcheck.conformance.differential): what is compared after each op is exactly
what both sides declare: the block tables and ``num_free_blocks()`` always, each optional
observation only when the implementation *and* the oracle declare its capability (block hashes
also need the spec's algorithm in both ``hash_algos``, events need events enabled). Optional
methods that are not declared are never called."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness_fakes import ALL_CAPS, SPEC, FakeManager, handle

from kvcheck.conformance.differential import observe
from kvcheck.conformance.driver import Driver
from kvcheck.conformance.ops import add, schedule
from kvcheck.conformance.protocol import KVCacheSpec

BASE = frozenset({"manager", "prefix_caching"})
OPS = [add("a", range(1, 10)), schedule("a", 6)]  # a holds blocks 0 and 1, 6 tokens computed


class Undeclared(FakeManager):
    """Its optional observations fail the test if anything calls them."""

    def _refuse(self, *args: Any) -> Any:
        raise AssertionError("an undeclared observation was called")

    free_block_ids = ref_cnt = block_hashes = take_events = slot_mapping = _refuse


def drivers(impl_caps: frozenset[str], oracle_caps: frozenset[str], *,
            spec: KVCacheSpec = SPEC, impl_cls: type[FakeManager] = FakeManager,
            oracle_cls: type[FakeManager] = FakeManager,
            impl_algos: tuple[str, ...] = ("sha256",),
            oracle_algos: tuple[str, ...] = ("sha256",)) -> tuple[Driver, Driver]:
    impl = Driver(handle(impl_cls, name="mine", caps=impl_caps, hash_algos=impl_algos), spec)
    oracle = Driver(handle(oracle_cls, caps=oracle_caps, hash_algos=oracle_algos), spec)
    impl.run(OPS)
    oracle.run(OPS)
    return impl, oracle


BASE_OBSERVATIONS = [
    ("block tables", {"a": [0, 1]}, {"a": [0, 1]},
     "{rid: list(m.get_block_ids(rid)) for rid in ['a']}"),
    ("num_free_blocks()", 6, 6, "m.num_free_blocks()"),
]


def test_only_tables_and_free_count_without_optional_capabilities() -> None:
    impl, oracle = drivers(BASE, BASE, impl_cls=Undeclared, oracle_cls=Undeclared)
    assert observe(impl, oracle) == BASE_OBSERVATIONS


def test_every_declared_observation_with_its_repro_expression() -> None:
    spec = replace(SPEC, enable_kv_cache_events=True)
    impl, oracle = drivers(ALL_CAPS, ALL_CAPS, spec=spec)
    assert observe(impl, oracle) == [
        *BASE_OBSERVATIONS,
        ("free queue (head first)", [2, 3, 4, 5, 6, 7], [2, 3, 4, 5, 6, 7],
         "list(m.free_block_ids())"),
        ("ref counts", [1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0],
         "[m.ref_cnt(i) for i in [0, 1, 2, 3, 4, 5, 6, 7]]"),
        ("block_hashes('a')", [b"h0"], [b"h0"], "[bytes(h) for h in m.block_hashes('a')]"),
        # Tuples in events become lists; events have no repro expression (drained per op).
        ("KV events", [{"type": "BlockStored", "block_ids": [0]}],
         [{"type": "BlockStored", "block_ids": [0]}], None),
        ("slot_mapping('a', 0, 6)", [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5],
         "list(m.slot_mapping('a', 0, 6))"),
    ]


def test_a_capability_only_one_side_declares_is_not_observed() -> None:
    impl, oracle = drivers(ALL_CAPS, BASE, oracle_cls=Undeclared)
    assert observe(impl, oracle) == BASE_OBSERVATIONS
    impl, oracle = drivers(BASE, ALL_CAPS, impl_cls=Undeclared)
    assert observe(impl, oracle) == BASE_OBSERVATIONS


def test_block_hashes_need_the_algorithm_on_both_sides() -> None:
    def hash_rows(impl: Driver, oracle: Driver) -> list[str]:
        return [what for what, *_ in observe(impl, oracle) if what.startswith("block_hashes")]

    assert hash_rows(*drivers(ALL_CAPS, ALL_CAPS)) == ["block_hashes('a')"]
    assert hash_rows(*drivers(ALL_CAPS, ALL_CAPS, oracle_algos=())) == []
    assert hash_rows(*drivers(ALL_CAPS, ALL_CAPS, impl_algos=("xxhash",))) == []


def test_events_need_events_enabled_in_the_spec() -> None:
    impl, oracle = drivers(ALL_CAPS, ALL_CAPS)  # SPEC: enable_kv_cache_events=False
    assert "KV events" not in [what for what, *_ in observe(impl, oracle)]


class NullBlock(FakeManager):
    """Reserves block 0, as vLLM's design does."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.free_queue.remove(0)


def test_ref_counts_skip_the_reserved_blocks() -> None:
    impl = Driver(handle(NullBlock, name="mine", reserved=(0,)), SPEC)
    oracle = Driver(handle(NullBlock, reserved=(0,)), SPEC)
    impl.run(OPS)
    oracle.run(OPS)
    rows = {what: (mine, expression) for what, mine, _, expression in observe(impl, oracle)}
    assert rows["ref counts"] == ([1, 1, 0, 0, 0, 0, 0],
                                  "[m.ref_cnt(i) for i in [1, 2, 3, 4, 5, 6, 7]]")
