"""The fast path of ``decode_batch`` (``kvcheck.events.strict``: msgspec-constrained twins of
each release's structs, one hash form each) accepts exactly what the general path accepts,
and gives the same events: on the reference's workloads in both forms, and on payloads broken
in each way the strict constraints stand for."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("msgspec")

import msgspec

from kvcheck.events import RELEASES, Release, WireFormatError, decode_batch, encode_batch
from kvcheck.events.codec import _decode_general, _get_form
from kvcheck.events.strict import HASH_FORMS
from kvcheck.events.workload import random_batches


def _payloads(release: Release, int_hashes: bool, count: int = 150) -> list[bytes]:
    return [encode_batch(b.events, ts=float(i), release=release, int_hashes=int_hashes,
                         group_metadata=b.group_metadata if release == "vllm-0.33" else None)
            for i, b in enumerate(random_batches(release, 3, count))]


@pytest.mark.parametrize("int_hashes", [True, False])
@pytest.mark.parametrize("release", RELEASES)
def test_fast_and_general_paths_give_the_same_batches(release: Release,
                                                      int_hashes: bool) -> None:
    form = _get_form(release)
    for payload in _payloads(release, int_hashes):
        fast = decode_batch(payload, release=release)
        general = _decode_general(payload, form, release, None)
        assert type(fast) is not form.general, "a valid payload took the general path"
        assert type(general) is form.general
        assert fast.events == general.events
        assert (fast.ts, fast.data_parallel_rank) == (general.ts, general.data_parallel_rank)
        assert msgspec.to_builtins(fast.wire) == msgspec.to_builtins(general.wire)


def test_decoded_batches_keep_the_release_envelope() -> None:
    """A ``DecodedBatch`` is decoded straight from the envelope ``[ts, events,
    data_parallel_rank]``: its fields are the release's ``KVEventBatch``'s, in order, with
    ``events`` named ``wire_events`` (the reference's objects are ``events``)."""
    from kvcheck.events import vllm_010, vllm_033
    from kvcheck.events.decoded import DecodedBatch

    for structs in (vllm_033, vllm_010):
        envelope = [(f.name, f.default) for f in msgspec.structs.fields(structs.KVEventBatch)]
        assert [("wire_events" if n == "events" else n, d) for n, d in envelope] == [
            (f.name, f.default) for f in msgspec.structs.fields(DecodedBatch)]
        assert DecodedBatch.__struct_config__.array_like
        assert structs.KVEventBatch.__struct_config__.array_like


def test_every_hash_form_has_a_strict_decoder_and_forms_can_alternate() -> None:
    """int, bytes16, bytes32 in turn on one release: each is served (the decoder that took
    the last payload is tried first, the others after it)."""
    assert HASH_FORMS == ("int", "bytes16", "bytes32")
    batch = next(iter(random_batches("vllm-0.33", 5, 40)))
    for events in (list(batch.events),) * 2:
        for int_hashes in (True, False, True):
            payload = encode_batch(events, ts=0.0, int_hashes=int_hashes,
                                   group_metadata=batch.group_metadata)
            assert decode_batch(payload).events == decode_batch(
                payload, int_hashes=int_hashes).events


def _stored(hashes: list[object], group: int = 0) -> bytes:
    from kvcheck.events import vllm_033 as v

    event = v.BlockStored(block_hashes=hashes, parent_block_hash=None,
                          token_ids=list(range(4 * len(hashes))), block_size=4, lora_id=None,
                          medium="GPU", lora_name=None, group_idx=group)
    return msgspec.msgpack.encode(v.KVEventBatch(ts=0.0, events=[event]))


@pytest.mark.parametrize(("hashes", "group", "words"), [
    ([b"\x01" * 32, 7], 0, "both the int and the bytes form"),
    ([b"\x01" * 20], 0, "20-byte hash"),
    ([b"\x01" * 32, b"\x02" * 16], 0, "16-byte"),  # widths mixed: no strict decoder takes it
    ([-3], 0, "not a u64"),
    ([b"\x01" * 32], -1, "negative"),
])
def test_what_no_strict_decoder_takes_the_general_path_names(
        hashes: list[object], group: int, words: str) -> None:
    payload = _stored(hashes, group)
    if words == "16-byte":
        # Two digest widths in one store: each is valid alone, so the general path (which
        # checks hash by hash) accepts it; the strict ones (one width per batch) do not.
        assert decode_batch(payload).events[0].block_hashes == (b"\x01" * 32, b"\x02" * 16)
        return
    with pytest.raises(WireFormatError, match=words):
        decode_batch(payload)


def test_a_required_form_is_required_on_the_fast_path_too() -> None:
    (payload,) = _payloads("vllm-0.33", True, 1)
    decode_batch(payload)  # the int decoder now serves first
    with pytest.raises(WireFormatError, match="int hash where the bytes form was required"):
        decode_batch(payload, int_hashes=False)


def test_a_copy_of_the_reference_event_classes_encodes_like_the_reference() -> None:
    """Events are recognised by class name and fields, not identity: scripts/mutate.py serves
    the reference from a copied package, whose event classes are other classes of the same
    shape; an object of another shape is still refused, naming the event."""
    import dataclasses

    from kvcheck.reference_impl import events as ref

    batch = next(iter(random_batches("vllm-0.33", 7, 40)))
    copies = {cls.__name__: dataclasses.make_dataclass(
        cls.__name__, [(f.name, Any, f.default) if f.default is not dataclasses.MISSING
                       else (f.name, Any) for f in dataclasses.fields(cls)], frozen=True)
        for cls in (ref.BlockStored, ref.BlockRemoved, ref.AllBlocksCleared)}
    copied = [copies[type(e).__name__](**{f.name: getattr(e, f.name)
                                          for f in dataclasses.fields(e)})
              for e in batch.events]
    for release in RELEASES:
        if release == "vllm-0.10" and any(getattr(e, "group_idx", 0) for e in batch.events):
            continue
        meta = batch.group_metadata if release == "vllm-0.33" else None
        assert encode_batch(copied, ts=1.0, release=release, group_metadata=meta) == (
            encode_batch(batch.events, ts=1.0, release=release, group_metadata=meta))
    odd = dataclasses.make_dataclass("BlockStored", [("block_hashes", Any)])(())
    with pytest.raises(WireFormatError, match="not a reference KV event"):
        encode_batch([odd], ts=1.0)


@pytest.mark.parametrize("release", RELEASES)
def test_strings_outside_vllms_sets_are_valid_and_read_alike(release: Release) -> None:
    """The strict decoders read ``medium`` (and 0.33's ``kv_cache_spec_kind``) as vLLM's
    known values; any other string is as valid: the general path reads it, to the same
    events and wire fields."""
    from kvcheck.events import vllm_010, vllm_033
    from kvcheck.events.codec import _FAST

    structs = vllm_033 if release == "vllm-0.33" else vllm_010
    known = msgspec.msgpack.encode(structs.KVEventBatch(ts=0.0, events=[
        structs.BlockRemoved(block_hashes=[5], medium="GPU")]))
    odd = msgspec.msgpack.encode(structs.KVEventBatch(ts=0.0, events=[
        structs.BlockRemoved(block_hashes=[5], medium="NVME")]))
    fast = decode_batch(known, release)
    assert fast == _FAST[release](known)  # the strict decoder took it
    with pytest.raises(msgspec.ValidationError):
        _FAST[release](odd)
    general = decode_batch(odd, release)
    assert type(general) is _get_form(release).general
    assert general.events[0].medium == "NVME"
    assert general.events[0].block_hashes == fast.events[0].block_hashes
    if release == "vllm-0.33":
        kinds = encode_batch(decode_batch(_stored([5])).events, ts=0.0, release=release,
                             group_metadata=[("a_kind_of_tomorrow", 8)])
        assert decode_batch(kinds, release).group_metadata() == {0: ("a_kind_of_tomorrow", 8)}
