"""An index in another process (``kvcheck.adapters.subprocess_indexer``): a child that answers
passes through the protocol like an in-process index; one that exits, answers garbage, refuses a
batch or hangs fails that call naming what happened and its last stderr lines, and the next
``make_indexer`` starts a fresh child. The JavaScript index of tests/indexers runs the whole
area where Node.js is installed (tests/indexers/test_indexers.py)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from kvcheck.adapters.subprocess_indexer import IndexerProcessError, command_indexer
from kvcheck.conformance.call_limit import AdapterTimeout, CallLimit
from kvcheck.conformance.indexer_guard import GuardedIndexer
from kvcheck.conformance.indexer_protocol import IndexerConfig, MatchContext

CONFIG = IndexerConfig(block_size=4)

#: A child in Python: answers every op; ``MODE`` (argv[1]) says how it misbehaves.
CHILD = textwrap.dedent("""\
    import json, sys, time
    mode = sys.argv[1]
    for line in sys.stdin:
        req = json.loads(line)
        print("got", req["op"], file=sys.stderr, flush=True)
        if req["op"] == "init":
            answer = {"ok": True}
        elif req["op"] == "apply":
            if mode == "exit":
                sys.exit(3)
            if mode == "garbage":
                print("index ready!", flush=True)
                continue
            if mode == "refuse":
                answer = {"error": "blocks of 8, configured for 4"}
            else:
                answer = {"ok": True, "seen": req.get("batch", req.get("payload"))}
        elif req["op"] == "match":
            if mode == "hang":
                time.sleep(60)
            answer = {"result": {"w0": 1}}
        else:
            answer = {"ok": True}
        print(json.dumps(answer), flush=True)
    """)


@pytest.fixture
def child(tmp_path: Path) -> Path:
    path = tmp_path / "child.py"
    path.write_text(CHILD, encoding="utf-8")
    return path


def _indexer(child: Path, mode: str, *, timeout: float = 0, decoded: bool = False) -> tuple[
        GuardedIndexer, object]:
    info, make = command_indexer([sys.executable, str(child), mode], name="child",
                                 capabilities={"int_hashes"})
    assert info.capabilities == {"indexer", "int_hashes"}
    guarded = GuardedIndexer(make(CONFIG), impl="child", config=CONFIG,
                             limit=CallLimit(timeout, "child"), decoded=decoded)
    return guarded, make


def test_a_child_that_answers_is_an_index(child: Path) -> None:
    index, _ = _indexer(child, "good")
    index.deliver("w0", 0, b"\x93", {}, False)
    assert index.match([1, 2, 3, 4], MatchContext()) == {"w0": 1}
    index.remove_worker("w0")


def test_decoded_hashes_travel_as_hex(child: Path) -> None:
    """Int hashes become 8-byte hex (no 64-bit int meets JSON's 53-bit numbers)."""
    index, _ = _indexer(child, "good", decoded=True)
    batch = {"ts": 0.0, "data_parallel_rank": None, "events": [
        {"type": "BlockStored", "block_hashes": [2**64 - 1, b"\x01\x02"],
         "parent_block_hash": 5, "token_ids": [1, 2, 3, 4], "block_size": 4}]}
    index.deliver("w0", 0, b"", batch, False)  # the guard checks the batch came back intact
    assert batch["events"][0]["block_hashes"] == [2**64 - 1, b"\x01\x02"]


@pytest.mark.parametrize(("mode", "what"), [
    ("exit", "exited (status 3) on the 'apply' request"),
    ("garbage", "wrote 'index ready!\\n', not one JSON answer"),
    ("refuse", "refused apply: blocks of 8, configured for 4"),
])
def test_a_misbehaving_child_fails_the_call_and_is_replaced(child: Path, mode: str,
                                                            what: str) -> None:
    index, make = _indexer(child, mode)
    with pytest.raises(IndexerProcessError) as info:
        index.deliver("w0", 0, b"\x93", {}, False)
    message = str(info.value)
    assert what in message, message
    if mode != "refuse":
        assert "its last stderr lines:\n    got init\n    got apply" in message, message
    fresh = GuardedIndexer(make(CONFIG), impl="child", config=CONFIG,  # type: ignore[operator]
                           limit=CallLimit(0, "child"), decoded=False)
    fresh.known.add("w0")
    assert fresh.match([1, 2, 3, 4], MatchContext()) == {"w0": 1}


def test_a_hanging_child_times_out_and_the_next_index_is_a_fresh_child(child: Path) -> None:
    index, make = _indexer(child, "hang", timeout=0.5)
    index.deliver("w0", 0, b"\x93", {}, False)
    with pytest.raises(AdapterTimeout, match=r"child\.match"):
        index.match([1, 2, 3, 4], MatchContext())
    # The interrupted call's answer would still be in flight: a new child serves the next.
    fresh = make(CONFIG)  # type: ignore[operator]
    assert fresh._child is not index.raw._child and index.raw._child.proc.poll() is not None


def test_a_command_that_cannot_start_is_named() -> None:
    _, make = command_indexer(["/nonexistent/index-binary"], name="missing",
                              capabilities={"int_hashes"})
    with pytest.raises(IndexerProcessError, match=r"cannot start \['/nonexistent/index-binary'\]"):
        make(CONFIG)
