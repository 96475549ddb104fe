"""Bug (the wire form): 0.33's events sent as tagged arrays, 0.10.2's form.

vLLM changed its event structs from arrays to maps (``array_like`` off); consumers still on
the array form decoded nothing and cache-aware routing silently switched off (SGLang #37271 /
#38561 / #40684, Dynamo #10681). Here the producer is the one left behind: under the 0.33
profile its payloads do not decode as 0.33's, and the stream check names the payload.
"""

from __future__ import annotations

from _wire_mutant_base import build_wire, encode_as_reference


def arrays(adapter, events, ts):  # type: ignore[no-untyped-def]
    return encode_as_reference(adapter, events, ts, release="vllm-0.10",
                               group_metadata=None)  # BUG: 0.10.2's tagged arrays


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_wire("mut_wire_tagged_arrays", arrays)
