"""The two forms a block hash takes on the wire (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).

* int form (vLLM's default, ``=1``): the **last 8 bytes** of the hash as an unsigned
  big-endian u64 (``maybe_convert_block_hash``), in msgpack's shortest unsigned form: from
  2**32 up (nearly every hash) ``uint64`` (``0xcf``), below it shorter (300: ``cd 012c``).
* bytes form (``=0``): the raw digest, 32 bytes (sha256, sha256_cbor) or 16 (xxhash,
  xxhash_cbor).

The int form keeps only 8 of the digest's bytes: decoding it gives the 8-byte big-endian
``bytes`` whose int form is that integer, so re-encoding it gives the same bytes.
"""

from __future__ import annotations

from typing import Final

from kvcheck.events.errors import WireFormatError
from kvcheck.reference_impl.hashing import to_event_int

__all__ = ["DIGEST_WIDTHS", "INT_HASH_WIDTH", "from_wire_hash", "to_wire_hash"]

#: Widths, in bytes, of the digests vLLM's hash functions produce (xxhash, sha256).
DIGEST_WIDTHS: Final = (16, 32)
#: Width of the bytes an int-form hash decodes to.
INT_HASH_WIDTH: Final = 8
_U64_LIMIT: Final = 1 << 64


def to_wire_hash(block_hash: bytes, int_hashes: bool, *, event_index: int,
                 field: str) -> int | bytes:
    """The wire form of one reference ``BlockHash``.

    Raises:
        WireFormatError: not bytes; a bytes-form hash that is not a digest width (an 8-byte
            hash decoded from the int form cannot be widened back); an int-form hash of
            fewer than 8 bytes.
    """
    if not isinstance(block_hash, bytes):
        raise WireFormatError(f"a block hash must be bytes, got {type(block_hash).__name__}",
                              event_index=event_index, field=field)
    if int_hashes:
        if len(block_hash) < INT_HASH_WIDTH:
            raise WireFormatError(
                f"a {len(block_hash)}-byte hash has no last 8 bytes to publish as a u64",
                event_index=event_index, field=field)
        return to_event_int(block_hash)
    if len(block_hash) not in DIGEST_WIDTHS:
        raise WireFormatError(
            f"a {len(block_hash)}-byte hash in the bytes form (digests are "
            f"{' or '.join(map(str, DIGEST_WIDTHS))} bytes; a hash decoded from the int form "
            "is only its last 8 bytes: encode it with int_hashes=True)",
            event_index=event_index, field=field)
    return block_hash


def from_wire_hash(value: int | bytes, int_hashes: bool | None, *, event_index: int,
                   field: str) -> bytes:
    """The reference ``bytes`` of one wire hash: the digest itself, or an int's 8 bytes.

    ``int_hashes``: True or False requires that form, None accepts either (as vLLM's decoder
    does).

    Raises:
        WireFormatError: the other form than required; an int outside ``[0, 2**64)``; bytes
            that are not a digest width.
    """
    if isinstance(value, int):
        if int_hashes is False:
            raise WireFormatError(
                "an int hash where the bytes form was required (the publisher runs with "
                "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default)",
                event_index=event_index, field=field)
        if not 0 <= value < _U64_LIMIT:
            raise WireFormatError(f"int hash {value} is not a u64 (the last 8 bytes of a hash)",
                                  event_index=event_index, field=field)
        return value.to_bytes(INT_HASH_WIDTH, "big")
    if int_hashes is True:
        raise WireFormatError(
            "a bytes hash where the int form was required (the publisher runs with "
            "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)", event_index=event_index, field=field)
    if len(value) not in DIGEST_WIDTHS:
        raise WireFormatError(
            f"a {len(value)}-byte hash (vLLM's digests are "
            f"{' or '.join(map(str, DIGEST_WIDTHS))} bytes)",
            event_index=event_index, field=field)
    return value
