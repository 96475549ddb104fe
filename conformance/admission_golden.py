"""vLLM 0.33's admission gates (capability ``admission_gates``;
docs/semantics.md#admission-gates): scenarios recorded call by call from vLLM 0.33.0's own
``KVCacheManager``, replayed by the suite (``conformance/test_admission_gates.py``, through
the protocol) and by the reference's unit tests (``tests/reference_impl/
test_admission_gates.py``, on the manager itself).

How the expected values were obtained: a throwaway script outside the repository (not
committed: it imports vLLM, which the test command does not install) built vLLM 0.33.0's
``KVCacheManager`` (``vllm.v1.core.kv_cache_manager``, CPU-only install) over a
``KVCacheConfig`` with one group per entry below (``FullAttentionSpec``,
``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``, block size 4, 1 head of 1, float32;
``hash_block_size`` and ``cache_hit_alignment_tokens`` 4), ``max_model_len`` as given (None:
``1 << 20``, what the vLLM adapter passes), ``watermark`` and ``max_in_flight_tokens`` as
given, caching on; hashed the requests with sha256 and ``PYTHONHASHSEED=0``
(``adapters/vllm_requests.make_request``), and ran each op as vLLM's scheduler does: a
request's status is WAITING when made, RUNNING once an allocation succeeded and PREEMPTED once
freed (its ``num_computed_tokens`` reset); an allocation of a request that is not running
first looks its hits up (``get_computed_blocks``) and passes them; ``decode`` appends one
output token and allocates one slot; the gates go to ``allocate_slots`` as keyword arguments.
Each answer is ``(request, hit tokens, new block ids per group or None, free blocks after)``.
The printed answers are the literals in ``RECORDED``; nothing here is computed by the
reference. ``check_invariants`` must hold after every op.

What the scenarios show (block size 4):

* ``full_sequence_does_not_fit``: a's 48 tokens need 12 blocks, 11 are free: refused with
  ``full_sequence_must_fit`` although its first chunk of 8 would fit (and does without it);
* ``full_sequence_counts_hits``: b's 16-token hit sits in the free queue; its full sequence
  (9 blocks: 5 new and the 4 hit blocks it takes out of the free queue) is refused with 8
  free and admitted with 11;
* ``window_cap_admits_long_request``: a sliding window (8) with ``max_in_flight_tokens`` 8:
  the cap ``cdiv(8 - 1 + 8, 4) + 1 = 5`` blocks admits a 64-token request into 7 free
  blocks; b is refused with 3 free; ``window_uncapped_without_in_flight``: without
  ``max_in_flight_tokens`` the cap is ``max_model_len``'s and the same request is refused;
  ``window_cap_with_model_len``: ``max_model_len`` 20 bounds the cap (``cdiv(20, 4) + 1``);
* ``hybrid_window_cap``: full attention (16 blocks for 64 tokens, no cap) beside the window
  (5): 21 blocks do not fit 20; 60 tokens (15 + 5) do;
* ``chunked_local_cap``: chunks of 8 with ``max_in_flight_tokens`` 8: cap
  ``cdiv(8 + 8, 4) = 4`` (the hit of 56 tokens is all null blocks);
* ``watermark`` (0.25 of 16 = 4 blocks): applied to a waiting request only while another is
  scheduled (``has_scheduled_reqs``, default True), with or without
  ``full_sequence_must_fit``, never to a running request's decode;
  ``watermark_preempted``: a freed (preempted) request's re-admission counts it again;
* ``reserved_blocks``: the step must fit ``free - reserved_blocks``; the full-sequence gate
  does not subtract them; ``reserved_and_watermark``: both add up for a waiting request,
  a running one pays the reservation only.
* ``window_hits_skipped_at_admission``: full attention beside a window of 8; b hits the 32
  tokens a left cached and is admitted through the gates (``full_sequence_must_fit``): the
  window's hit blocks below its last 8 tokens go back to the free queue in that same call
  (15 free after it, not 9); b's decode steps pass ``reserved_blocks`` (the gated path of a
  running request): the first frees the two window blocks it leaves behind as it takes two
  new ones (15 free, not 13); c, admitted with ``reserved_blocks`` too, hits a's blocks again
  in full attention. Recorded through kvcheck's vLLM adapter (``Pair`` over
  ``--kv-impl=vllm``'s manager, vLLM 0.33.0), the other scenarios' way otherwise;
* ``dcp_window_cap_in_spec_blocks`` (block size 2, DCP 2: the managers' blocks hold 4 tokens,
  caching off, where vLLM's no-prefix-cache coordinator takes a window under DCP): the
  window's cap is counted in the *spec's* unscaled blocks, ``cdiv(4 - 1 + 8, 2) + 1 = 7``
  (not ``cdiv(11, 4) + 1 = 4`` in the scaled ones): a's 40 tokens need 10 + 7 = 17 blocks of
  16 free (refused; 14 with the scaled cap would fit) and b's 36 tokens 9 + 7 = 16 (admitted;
  9 + 9 uncapped would not); ``dcp_chunked_local_cap_in_spec_blocks``: the same for chunks
  of 8, ``cdiv(8 + 8, 2) = 8`` blocks (not 4): 18 refused with 17 free, 17 admitted. The
  recording passed ``dcp_world_size=2`` to vLLM's ``KVCacheManager`` and built the groups'
  specs at block size 2.
"""

