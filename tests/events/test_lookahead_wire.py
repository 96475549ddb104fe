"""``BlockStored.lookahead_token_ids`` (vLLM 0.33's hash lookahead) on the wire and in the
protocol's dicts: the bytes below are vLLM 0.33.0's own (``msgspec.msgpack.Encoder().encode(
KVEventBatch(ts=1.5, events=[BlockStored(..., lookahead_token_ids=[[104], [108]])],
data_parallel_rank=None))`` with ``vllm.distributed.kv_events``' classes), and kvcheck's
encoder (``codec.encode_batch``) and the reference pool's wire factory give the same; without
lookahead the field is left out, on the wire and in the dict."""

from __future__ import annotations

import pytest

pytest.importorskip("msgspec")

from kvcheck.events.codec import encode_batch
from kvcheck.events.errors import WireFormatError
from kvcheck.events.wire_events import wire_event_factory, wire_event_to_dict
from kvcheck.reference_impl.events import BlockStored

H1, H2 = b"\x01" * 32, b"\x02" * 32
TOKENS = tuple(range(100, 108))
LOOKAHEAD = ((104,), (108,))
#: vLLM 0.33.0's payload (bytes hashes, one full-attention group, ts 1.5, no DP rank).
VLLM_PAYLOAD = bytes.fromhex(
    "93cb3ff800000000000091de000ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
    "92c4200101010101010101010101010101010101010101010101010101010101010101c42002020202020202"
    "02020202020202020202020202020202020202020202020202b1706172656e745f626c6f636b5f68617368c0"
    "a9746f6b656e5f696473986465666768696a6baa626c6f636b5f73697a6504a76c6f72615f6964c0a66d6564"
    "69756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f"
    "6b696e64ae66756c6c5f617474656e74696f6eb36c6f6f6b61686561645f746f6b656e5f696473929168916c"
    "c0")
META = [("full_attention", None)]


def _stored(lookahead: tuple[tuple[int, ...], ...] | None) -> BlockStored:
    return BlockStored(block_hashes=(H1, H2), parent_block_hash=None, token_ids=TOKENS,
                       block_size=4, lora_id=None, group_idx=0, lookahead_token_ids=lookahead)


def test_encoder_writes_vllms_bytes() -> None:
    got = encode_batch([_stored(LOOKAHEAD)], ts=1.5, int_hashes=False,
                       group_metadata=dict(enumerate(META)))
    assert got == VLLM_PAYLOAD


def test_wire_factory_writes_vllms_bytes() -> None:
    factory = wire_event_factory("vllm-0.33", group_metadata=META)
    event = factory.BlockStored(block_hashes=(H1, H2), parent_block_hash=None, token_ids=TOKENS,
                                block_size=4, lora_id=None, medium="GPU", lora_name=None,
                                extra_keys=None, group_idx=0, lookahead_token_ids=LOOKAHEAD)
    assert factory.encode([event], 1.5) == VLLM_PAYLOAD


def test_without_lookahead_the_field_is_left_out() -> None:
    """No ``lookahead_token_ids`` key on the wire (msgspec omits a None default) nor in the
    protocol's dict, so engines without lookahead read and compare as before the field."""
    payload = encode_batch([_stored(None)], ts=1.5, int_hashes=False,
                           group_metadata=dict(enumerate(META)))
    assert b"lookahead_token_ids" not in payload
    assert "lookahead_token_ids" not in wire_event_to_dict(_stored(None))
    assert wire_event_to_dict(_stored(LOOKAHEAD))["lookahead_token_ids"] == LOOKAHEAD


def test_vllm_0_10_refuses_lookahead() -> None:
    """vLLM 0.10.2's BlockStored has no such field: encoding one is refused, naming it."""
    with pytest.raises(WireFormatError, match="lookahead_token_ids"):
        encode_batch([_stored(LOOKAHEAD)], ts=1.5, release="vllm-0.10", int_hashes=False)
    with pytest.raises(WireFormatError, match="lookahead_token_ids"):
        wire_event_factory("vllm-0.10").BlockStored(
            block_hashes=(H1,), parent_block_hash=None, token_ids=TOKENS[:4], block_size=4,
            lora_id=None, medium="GPU", lookahead_token_ids=((104,),))
