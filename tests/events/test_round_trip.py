"""Round trips: decode(encode(events)) gives the events back (int-form hashes keep their last
8 bytes) and encode(decode(payload)) gives the payload back, for both releases and both hash
forms, on random events (Hypothesis) and on the reference's own workloads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("msgspec")

from kvcheck.events import Release, decode_batch, encode_batch
from kvcheck.events.workload import random_batches
from kvcheck.reference_impl.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)

digests = st.binary(min_size=32, max_size=32) | st.binary(min_size=16, max_size=16)
mediums = st.sampled_from(["GPU", "CPU", None])
extra_key = st.one_of(st.text(max_size=5), st.tuples(st.text(max_size=5), st.integers(0, 99)),
                      st.binary(max_size=4))


@st.composite
def events_033(draw: st.DrawFn) -> KVCacheEvent:
    kind = draw(st.sampled_from(["stored", "removed", "cleared"]))
    group = draw(st.integers(0, 3))
    if kind == "cleared":
        return AllBlocksCleared()
    hashes = tuple(draw(st.lists(digests, max_size=4)))
    if kind == "removed":
        return BlockRemoved(hashes, draw(mediums), group)
    extra = draw(st.none() | st.lists(st.none() | st.tuples(extra_key) | st.tuples(
        extra_key, extra_key), min_size=len(hashes), max_size=len(hashes)).map(tuple))
    return BlockStored(hashes, draw(st.none() | digests),
                       tuple(draw(st.lists(st.integers(0, 2**31), max_size=12))),
                       draw(st.integers(1, 64)), draw(st.none() | st.integers(0, 9)),
                       draw(mediums), draw(st.none() | st.text(max_size=6)), extra, group)


def _cut(event: KVCacheEvent) -> KVCacheEvent:
    """What the int form keeps of ``event``: each hash's last 8 bytes."""
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        return BlockStored(tuple(h[-8:] for h in event.block_hashes),
                           None if parent is None else parent[-8:], event.token_ids,
                           event.block_size, event.lora_id, event.medium, event.lora_name,
                           event.extra_keys, event.group_idx)
    if isinstance(event, BlockRemoved):
        return BlockRemoved(tuple(h[-8:] for h in event.block_hashes), event.medium,
                            event.group_idx)
    return event


def _as_010(event: KVCacheEvent) -> KVCacheEvent:
    """The event with only the fields 0.10.2 carries."""
    if isinstance(event, BlockStored):
        return BlockStored(event.block_hashes, event.parent_block_hash, event.token_ids,
                           event.block_size, event.lora_id, event.medium)
    if isinstance(event, BlockRemoved):
        return BlockRemoved(event.block_hashes, event.medium)
    return event


batches = st.lists(events_033(), max_size=6)
stamps = st.floats(allow_nan=False, allow_infinity=False)
ranks = st.none() | st.integers(0, 2**31)


@settings(max_examples=150, deadline=None)
@given(events=batches, ts=stamps, rank=ranks, int_hashes=st.booleans(),
       release=st.sampled_from(["vllm-0.33", "vllm-0.10"]))
def test_decode_inverts_encode(events: list[KVCacheEvent], ts: float, rank: int | None,
                               int_hashes: bool, release: Release) -> None:
    if release == "vllm-0.10":
        events = [_as_010(e) for e in events]
    payload = encode_batch(events, ts=ts, data_parallel_rank=rank, release=release,
                           int_hashes=int_hashes)
    decoded = decode_batch(payload, release=release, int_hashes=int_hashes)
    expected = [_cut(e) for e in events] if int_hashes else events
    assert (decoded.ts, list(decoded.events), decoded.data_parallel_rank) == (ts, expected,
                                                                              rank)
    again = encode_batch(decoded.events, ts=decoded.ts, release=release,
                         data_parallel_rank=decoded.data_parallel_rank, int_hashes=int_hashes)
    assert again == payload


@pytest.mark.parametrize("release", ["vllm-0.33", "vllm-0.10"])
def test_reference_workloads_round_trip(release: Release) -> None:
    """Batches of the reference manager (multi-group with sliding windows and sparse stores
    under 0.33) come back whole, spec metadata included."""
    sparse = 0
    for batch in random_batches(release, seed=1, count=300):
        meta = batch.group_metadata if release == "vllm-0.33" else None
        for int_hashes in (True, False):
            payload = encode_batch(batch.events, ts=2.5, data_parallel_rank=0,
                                   release=release, int_hashes=int_hashes, group_metadata=meta)
            decoded = decode_batch(payload, release=release)
            expected = [_cut(e) for e in batch.events] if int_hashes else list(batch.events)
            assert list(decoded.events) == expected
            if meta is not None:
                stored_groups = {e.group_idx for e in batch.events if isinstance(e, BlockStored)}
                assert decoded.group_metadata() == {g: meta[g] for g in stored_groups}
        sparse += sum(isinstance(e, BlockStored) and
                      len(e.token_ids) != len(e.block_hashes) * e.block_size
                      for e in batch.events)
    # 0.33's sliding windows with a retention interval reach stores that skip blocks.
    assert (sparse > 0) == (release == "vllm-0.33")
