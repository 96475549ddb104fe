"""vLLM's ZMQ framing of KV-event batches (``ZmqEventPublisher``).

Live PUB messages are three frames ``[topic, seq, payload]`` in 0.33.0 and 0.10.2 alike: the
topic as UTF-8 (default ``""``), the sequence number as 8 bytes big-endian unsigned (from 0
per publisher process, one per published batch) and the batch's msgpack
(``kvcheck.events.codec``). The replay socket (ROUTER) answers a DEALER's
``[b"", start_seq]`` with one reply per buffered batch of ``seq >= start_seq``, then an end
marker whose sequence frame is ``END_SEQ`` (the ROUTER adds the client id in front; the
DEALER does not see it). The replies differ by release (read in each release's code):

* 0.33.0: ``[b"", topic, seq, payload]``, end ``[b"", b"", END_SEQ, b""]``;
* 0.10.2: ``[b"", seq, payload]``, end ``[b"", END_SEQ, b""]``: no topic frame (the bug
  vLLM #45174 reported, fixed before 0.33).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from kvcheck.events.errors import WireFormatError

__all__ = ["END_SEQ", "SEQ_BYTES", "Frame", "is_replay_end", "pack_frame", "pack_seq",
           "replay_body", "replay_request", "unpack_frame", "unpack_seq"]

#: Width of the sequence frame, bytes.
SEQ_BYTES: Final = 8
#: The sequence number of the replay end marker (``-1`` as a signed 64-bit integer).
END_SEQ: Final = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Frame:
    """One published batch as it travels: ``topic`` bytes, ``seq`` and the msgpack
    ``payload`` (not decoded here)."""

    topic: bytes
    seq: int
    payload: bytes


def pack_seq(seq: int) -> bytes:
    """``seq`` as vLLM writes it: 8 bytes, big-endian, unsigned."""
    if not 0 <= seq <= END_SEQ:
        raise WireFormatError(f"sequence number {seq}: must be in [0, 2**64)")
    return seq.to_bytes(SEQ_BYTES, "big")


def unpack_seq(data: bytes, where: str = "frame") -> int:
    """The sequence number of an 8-byte frame (``WireFormatError`` for any other width)."""
    if len(data) != SEQ_BYTES:
        raise WireFormatError(
            f"{where}: the sequence frame is {len(data)} bytes; vLLM sends {SEQ_BYTES} "
            f"(big-endian unsigned): {data[:16].hex()}")
    return int.from_bytes(data, "big")


def pack_frame(frame: Frame) -> list[bytes]:
    """The three frames of a live PUB message."""
    return [frame.topic, pack_seq(frame.seq), frame.payload]


def unpack_frame(parts: Sequence[bytes], where: str = "message") -> Frame:
    """A live PUB message (or a replay reply without its empty delimiter) as a ``Frame``.

    Raises:
        WireFormatError: not three frames, or a sequence frame that is not 8 bytes.
    """
    if len(parts) != 3:
        raise WireFormatError(
            f"{where}: {len(parts)} frames; vLLM's publisher sends 3 (topic, 8-byte sequence, "
            "msgpack payload)")
    topic, seq, payload = (bytes(p) for p in parts)
    return Frame(topic, unpack_seq(seq, where), payload)


def replay_body(parts: Sequence[bytes]) -> list[bytes]:
    """A replay reply as the DEALER receives it, without its empty delimiter frame."""
    return list(parts[1:]) if parts and parts[0] == b"" else list(parts)


def is_replay_end(body: Sequence[bytes]) -> bool:
    """Whether ``body`` (``replay_body``) is the end marker, in either release's form."""
    end = pack_seq(END_SEQ)
    return ((len(body) == 3 and body[0] == b"" and body[1] == end)  # 0.33
            or (len(body) == 2 and body[0] == end))                  # 0.10.2


def replay_request(start_seq: int) -> list[bytes]:
    """What a DEALER sends to the replay socket to get every buffered batch from
    ``start_seq`` on."""
    return [b"", pack_seq(start_seq)]
