"""The cheap protocol layer of the reference adapter behaves as the one it replaced:
request sync by snapshot, shallow event dicts, fast Request construction."""

from __future__ import annotations

import dataclasses

import pytest

from kvcheck.adapters.reference import SnapshotSync, event_to_dict
from kvcheck.conformance.protocol import RequestView
from kvcheck.errors import KVCheckInputError
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvcheck.reference_impl.request import Request


def test_snapshot_sync_follows_views() -> None:
    made: list[str] = []

    def make(view: RequestView) -> Request:
        made.append(view.request_id)
        return Request(view.request_id, view.prompt_token_ids)

    sync = SnapshotSync(make)
    prompt = (1, 2, 3)
    req = sync.sync(RequestView("a", prompt))
    assert sync.sync(RequestView("a", prompt, (4,), 3)) is req
    assert req.all_token_ids == [1, 2, 3, 4] and req.num_computed_tokens == 3
    # An equal prompt in another tuple object is the same request (equality fallback).
    assert sync.sync(RequestView("a", tuple(range(1, 4)), (4, 5))) is req
    assert req.all_token_ids == [1, 2, 3, 4, 5]
    with pytest.raises(KVCheckInputError, match="shrank"):
        sync.sync(RequestView("a", prompt, (4,)))
    # A different prompt under the same id is a new request.
    other = sync.sync(RequestView("a", (9, 9)))
    assert other is not req and made == ["a", "a"]
    assert sync.pop("a") is other and sync.get("a") is None
    assert sync.sync(RequestView("a", (9, 9))) is not other  # freed, then seen again


@pytest.mark.parametrize("event", [
    BlockStored((b"h1", b"h2"), None, tuple(range(32)), 16, None, extra_keys=(None, None)),
    BlockStored((b"h1",), None, tuple(range(16)), 16, None, extra_keys=(None,),
                lookahead_token_ids=((16, 17),)),
    BlockRemoved((b"h1",)),
    AllBlocksCleared(),
])
def test_event_to_dict_matches_asdict(event: object) -> None:
    """Every field as ``dataclasses.asdict`` has it, except ``lookahead_token_ids`` while it is
    None (hash lookahead off): left out, so events of engines that predate it compare equal."""
    expected = {"type": type(event).__name__,
                **dataclasses.asdict(event)}  # type: ignore[call-overload]
    if expected.get("lookahead_token_ids", ()) is None:
        del expected["lookahead_token_ids"]
    assert event_to_dict(event) == expected  # type: ignore[arg-type]


def test_request_construction_validates_as_before() -> None:
    import numpy as np

    req = Request("r", np.array([3, 1, 2], dtype=np.int64))
    assert req.prompt_token_ids == (3, 1, 2) and type(req.prompt_token_ids[0]) is int
    assert Request("e", ()).all_token_ids == []
    with pytest.raises(KVCacheMisuseError, match=">= 0"):
        Request("n", (1, -1))
    with pytest.raises(KVCacheMisuseError, match=">= 0"):
        req.append_output_token_ids([5, -2])
    with pytest.raises((TypeError, ValueError)):
        Request("bad", ("x",))
