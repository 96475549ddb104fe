"""The wire's tables and value conversions: docs/wire-protocol.md lists every protocol call
with exactly the parameter names kvcheck sends (read from the Protocol classes), and values
survive the trip (bytes as hex, events' hashes, specs, requests, sizing plans)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from kvcheck.conformance.indexer_protocol import IndexerConfig, MatchContext
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, RequestView
from kvcheck.conformance.sizing_protocol import (
    KVCacheTensorPlan,
    KVFeatureDefaults,
    KVModelFacts,
    KVSizingPlan,
    LayerKVSpec,
)
from kvcheck.wire.methods import METHODS
from kvcheck.wire.values import (
    WireValueError,
    batch_to_wire,
    events_from_wire,
    param_from_wire,
    result_from_wire,
    to_wire,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-protocol.md"


def _doc_tables() -> dict[str, dict[str, list[str]]]:
    """kind -> method -> parameter names, from the tables after ``<!-- wire-methods: KIND -->``."""
    tables: dict[str, dict[str, list[str]]] = {}
    kind = None
    for line in DOC.read_text().splitlines():
        marker = re.match(r"<!-- wire-methods: (\w+) -->", line)
        if marker:
            kind = marker.group(1)
            tables[kind] = {}
        elif kind and line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            method = cells[0].strip("`")
            # Parameter names are the backticked words outside parentheses (notes).
            params = re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", cells[1]))
            tables[kind][method] = params
        elif kind and not line.strip() and tables[kind]:
            kind = None
    return tables


def test_the_doc_lists_every_call_with_its_parameter_names() -> None:
    tables = _doc_tables()
    assert set(tables) == set(METHODS)
    for kind, methods in METHODS.items():
        assert {name: list(m.params) for name, m in methods.items()} == tables[kind], kind


def test_parameters_are_sent_by_name_with_defaults_filled_in() -> None:
    allocate = METHODS["manager"]["allocate_slots"]
    request = RequestView("r", (1, 2))
    assert allocate.bind((request, 4), {}) == {
        "request": request, "num_new_tokens": 4, "num_new_computed_tokens": 0,
        "new_computed_block_ids": (), "num_lookahead_tokens": 0}
    with pytest.raises(TypeError, match="missing argument 'num_new_tokens'"):
        allocate.bind((request,), {})
    with pytest.raises(TypeError, match="unexpected or repeated argument"):
        allocate.bind((request, 4), {"num_new_tokens": 5})


def test_a_request_and_a_spec_survive_the_trip() -> None:
    request = RequestView("r", (1, 2, 3), (4,), 2, lora=("a", 1, "/p"),
                          mm_features=(("img", 0, 2),), cache_salt="s",
                          skip_reading_prefix_cache=True)
    sent = msgspec.json.decode(msgspec.json.encode(request))
    assert param_from_wire("RequestView", sent) == request
    spec = KVCacheSpec(num_blocks=9, block_size=2, kv_cache_groups=(
        KVCacheGroupSpec("full_attention"), KVCacheGroupSpec("sliding_window", sliding_window=4)),
        prefix_cache_retention_interval=0)
    assert param_from_wire("KVCacheSpec", to_wire(spec)) == spec
    assert "kv_cache_groups" not in to_wire(KVCacheSpec(num_blocks=4, block_size=2))
    context = MatchContext(lora=("a", 1, "/p"), cache_salt=None, mm_features=(("x", 0, 4),))
    assert param_from_wire("MatchContext", msgspec.json.decode(
        msgspec.json.encode(context))) == context
    config = IndexerConfig(block_size=4, hash_form="bytes")
    assert param_from_wire("IndexerConfig", to_wire(config)) == config


def test_bytes_are_hex_both_ways() -> None:
    assert to_wire(b"\x01\xab") == "01ab"
    assert param_from_wire("bytes", "01ab") == b"\x01\xab"
    assert result_from_wire("block_hashes", "list[bytes]", ["00ff", "10"]) == \
        [b"\x00\xff", b"\x10"]
    assert result_from_wire("take_event_batch", "bytes", "") == b""
    with pytest.raises(WireValueError, match="take_event_batch answer: not a hex string"):
        result_from_wire("take_event_batch", "bytes", "xyz")
    with pytest.raises(WireValueError, match="block_hashes answer item 1: expected a hex"):
        result_from_wire("block_hashes", "list[bytes]", ["00", 5])


def test_event_hashes_cross_as_hex_and_keep_their_form() -> None:
    int_hash = (1 << 64) - 2  # beyond a JSON number's 53 bits: must go as hex
    batch = {"ts": 1.5, "data_parallel_rank": None, "events": [
        {"type": "BlockStored", "block_hashes": [int_hash, 7], "parent_block_hash": 3,
         "token_ids": [1, 2], "block_size": 2}]}
    sent = batch_to_wire(batch)
    assert sent["events"][0]["block_hashes"] == ["fffffffffffffffe", "0000000000000007"]
    assert sent["events"][0]["parent_block_hash"] == "0000000000000003"
    assert batch["events"][0]["block_hashes"] == [int_hash, 7]  # the original is untouched
    back = events_from_wire(sent["events"], "apply_events", int_hashes=True)
    assert back == batch["events"]
    as_bytes = events_from_wire([{"type": "BlockRemoved", "block_hashes": ["ab", 12]}], "x")
    assert as_bytes == [{"type": "BlockRemoved", "block_hashes": [b"\xab", 12]}]


def test_a_sizing_plan_and_tuples_come_back_typed() -> None:
    plan = KVSizingPlan(groups=(("l0", "l1"),), page_size=64, group_size=2, num_blocks=10,
                        tensors=(KVCacheTensorPlan(size=640, shared_by=("l0",)),))
    assert result_from_wire("kv_sizing_plan", "KVSizingPlan",
                            msgspec.json.decode(msgspec.json.encode(to_wire(plan)))) == plan
    assert result_from_wire("kv_block_sizes", "tuple[int, int]", [16, 16]) == (16, 16)
    layer = LayerKVSpec(kind="full_attention", block_size=16, num_kv_heads=2, head_size=8,
                        dtype="float16")
    assert param_from_wire("LayerKVSpec", msgspec.json.decode(
        msgspec.json.encode(to_wire(layer)))) == layer


def test_model_facts_and_feature_defaults_come_back_typed() -> None:
    """``kv_feature_defaults``: the model facts sent as an object of their fields, the answer
    rebuilt as a ``KVFeatureDefaults`` (reasons a tuple)."""
    model = KVModelFacts(runner="pooling", is_causal=False, enable_prefix_caching=True,
                         seq_pooling_type="MEAN")
    assert param_from_wire("KVModelFacts", msgspec.json.decode(
        msgspec.json.encode(to_wire(model)))) == model
    answer = KVFeatureDefaults(False, True, ("attention_free", "user"))
    assert result_from_wire("kv_feature_defaults", "KVFeatureDefaults", msgspec.json.decode(
        msgspec.json.encode(to_wire(answer)))) == answer
    with pytest.raises(WireValueError, match="kv_feature_defaults answer"):
        result_from_wire("kv_feature_defaults", "KVFeatureDefaults", [True, True, []])
