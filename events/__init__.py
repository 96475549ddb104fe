"""vLLM's KV events on the wire (docs/events.md): the exact msgpack bytes of each release.

``encode_batch`` / ``decode_batch`` convert between the reference's event objects and the
payload vLLM's ``ZmqEventPublisher`` sends, for ``vllm-0.33`` (tagged maps) and ``vllm-0.10``
(tagged arrays), with hashes in the int form (vLLM's default) or the bytes form. Needs the
``events`` extra (msgspec, pyzmq: the libraries vLLM itself uses).
"""

from __future__ import annotations

try:
    import msgspec  # noqa: F401 (checked here once, so the error names the fix)
except ImportError as error:
    raise ImportError("kvcheck.events needs msgspec: pip install 'kvcheck[events]'") from error

from kvcheck.events.codec import (
    RELEASES,
    DecodedBatch,
    GroupMetadata,
    Release,
    decode_batch,
    encode_batch,
)
from kvcheck.events.errors import WireFormatError

__all__ = ["RELEASES", "DecodedBatch", "GroupMetadata", "Release", "WireFormatError",
           "decode_batch", "encode_batch"]
