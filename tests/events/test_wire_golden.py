"""The exact bytes of each release, pinned as hex.

The spec's example (section 1 of the project's KV-event wire spec, kv-events-wire.md) and
payloads computed with vLLM's own encoder (``msgspec.msgpack.Encoder().encode`` of vLLM's
``KVEventBatch``, hashes through vLLM's ``maybe_convert_block_hash``): vLLM 0.33.0 for the map
form, vLLM 0.10.2's ``distributed/kv_events.py`` structs (read from the 0.10.2 wheel) for the
array form.
"""

from __future__ import annotations

import pytest

pytest.importorskip("msgspec")

from kvcheck.events import Release, decode_batch, encode_batch
from kvcheck.reference_impl.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
)

H1 = bytes(range(0xE0, 0x100))       # last 8 bytes >= 2**32: msgpack uint64 (0xcf)
H2 = bytes(30) + bytes([0x01, 0x2C])  # last 8 bytes = 300: msgpack uint16 (0xcd)
PARENT = bytes(range(32))

PLAIN = BlockStored((H1, H2), PARENT, (1, 2, 3, 4), 2, None, "GPU")
FULL = BlockStored((H1, H2), None, (1, 2, 3, 4), 2, 3, "GPU", lora_name="adapter-a",
                   extra_keys=(("adapter-a", ("img-0", 2)), ("adapter-a",)), group_idx=1)
REMOVED_033 = BlockRemoved((H1,), "GPU", group_idx=2)
REMOVED_010 = BlockRemoved((H1,), "GPU")
# (kind, sliding window) per group, as 0.33's take_events annotates stores.
META = (("full_attention", None), ("sliding_window", 6), ("full_attention", None))

_HEAD = "93cb3ff800000000000091"  # [1.5, [<one event>], ...]: the batch array, ts, events
_STORED_MAP = "a474797065ab426c6f636b53746f726564"  # "type": "BlockStored"
_HASHES_KEY = "ac626c6f636b5f686173686573"
_INT_HASHES = "92cff8f9fafbfcfdfeffcd012c"
_BYTES_HASHES = ("92c420e0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"
                 "c420000000000000000000000000000000000000000000000000000000000000012c")
_PARENT_KEY = "b1706172656e745f626c6f636b5f68617368"
_REST = ("a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6502a76c6f72615f6964")
_FULL_TAIL = ("03a66d656469756da3475055a96c6f72615f6e616d65a9616461707465722d61aa65787472615f"
              "6b6579739292a9616461707465722d6192a5696d672d300291a9616461707465722d61a96772"
              "6f75705f69647801b26b765f63616368655f737065635f6b696e64ae736c6964696e675f7769"
              "6e646f77bc6b765f63616368655f737065635f736c6964696e675f77696e646f770600")
_PLAIN_TAIL = "c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f6964780000"

# vLLM 0.33.0's encoder, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 and =0.
GOLDEN_033 = {
    ("plain", True): (_HEAD + "de0009" + _STORED_MAP + _HASHES_KEY + _INT_HASHES + _PARENT_KEY
                      + "cf18191a1b1c1d1e1f" + _REST + _PLAIN_TAIL),
    ("plain", False): (_HEAD + "de0009" + _STORED_MAP + _HASHES_KEY + _BYTES_HASHES
                       + _PARENT_KEY + "c420" + PARENT.hex() + _REST + _PLAIN_TAIL),
    ("full", True): (_HEAD + "de000c" + _STORED_MAP + _HASHES_KEY + _INT_HASHES + _PARENT_KEY
                     + "c0" + _REST + _FULL_TAIL),
    ("full", False): (_HEAD + "de000c" + _STORED_MAP + _HASHES_KEY + _BYTES_HASHES
                      + _PARENT_KEY + "c0" + _REST + _FULL_TAIL),
    ("removed", True): ("93cb3ff80000000000009184a474797065ac426c6f636b52656d6f766564"
                        + _HASHES_KEY + "91cff8f9fafbfcfdfeffa66d656469756da3475055a967726f"
                        "75705f6964780200"),
    ("removed", False): ("93cb3ff80000000000009184a474797065ac426c6f636b52656d6f766564"
                         + _HASHES_KEY + "91c420" + H1.hex() + "a66d656469756da3475055a96772"
                         "6f75705f6964780200"),
}
# vLLM 0.10.2's structs: tagged arrays, no optional fields.
GOLDEN_010 = {
    ("stored", True): ("93cb3ff80000000000009197ab426c6f636b53746f726564" + _INT_HASHES
                       + "cf18191a1b1c1d1e1f940102030402c0a347505500"),
    ("stored", False): ("93cb3ff80000000000009197ab426c6f636b53746f726564" + _BYTES_HASHES
                        + "c420" + PARENT.hex() + "940102030402c0a347505500"),
    ("removed", True): ("93cb3ff80000000000009193ac426c6f636b52656d6f76656491"
                        "cff8f9fafbfcfdfeffa347505500"),
    ("removed", False): ("93cb3ff80000000000009193ac426c6f636b52656d6f76656491c420" + H1.hex()
                         + "a347505500"),
}