from __future__ import annotations

from typing import Any

from kvcheck.conformance.ops import Op, add, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec

__all__ = ["RECORDED", "SCENARIOS", "scenario_knobs", "scenario_ops", "scenario_spec", "toks"]


def toks(start: int, n: int) -> tuple[int, ...]:
    return tuple(range(start, start + n))


#: name -> (num_blocks, groups as (kind, block size, window or chunk), max_model_len,
#: watermark, max_in_flight_tokens, ops[, spec knobs]): the optional last entry holds
#: ``KVCacheSpec`` fields off their default (``dcp_world_size``, ``enable_caching``).
# Any: a scenario is a heterogeneous literal tuple (data), read by position in
# scenario_spec and scenario_ops.
SCENARIOS: dict[str, tuple[Any, ...]] = {
    "full_sequence_does_not_fit": (12, [("full", 4, None)], None, 0.0, None, [
        ("req", "a", toks(0, 48)),
        ("alloc", "a", 8, {"full_sequence_must_fit": True}),
        ("alloc", "a", 8, {}),
        ("req", "b", toks(100, 16)),
        ("alloc", "b", 8, {"full_sequence_must_fit": True}),
        ("req", "c", toks(200, 32)),
        ("alloc", "c", 4, {"full_sequence_must_fit": True}),
        ("alloc", "c", 4, {"full_sequence_must_fit": False}),
    ]),
    "full_sequence_counts_hits": (12, [("full", 4, None)], None, 0.0, None, [
        ("req", "a", toks(0, 24)),
        ("alloc", "a", 24, {"full_sequence_must_fit": True}),
        ("free", "a"),
        ("req", "x", toks(500, 12)),
        ("alloc", "x", 12, {}),
        ("req", "b", toks(0, 16) + toks(300, 20)),
        ("alloc", "b", 8, {"full_sequence_must_fit": True}),
        ("free", "x"),
        ("alloc", "b", 8, {"full_sequence_must_fit": True}),
    ]),
    "window_cap_admits_long_request": (8, [("window", 4, 8)], 1024, 0.0, 8, [
        ("req", "a", toks(0, 64)),
        ("alloc", "a", 8, {"full_sequence_must_fit": True}),
        ("alloc", "a", 8, {}),
        ("alloc", "a", 8, {}),
        ("req", "b", toks(100, 64)),
        ("alloc", "b", 8, {"full_sequence_must_fit": True}),
    ]),
    "window_uncapped_without_in_flight": (8, [("window", 4, 8)], 1024, 0.0, None, [
        ("req", "a", toks(0, 64)),
        ("alloc", "a", 8, {"full_sequence_must_fit": True}),
        ("req", "b", toks(100, 24)),
        ("alloc", "b", 8, {"full_sequence_must_fit": True}),
    ]),
    "hybrid_window_cap": (21, [("full", 4, None), ("window", 4, 8)], 1024, 0.0, 8, [
        ("req", "a", toks(0, 64)),
        ("alloc", "a", 8, {"full_sequence_must_fit": True}),
        ("req", "b", toks(100, 60)),
        ("alloc", "b", 8, {"full_sequence_must_fit": True}),
    ]),
    "chunked_local_cap": (8, [("chunked", 4, 8)], 1024, 0.0, 8, [
        ("req", "a", toks(0, 64)),
        ("alloc", "a", 8, {"full_sequence_must_fit": True}),
        ("req", "b", toks(100, 64)),
        ("alloc", "b", 8, {"full_sequence_must_fit": True}),
        ("alloc", "b", 4, {}),
    ]),
    "window_cap_with_model_len": (8, [("window", 4, 8)], 20, 0.0, 64, [
        ("req", "a", toks(0, 20)),
        ("alloc", "a", 8, {"full_sequence_must_fit": True}),
        ("req", "b", toks(100, 20)),
        ("alloc", "b", 4, {"full_sequence_must_fit": True}),
    ]),
    "watermark": (16, [("full", 4, None)], None, 0.25, None, [
        ("req", "a", toks(0, 40)),
        ("alloc", "a", 40, {"full_sequence_must_fit": True, "has_scheduled_reqs": False}),
        ("req", "b", toks(100, 8)),
        ("alloc", "b", 8, {"full_sequence_must_fit": True, "has_scheduled_reqs": True}),
        ("alloc", "b", 8, {"full_sequence_must_fit": True, "has_scheduled_reqs": False}),
        ("decode", "a", {}),
        ("req", "c", toks(200, 4)),
        ("alloc", "c", 4, {"has_scheduled_reqs": True}),
        ("alloc", "c", 4, {}),
        ("decode", "b", {"has_scheduled_reqs": True}),
        ("alloc", "c", 4, {"has_scheduled_reqs": False}),
    ]),
    "watermark_preempted": (16, [("full", 4, None)], None, 0.25, None, [
        ("req", "a", toks(0, 36)),
        ("alloc", "a", 36, {"has_scheduled_reqs": False}),
        ("req", "b", toks(100, 8)),
        ("alloc", "b", 8, {"has_scheduled_reqs": False}),
        ("decode", "b", {"has_scheduled_reqs": True}),
        ("free", "b"),
        ("alloc", "b", 1, {"full_sequence_must_fit": True}),
        ("alloc", "b", 1, {"full_sequence_must_fit": True, "has_scheduled_reqs": False}),
    ]),
    "reserved_blocks": (10, [("full", 4, None)], None, 0.0, None, [
        ("req", "a", toks(0, 16)),
        ("alloc", "a", 16, {"reserved_blocks": 6}),
        ("alloc", "a", 16, {"reserved_blocks": 5}),
        ("req", "b", toks(100, 20)),
        ("alloc", "b", 4, {"full_sequence_must_fit": True, "reserved_blocks": 4}),
        ("req", "c", toks(200, 8)),
        ("alloc", "c", 8, {"full_sequence_must_fit": True, "reserved_blocks": 3}),
        ("alloc", "c", 4, {"full_sequence_must_fit": True, "reserved_blocks": 3}),
        ("decode", "a", {"reserved_blocks": 3}),
        ("decode", "a", {"reserved_blocks": 2}),
    ]),
    "reserved_and_watermark": (20, [("full", 4, None)], None, 0.1, None, [
        ("req", "a", toks(0, 32)),
        ("alloc", "a", 32, {"has_scheduled_reqs": False}),
        ("req", "b", toks(100, 16)),
        ("alloc", "b", 16, {"reserved_blocks": 6}),
        ("alloc", "b", 16, {"reserved_blocks": 6, "has_scheduled_reqs": False}),
        ("decode", "b", {"reserved_blocks": 5}),
        ("decode", "a", {"reserved_blocks": 6}),
    ]),
    "window_hits_skipped_at_admission": (
        30, [("full", 4, None), ("window", 4, 8)], 1024, 0.0, 8, [
            ("req", "a", toks(0, 32)),
            ("alloc", "a", 32, {}),
            ("free", "a"),
            ("req", "b", toks(0, 32) + toks(300, 8)),
            ("alloc", "b", 8, {"full_sequence_must_fit": True}),
            ("decode", "b", {"reserved_blocks": 0}),
            ("decode", "b", {"reserved_blocks": 1}),
            ("req", "c", toks(0, 32) + toks(400, 4)),
            ("alloc", "c", 4, {"full_sequence_must_fit": True, "reserved_blocks": 1}),
        ]),
    "dcp_window_cap_in_spec_blocks": (17, [("full", 2, None), ("window", 2, 4)], 1024, 0.0, 8, [
        ("req", "a", toks(0, 40)),
        ("alloc", "a", 8, {"full_sequence_must_fit": True}),
        ("req", "b", toks(100, 36)),
        ("alloc", "b", 8, {"full_sequence_must_fit": True}),
        ("alloc", "b", 8, {}),
    ], {"dcp_world_size": 2, "enable_caching": False}),
    "dcp_chunked_local_cap_in_spec_blocks": (
        18, [("full", 2, None), ("chunked", 2, 8)], 1024, 0.0, 8, [
            ("req", "a", toks(0, 40)),
            ("alloc", "a", 8, {"full_sequence_must_fit": True}),
            ("req", "b", toks(100, 36)),
            ("alloc", "b", 8, {"full_sequence_must_fit": True}),
        ], {"dcp_world_size": 2, "enable_caching": False}),
}

