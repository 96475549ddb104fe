"""Bad input: every malformed payload is one ``WireFormatError`` naming the problem, the
event index and the field (never a bare msgspec error), and events a release cannot carry
are refused on encode rather than dropped."""

from __future__ import annotations

import pytest

msgspec = pytest.importorskip("msgspec")

from kvcheck.errors import KVCheckInputError  # noqa: E402 (after the skip)
from kvcheck.events import WireFormatError, decode_batch, encode_batch  # noqa: E402
from kvcheck.reference_impl.events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
)

H = bytes(range(32))
STORED = BlockStored((H,), None, (1, 2), 2, None)
_pack = msgspec.msgpack.encode


def _stored_map(**change: object) -> dict[str, object]:
    event: dict[str, object] = {
        "type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
        "token_ids": [1, 2], "block_size": 2, "lora_id": None, "medium": "GPU",
        "lora_name": None, "group_idx": 0}
    event.update(change)
    return event


def _raises(payload: object, match: str, release: str = "vllm-0.33",
            **kwargs: object) -> WireFormatError:
    with pytest.raises(WireFormatError, match=match) as info:
        decode_batch(payload, release=release, **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, KVCheckInputError)  # the family callers catch
    assert not isinstance(info.value.__cause__, msgspec.MsgspecError)
    return info.value


def test_wrong_type_of_payload() -> None:
    _raises("93cb", r"a payload is bytes .* got str")
    _raises([1.5, [], None], r"got list")


def test_truncated_and_trailing_msgpack() -> None:
    good = encode_batch([STORED], ts=1.0)
    _raises(good[:-3], r"vllm-0.33 payload is not one msgpack value: .*truncated")
    _raises(good + b"\xc0", r"not one msgpack value: .*trailing characters")
    _raises(b"\xc1", r"not one msgpack value")  # 0xc1 is never used in msgpack


def test_not_a_batch_array() -> None:
    error = _raises(_pack({"ts": 1.0}), r"batch must be the array \[ts, events, "
                                        r"data_parallel_rank\]: Expected `array`, got `object`")
    assert error.event_index is None and error.field is None
    _raises(_pack([1.0]), r"array` of at least length 2, got 1")
    error = _raises(_pack(["now", [], None]), r"batch: Expected `float`, got `str`")
    assert error.field == "ts"
    assert _raises(_pack([1.0, [], "r"]), r"`int \| null`, got `str`").field \
        == "data_parallel_rank"


def test_unknown_event_tag_in_both_forms() -> None:
    error = _raises(_pack([1.0, [{"type": "AllBlocksCleared"}, {"type": "BlockEvicted"}],
                           None]), r"event 1, field 'type': unknown event tag: Invalid "
                                   r"value 'BlockEvicted' .*BlockStored, BlockRemoved")
    assert (error.event_index, error.field) == (1, "type")
    assert _raises(_pack([1.0, [["BlockEvicted"]], None]), r"unknown event tag",
                   release="vllm-0.10").field == "type"
    _raises(_pack([1.0, [{"block_hashes": [1]}], None]), r"missing required field `type`.*"
                                                       r"the vllm-0.33 tags are")


def test_wrong_field_types_name_the_field() -> None:
    error = _raises(_pack([1.0, [_stored_map(block_size="2")], None]),
                    r"event 0, field 'block_size': Expected `int`, got `str`")
    assert (error.event_index, error.field) == (0, "block_size")
    assert _raises(_pack([1.0, [_stored_map(block_hashes=["ab"])], None]),
                   r"`int \| bytes`, got `str`").field == "block_hashes[0]"
    assert _raises(_pack([1.0, [_stored_map(group_idx="0")], None]), "got `str`").field \
        == "group_idx"
    _raises(_pack([1.0, [{k: v for k, v in _stored_map().items() if k != "lora_name"}], None]),
            r"missing required field `lora_name`")
    # The array form names a position by the field the event's tag puts there.
    old = [1.0, [["BlockRemoved", [1], None], ["BlockStored", [1], None, [1], "2", None,
                                                 "GPU"]], None]
    error = _raises(_pack(old), r"event 1, field 'block_size'", release="vllm-0.10")
    assert error.field == "block_size"
    _raises(_pack([1.0, [["BlockStored", [1], None, [1], 2, None]], None]),
            r"event 0: Expected `array` of at least length 7, got 6", release="vllm-0.10")