def test_the_spec_example_all_blocks_cleared() -> None:
    """``KVEventBatch(ts=1.5, events=[AllBlocksCleared()])``: a 3-array whose None rank is
    still written (c0) despite omit_defaults."""
    payload = encode_batch([AllBlocksCleared()], ts=1.5)
    assert payload.hex() == ("93" + "cb3ff8000000000000" + "91" + "81" + "a4" + b"type".hex()
                             + "b0" + b"AllBlocksCleared".hex() + "c0")
    decoded = decode_batch(payload)
    assert decoded.ts == 1.5 and decoded.events == (AllBlocksCleared(),)
    assert decoded.data_parallel_rank is None


@pytest.mark.parametrize(("case", "int_hashes"), sorted(GOLDEN_033))
def test_033_bytes_are_vllm_033s(case: str, int_hashes: bool) -> None:
    event = {"plain": PLAIN, "full": FULL, "removed": REMOVED_033}[case]
    meta = META if case == "full" else None
    payload = encode_batch([event], ts=1.5, data_parallel_rank=0, int_hashes=int_hashes,
                           group_metadata=meta)
    assert payload.hex() == GOLDEN_033[case, int_hashes]


@pytest.mark.parametrize(("case", "int_hashes"), sorted(GOLDEN_010))
def test_010_bytes_are_vllm_0102s(case: str, int_hashes: bool) -> None:
    event = {"stored": PLAIN, "removed": REMOVED_010}[case]
    payload = encode_batch([event], ts=1.5, data_parallel_rank=0, release="vllm-0.10",
                           int_hashes=int_hashes)
    assert payload.hex() == GOLDEN_010[case, int_hashes]


def test_goldens_decode_to_the_events() -> None:
    """Bytes form: the digests come back whole; int form: their last 8 bytes."""
    full = decode_batch(bytes.fromhex(GOLDEN_033["full", False]), int_hashes=False)
    assert full.events == (FULL,) and full.data_parallel_rank == 0
    assert full.group_metadata() == {1: ("sliding_window", 6)}
    assert full.wire.events[0].kv_cache_spec_sliding_window == 6
    plain = decode_batch(bytes.fromhex(GOLDEN_033["plain", True]), int_hashes=True)
    (stored,) = plain.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == (H1[-8:], H2[-8:]) and stored.parent_block_hash == PARENT[-8:]
    old = decode_batch(bytes.fromhex(GOLDEN_010["stored", False]), release="vllm-0.10")
    assert old.events == (PLAIN,)


ALL_GOLDEN = [("vllm-0.33", *key, hex_) for key, hex_ in GOLDEN_033.items()] + [
    ("vllm-0.10", *key, hex_) for key, hex_ in GOLDEN_010.items()]


@pytest.mark.parametrize(("release", "case", "int_hashes", "hex_payload"), ALL_GOLDEN,
                         ids=[f"{r}-{c}-{'int' if i else 'bytes'}" for r, c, i, _ in ALL_GOLDEN])
def test_decode_then_encode_gives_the_same_bytes(release: Release, case: str, int_hashes: bool,
                                                 hex_payload: str) -> None:
    payload = bytes.fromhex(hex_payload)
    decoded = decode_batch(payload, release=release)
    meta = (decoded.group_metadata() or None) if release == "vllm-0.33" else None
    again = encode_batch(decoded.events, ts=decoded.ts, release=release,
                         data_parallel_rank=decoded.data_parallel_rank,
                         int_hashes=int_hashes, group_metadata=meta)
    assert again == payload, case