#: What vLLM 0.33.0's KVCacheManager answered, op by op (see the module docstring).
# Any: each answer is a heterogeneous literal tuple (data), compared whole.
RECORDED: dict[str, list[tuple[Any, ...]]] = {
    "window_hits_skipped_at_admission": [
        ("a", 0, [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16]], 13),
        ("b", 32, [[17, 18], [19, 20]], 15), ("b", 0, [[21], [22]], 15),
        ("b", 0, [[], []], 15), ("c", 32, [[23], [24]], 11),
    ],
    "full_sequence_does_not_fit": [
        ("a", 0, None, 11), ("a", 0, [[1, 2]], 9), ("b", 0, [[3, 4]], 7), ("c", 0, None, 7),
        ("c", 0, [[5]], 6),
    ],
    "full_sequence_counts_hits": [
        ("a", 0, [[1, 2, 3, 4, 5, 6]], 5), ("x", 0, [[7, 8, 9]], 8), ("b", 16, None, 8),
        ("b", 16, [[10, 11]], 5),
    ],
    "window_cap_admits_long_request": [
        ("a", 0, [[1, 2]], 5), ("a", 0, [[3, 4]], 3), ("a", 0, [[5, 6]], 3), ("b", 0, None, 3),
    ],
    "window_uncapped_without_in_flight": [
        ("a", 0, None, 7), ("b", 0, [[1, 2]], 5),
    ],
    "hybrid_window_cap": [
        ("a", 0, None, 20), ("b", 0, [[1, 2], [3, 4]], 16),
    ],
    "chunked_local_cap": [
        ("a", 56, [[1, 2]], 5), ("b", 56, [[3, 4]], 3), ("b", 0, [[5]], 4),
    ],
    "window_cap_with_model_len": [
        ("a", 0, [[1, 2]], 5), ("b", 0, [[3]], 4),
    ],
    "watermark": [
        ("a", 0, [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], 5), ("b", 0, None, 5), ("b", 0, [[11, 12]], 3),
        ("a", 0, [[13]], 2), ("c", 0, None, 2), ("c", 0, None, 2), ("b", 0, [[14]], 1),
        ("c", 0, [[15]], 0),
    ],
    "watermark_preempted": [
        ("a", 0, [[1, 2, 3, 4, 5, 6, 7, 8, 9]], 6), ("b", 0, [[10, 11]], 4), ("b", 0, [[12]], 3),
        ("b", 8, None, 6), ("b", 8, [[12]], 3),
    ],
    "reserved_blocks": [
        ("a", 0, None, 9), ("a", 0, [[1, 2, 3, 4]], 5), ("b", 0, [[5]], 4), ("c", 0, None, 4),
        ("c", 0, [[6]], 3), ("a", 0, None, 3), ("a", 0, [[7]], 2),
    ],
    "reserved_and_watermark": [
        ("a", 0, [[1, 2, 3, 4, 5, 6, 7, 8]], 11), ("b", 0, None, 11),
        ("b", 0, [[9, 10, 11, 12]], 7), ("b", 0, [[13]], 6), ("a", 0, None, 6),
    ],
    "dcp_window_cap_in_spec_blocks": [
        ("a", 0, None, 16), ("b", 0, [[1, 2], [3, 4]], 12), ("b", 0, [[3, 5], [6, 7]], 9),
    ],
    "dcp_chunked_local_cap_in_spec_blocks": [
        ("a", 0, None, 17), ("b", 0, [[1, 2], [3, 4]], 13),
    ],
}


