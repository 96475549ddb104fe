"""A router's index over the wire (``--kv-indexer=exec:COMMAND``; docs/wire-protocol.md,
"Indexes"): what an index meets on the wire that a manager does not. A decoded batch's hashes
cross as hex strings whatever their form (an int hash as its 8 big-endian bytes, never a JSON
number beyond 53 bits) and reach the index exactly as sent, so a removal finds the block its
store made; the caller's batch is left as it was. A batch the index refuses fails that call
with the index's own error (not a failed check: the area counts it as a refusal), and the
index and its process live on.

What happens when the process exits, answers garbage or hangs is the same for every kind:
tests/wire/test_engine_failures.py. The whole ``indexer`` area runs over the wire on the
JavaScript index (tests/indexers/test_indexers.py)."""

from __future__ import annotations

import copy
import json
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcheck.conformance.indexer_guard import GuardedIndexer
from kvcheck.conformance.indexer_protocol import IndexerConfig, MatchContext
from kvcheck.conformance.loader import ImplHandle, load_indexers

INDEXERS = Path(__file__).resolve().parents[1] / "indexers"

#: Two indexes taking decoded batches (``decoded_events``), both keyed by content and
#: removing by engine hash: the radix-tree index served by ``kvcheck.wire.serve`` (found in
#: the engine's current folder, tests/indexers), and the JavaScript one.
ENGINES = [
    pytest.param(f"exec:{shlex.quote(sys.executable)} -m kvcheck.wire.serve "
                 "--kv-indexer radix_indexer", id="radix_indexer-served"),
    pytest.param(f"exec:node {shlex.quote(str(INDEXERS / 'js_index.mjs'))}", id="js_index",
                 marks=pytest.mark.skipif(shutil.which("node") is None,
                                          reason="Node.js is not installed (js_index.mjs)")),
]

#: Hashes beyond a JSON number's 53 bits, per form, and how each crosses the wire.
HASHES: dict[str, tuple[list[Any], list[str]]] = {
    "int": ([2**64 - 1, 2**63 + 5], ["ffffffffffffffff", "8000000000000005"]),
    "bytes": ([b"\xff" * 32, bytes(range(32))], ["ff" * 32, bytes(range(32)).hex()]),
}
CONTEXT = MatchContext()


@pytest.fixture(params=ENGINES)
def handle(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[
        ImplHandle]:
    monkeypatch.chdir(INDEXERS)  # the served process imports radix_indexer from here
    (loaded,) = load_indexers(request.param, call_timeout=30)
    yield loaded
    loaded.close()


def _batch(*events: dict[str, Any]) -> dict[str, Any]:
    return {"ts": 0.0, "data_parallel_rank": None, "events": list(events)}


def _stored(hashes: list[Any], tokens: list[int], block_size: int = 4) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
            "token_ids": tokens, "block_size": block_size, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": None, "group_idx": 0}


def _sent_batches(index: GuardedIndexer) -> list[dict[str, Any]]:
    """The ``batch`` parameter of every ``apply_events`` request sent, as on the wire."""
    requests = [json.loads(line[2:]) for line in index.raw.wire_transcript()
                if line.startswith("> ")]
    return [r["params"]["batch"] for r in requests if r["method"] == "apply_events"]


@pytest.mark.parametrize("form", sorted(HASHES))
def test_decoded_hashes_cross_as_hex_and_reach_the_index_as_sent(handle: ImplHandle,
                                                                 form: str) -> None:
    config = IndexerConfig(block_size=4, hash_form=form)  # type: ignore[arg-type]
    index = handle.make_indexer(config)
    hashes, on_the_wire = HASHES[form]
    stored = _batch(_stored(hashes, list(range(1, 9))))
    kept = copy.deepcopy(stored)
    index.deliver("w0", 0, b"", stored, False)  # the guard also checks the batch is intact
    assert stored == kept
    assert index.match(list(range(1, 9)), CONTEXT) == {"w0": 2}
    # The second block's hash comes back in a removal: the index finds its block by it.
    index.deliver("w0", 1, b"", _batch({"type": "BlockRemoved", "block_hashes": [hashes[1]],
                                        "medium": "GPU", "group_idx": 0}), False)
    assert index.match(list(range(1, 9)), CONTEXT) == {"w0": 1}
    sent = _sent_batches(index)
    assert [b["events"][0]["block_hashes"] for b in sent] == [on_the_wire, on_the_wire[1:]]
    assert sent[0]["events"][0]["parent_block_hash"] is None


def test_a_refused_batch_fails_that_call_and_the_index_lives_on(handle: ImplHandle) -> None:
    """Stores of blocks of 8 given to an index of 4: the index's own error (not an
    AssertionError), nothing applied, the same process serving the next calls."""
    index = handle.make_indexer(IndexerConfig(block_size=4))
    process = handle.module.__wire_session__.process
    with pytest.raises(Exception) as refused:  # noqa: PT011 - any exception is a refusal
        index.deliver("w0", 0, b"", _batch(_stored([1], list(range(1, 9)), 8)), False)
    assert not isinstance(refused.value, AssertionError), refused.value
    assert "8" in str(refused.value) and "4" in str(refused.value), refused.value
    index.known.discard("w0")  # refused: the router does not know the worker
    assert index.match(list(range(1, 9)), CONTEXT) == {}
    index.deliver("w0", 0, b"", _batch(_stored([1, 2], list(range(1, 9)))), False)
    assert index.match(list(range(1, 9)), CONTEXT) == {"w0": 2}
    assert handle.module.__wire_session__.process is process and process.alive