def test_array_form_given_to_the_map_release_and_back() -> None:
    """The SGLang #38561 / Dynamo #10681 bug: 0.10.2's tagged arrays read as 0.33's maps."""
    old = encode_batch([AllBlocksCleared(), STORED], ts=1.0, release="vllm-0.10")
    error = _raises(old, r"event 0: Expected `object`, got `array`: a tagged array, vLLM "
                         r"0.10.2's event form; .*decode it with release='vllm-0.10'")
    assert error.event_index == 0
    new = encode_batch([STORED], ts=1.0)
    _raises(new, r"a tagged map, vLLM 0.33's event form; .*release='vllm-0.33'",
            release="vllm-0.10")


@pytest.mark.parametrize(("value", "match"), [
    (b"\x01" * 8, r"a 8-byte hash \(vLLM's digests are 16 or 32 bytes\)"),
    (b"\x01" * 33, r"a 33-byte hash"),
    (-1, r"int hash -1 is not a u64"),
])
def test_a_hash_of_the_wrong_width(value: object, match: str) -> None:
    good = H if isinstance(value, bytes) else 7  # a valid hash of the same form first
    error = _raises(_pack([1.0, [_stored_map(block_hashes=[good, value])], None]), match)
    assert (error.event_index, error.field) == (0, "block_hashes[1]")
    error = _raises(_pack([1.0, [_stored_map(block_hashes=[good], parent_block_hash=value)],
                           None]), match)
    assert error.field == "parent_block_hash"


def test_hash_forms_required_and_never_mixed() -> None:
    ints = encode_batch([STORED], ts=1.0, int_hashes=True)
    raw = encode_batch([STORED], ts=1.0, int_hashes=False)
    _raises(ints, r"an int hash where the bytes form was required", int_hashes=False)
    _raises(raw, r"a bytes hash where the int form was required", int_hashes=True)
    mixed = _pack([1.0, [_stored_map(block_hashes=[H]), {"type": "BlockRemoved",
                                                        "block_hashes": [5], "medium": None}],
                   None])
    error = _raises(mixed, r"both the int and the bytes form in one batch")
    assert (error.event_index, error.field) == (1, "block_hashes[0]")


def test_negative_group_and_unknown_release() -> None:
    _raises(_pack([1.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": None,
                          "group_idx": -1}], None]), r"event 0, field 'group_idx': group_idx "
                                                     r"-1 is negative")
    _raises(b"\x90", r"unknown release 'vllm-0.20': one of \['vllm-0.33', 'vllm-0.10'\]",
            release="vllm-0.20")


def test_encode_refuses_what_the_release_cannot_carry() -> None:
    with pytest.raises(WireFormatError, match=r"event 0, field 'group_idx': vLLM 0.10.2's "
                                              r"events have no group_idx"):
        encode_batch([BlockRemoved((H,), group_idx=1)], ts=1.0, release="vllm-0.10")
    with pytest.raises(WireFormatError, match=r"event 1, field 'lora_name': .*no lora_name"):
        encode_batch([STORED, BlockStored((H,), None, (1, 2), 2, 1, lora_name="a")], ts=1.0,
                     release="vllm-0.10")
    with pytest.raises(WireFormatError, match=r"carry no KV-cache spec metadata"):
        encode_batch([STORED], ts=1.0, release="vllm-0.10",
                     group_metadata=[("full_attention", None)])
    with pytest.raises(WireFormatError, match=r"group_metadata has no entry for group 0"):
        encode_batch([STORED], ts=1.0, group_metadata={1: ("full_attention", None)})
    with pytest.raises(WireFormatError, match=r"event 0: not a reference KV event: 'x'"):
        encode_batch(["x"], ts=1.0)  # type: ignore[list-item]
    with pytest.raises(WireFormatError, match=r"field 'block_hashes\[0\]': a block hash "
                                              r"must be bytes, got int"):
        encode_batch([BlockRemoved((5,))], ts=1.0)  # type: ignore[arg-type]


def test_an_int_form_hash_cannot_be_widened_to_the_bytes_form() -> None:
    """Decoding the int form keeps 8 bytes; encoding those as raw bytes would invent a
    digest, so it is refused (the int form re-encodes them exactly)."""
    (event,) = decode_batch(encode_batch([STORED], ts=1.0)).events
    assert encode_batch([event], ts=1.0) == encode_batch([STORED], ts=1.0)
    with pytest.raises(WireFormatError, match=r"a 8-byte hash in the bytes form .*encode it "
                                              r"with int_hashes=True"):
        encode_batch([event], ts=1.0, int_hashes=False)
    with pytest.raises(WireFormatError, match=r"a 4-byte hash has no last 8 bytes"):
        encode_batch([BlockRemoved((b"abcd",))], ts=1.0)
