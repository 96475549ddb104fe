"""Bulk reads over the wire: an ``exec:`` proxy answers ``get_block_ids_many`` and
``block_hashes_many`` (the guard's reads of every running request's tables and hashes, after
each recorded step) in one pipelined exchange, with what the per-request calls answer."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kvcheck.conformance.guard import GuardedManager, read_block_hashes, read_tables
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import KVCacheSpec, RequestView


def test_bulk_reads_take_one_exchange_and_answer_as_the_per_request_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handle = load_impl(f"exec:{sys.executable} -m kvcheck.wire.serve", call_timeout=20)
    try:
        m = handle.make_manager(KVCacheSpec(num_blocks=16, block_size=4))
        assert isinstance(m, GuardedManager)
        m.allocate_slots(RequestView("a", tuple(range(9))), 9, 0, [])
        m.allocate_slots(RequestView("b", tuple(range(100, 104))), 4, 0, [])
        rids = ["a", "b", "never-added"]
        one_by_one = ([m.get_block_ids_per_group(r) for r in rids],
                      [m.block_hashes(r) for r in rids])
        process = handle.module.__wire_session__.process
        exchanges: list[int] = []
        exchange = process._exchange

        def counting(requests: list[Any], *args: Any) -> Any:
            exchanges.append(len(requests))
            return exchange(requests, *args)

        monkeypatch.setattr(process, "_exchange", counting)
        assert (read_tables(m, rids), read_block_hashes(m, rids)) == one_by_one
        assert exchanges == [3, 3]  # one exchange of three requests each
        tables, hashes = one_by_one
        assert tables == [[[1, 2, 3]], [[4]], [[]]]
        assert [len(h) for h in hashes] == [2, 1, 0]
        assert all(type(h) is bytes for h in hashes[0] + hashes[1])
    finally:
        handle.close()