def scenario_spec(name: str, profile: str = "vllm-0.33") -> KVCacheSpec:
    """The protocol spec of scenario ``name`` (block size 4; one full-attention group: no
    ``kv_cache_groups``)."""
    num_blocks, groups, max_model_len, watermark, max_in_flight = SCENARIOS[name][:5]
    knobs = scenario_knobs(name)
    kinds = {"full": "full_attention", "window": "sliding_window",
             "chunked": "chunked_local_attention"}
    layout = () if groups == [("full", 4, None)] else tuple(
        KVCacheGroupSpec(kinds[kind], bs,
                         **({"sliding_window": size} if kind == "window" else
                            {"attention_chunk_size": size} if kind == "chunked" else {}))
        for kind, bs, size in groups)
    return KVCacheSpec(num_blocks=num_blocks, block_size=min(g[1] for g in groups),
                       profile=profile, max_model_len=max_model_len, kv_cache_groups=layout,
                       watermark=watermark, max_in_flight_tokens=max_in_flight, **knobs)


def scenario_knobs(name: str) -> dict[str, Any]:  # Any: KVCacheSpec fields of several types
    """Scenario ``name``'s ``KVCacheSpec`` fields off their default (``dcp_world_size``,
    ``enable_caching``); ``{}`` for most."""
    entry = SCENARIOS[name]
    return dict(entry[6]) if len(entry) > 6 else {}


def scenario_ops(name: str) -> list[tuple[Op, bool]]:
    """Scenario ``name``'s ops as the driver takes them, each with whether it answers (an
    ``allocate_slots``): ``alloc`` / ``decode`` become ``schedule`` ops (a running request
    whose prompt is done decodes one token), their gates passed as they are."""
    out: list[tuple[Op, bool]] = []
    for op in SCENARIOS[name][5]:
        if op[0] == "req":
            out.append((add(op[1], list(op[2])), False))
        elif op[0] == "free":
            out.append((free(op[1]), False))
        elif op[0] == "alloc":
            out.append((schedule(op[1], op[2], gates=op[3] or None), True))
        else:
            out.append((schedule(op[1], 1, gates=op[2] or None), True))
    return out
