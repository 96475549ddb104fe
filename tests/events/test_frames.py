"""vLLM's ZMQ framing of KV-event batches (docs/kv-events-wire spec, section 2): the byte
values below are the spec's, read from vLLM 0.33.0's publisher, not computed by kvcheck."""

from __future__ import annotations

import pytest

pytest.importorskip("msgspec")

from kvcheck.errors import KVCheckInputError
from kvcheck.events.frames import (
    END_SEQ,
    Frame,
    pack_frame,
    pack_seq,
    replay_request,
    unpack_frame,
    unpack_seq,
)


def test_sequence_numbers_are_eight_bytes_big_endian_unsigned() -> None:
    assert pack_seq(0) == b"\x00" * 8
    assert pack_seq(1) == b"\x00" * 7 + b"\x01"
    assert pack_seq(0x0102030405060708) == bytes([1, 2, 3, 4, 5, 6, 7, 8])
    # The replay end marker is -1 as a signed 64-bit integer: eight 0xFF bytes.
    assert pack_seq(END_SEQ) == b"\xff" * 8
    assert unpack_seq(b"\xff" * 8) == END_SEQ
    assert unpack_seq(b"\x00" * 6 + b"\x01\x00") == 256


def test_a_live_message_is_topic_seq_payload_and_round_trips() -> None:
    frame = Frame(b"", 5, b"\x93\xcb")
    parts = pack_frame(frame)
    assert parts == [b"", b"\x00" * 7 + b"\x05", b"\x93\xcb"]
    assert unpack_frame(parts) == frame
    # pyzmq hands frames over as bytes-like objects (memoryview, bytearray): read them too.
    assert unpack_frame([bytearray(b"kv"), memoryview(parts[1]), b"x"]) == Frame(b"kv", 5, b"x")


def test_a_replay_request_is_an_empty_delimiter_then_the_start_seq() -> None:
    assert replay_request(0) == [b"", b"\x00" * 8]
    assert replay_request(258) == [b"", b"\x00" * 6 + b"\x01\x02"]


@pytest.mark.parametrize("seq", [-1, 2**64])
def test_a_sequence_number_outside_u64_is_refused(seq: int) -> None:
    with pytest.raises(KVCheckInputError, match=r"must be in \[0, 2\*\*64\)"):
        pack_seq(seq)


def test_a_message_with_the_wrong_number_of_frames_names_the_count_and_the_form() -> None:
    # The shape of vLLM #45174: a replay reply that lost its topic frame.
    with pytest.raises(KVCheckInputError, match=r"replay reply: 2 frames; vLLM's publisher "
                       r"sends 3 \(topic, 8-byte sequence"):
        unpack_frame([b"\x00" * 8, b"payload"], where="replay reply")


@pytest.mark.parametrize("width", [0, 4, 9])
def test_a_sequence_frame_of_another_width_is_refused_with_its_bytes(width: int) -> None:
    data = b"\x01" * width
    with pytest.raises(KVCheckInputError, match=fr"the sequence frame is {width} bytes; vLLM "
                       r"sends 8 \(big-endian unsigned\)"):
        unpack_frame([b"", data, b"p"])
