"""vLLM 0.33's worker-side block zeroing (capability ``block_zeroing``;
docs/semantics.md#worker-side-block-zeroing): scenarios recorded from vLLM 0.33.0's own
``KVCacheManager``, replayed by the suite (``conformance/test_block_zeroing.py``, through the
protocol and the driver).

How the expected values were obtained: a throwaway script outside the repository (not
committed: it imports vLLM, which the test command does not install) ran each scenario's ops
below through kvcheck's driver on ``kvcheck.adapters.vllm`` under vLLM 0.33.0 (CPU-only
install): vLLM's ``KVCacheManager`` over the ``KVCacheConfig`` of
``adapters/vllm_kv_config.make_vllm_cache`` (one group per entry, block sizes as given, 1 head
of 1, float32; Mamba ``shapes=((2, 3),)``, "align"), with ``needs_kv_cache_zeroing`` True,
sha256 hashes and ``PYTHONHASHSEED=0``. The driver makes the calls vLLM's scheduler makes:
a waiting request's lookup then ``allocate_slots`` (``num_external_computed_tokens``,
``delay_cache_blocks`` and ``skip_zeroing_group_ids`` as the op gives them), a decode's one
output token, ``new_step_starts`` in a Mamba layout, ``cache_blocks`` when a load ends and,
when it failed past a block-aligned valid prefix, ``record_blocks_for_zeroing(rid, valid)``;
after every ``allocate_slots`` it drains ``take_new_block_ids()``, as the scheduler drains
it every step. Each answer is ``(new block ids, one list per group or None, drained ids)``;
the printed answers are the literals in ``RECORDED``, nothing here is computed by the
reference. ``external_async_skip_one_group`` and ``failed_load_recorded`` were also replayed
call by call on vLLM's ``KVCacheManager`` directly (``get_computed_blocks``,
``allocate_slots(..., skip_zeroing_group_ids=(0,))``, ``cache_blocks``,
``record_blocks_for_zeroing``, ``take_new_block_ids``), without the adapter: the same drains.

What the scenarios show (block size 4 unless said):

* ``single_group``: every block a's chunks and decodes take is drained once, right after
  the allocation that took it; b's 8-token hit is never drained, its new block is;
* ``freed_and_handed_out_again``: a's blocks, freed and cached, are evicted and handed out
  to c: drained again (once per time a block is handed out); d's refused allocation
  drains nothing;
* ``window_and_full`` (full attention beside a sliding window of 8): both groups' new blocks,
  group 0's first; the window's blocks turned null are not drained again, b's hits neither;
* ``mamba_and_full`` (full attention 4 beside a Mamba "align" group of 8): the Mamba group's
  blocks are never drained (vLLM records ``AttentionSpec`` groups only);
* ``cow_full_attention`` (full attention 8 beside Mamba 12: fine-grained hits on a hash
  block of 4): b's 20-token hit ends inside a full-attention block, whose private
  copy-on-write block (first of the new ids) is drained with b's new block; the Mamba
  group's copy is not;
* ``external_sync``: a synchronous external load's blocks are drained with the new ones;
* ``external_async_skip``: an asynchronous load into the only group, named in
  ``skip_zeroing_group_ids``: its blocks are not drained; once it arrived, the blocks of the
  rest of the prompt are;
* ``external_async_skip_one_group``: only group 0 named: the window's external blocks are
  drained, full attention's are not;
* ``external_async_unskipped``: the same load with no group named: every external block is
  drained;
* ``failed_load_recorded``: the load of 16 tokens fails past 8: the blocks from token 8 on
  are recorded again (``record_blocks_for_zeroing``) and drained with the next allocation;
* ``truncated_hit_with_load`` (full attention 4 beside Mamba 8: fine-grained hits): b's
  local hit of 12 tokens ends inside a Mamba block and a connector loads 8 tokens past 8, so
  the scheduler trims the hit at 8 (``truncate_computed_blocks``: ``[[1, 2], [0]]``, the
  Mamba state comes with the load) and skips group 0's zeroing: nothing is drained (the Mamba
  group never records); once loaded, the rest of the prompt's blocks are;
* ``cross_attention`` (caching off, full attention beside cross attention): the encoder
  input's cross-attention blocks are drained at the request's admission.
"""

from __future__ import annotations

from typing import Any

from kvcheck.conformance.ops import Op, add, cache, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec

__all__ = ["RECORDED", "SCENARIOS", "scenario_ops", "scenario_spec", "toks"]


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


_FULL4 = KVCacheGroupSpec("full_attention", 4)
_FULL8 = KVCacheGroupSpec("full_attention", 8)
_WINDOW8 = KVCacheGroupSpec("sliding_window", 4, sliding_window=8)
_MAMBA8 = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")
_MAMBA12 = KVCacheGroupSpec("mamba", 12, mamba_cache_mode="align")
_CROSS4 = KVCacheGroupSpec("cross_attention", 4)


def _skip(*groups: int) -> dict[str, bool | int | list[int]]:
    return {"skip_zeroing_group_ids": list(groups)}


#: name -> (num_blocks, groups (() : one full-attention group, the single-group protocol),
#: enable_caching, ops).
# Any: a scenario is a heterogeneous literal tuple (data), read by position.
SCENARIOS: dict[str, tuple[Any, ...]] = {
    "single_group": (16, (), True, [
        add("a", toks(0, 10)), schedule("a", 6), schedule("a"), decode("a"), decode("a"),
        decode("a"), free("a"),
        add("b", toks(0, 8) + toks(50, 6)), schedule("b"), decode("b"),
    ]),
    "freed_and_handed_out_again": (6, (), True, [
        add("a", toks(0, 8)), schedule("a"), free("a"),
        add("c", toks(100, 19)), schedule("c"), add("d", toks(500, 8)), schedule("d"),
    ]),
    "window_and_full": (24, (_FULL4, _WINDOW8), True, [
        add("a", toks(0, 24)), schedule("a", 8), schedule("a", 8), schedule("a"), decode("a"),
        add("b", toks(0, 16) + toks(70, 5)), schedule("b"),
    ]),
    "mamba_and_full": (24, (_FULL4, _MAMBA8), True, [
        add("a", toks(0, 20)), schedule("a", 8), schedule("a", 8), schedule("a"), decode("a"),
        add("b", toks(0, 16) + toks(70, 5)), schedule("b"),
    ]),
    "cow_full_attention": (32, (_FULL8, _MAMBA12), True, [
        add("a", toks(0, 22)), schedule("a", 20), schedule("a"), decode("a"),
        add("b", [*toks(0, 22), 1, 2, 3]), schedule("b"),
    ]),
    "external_sync": (24, (_FULL4, _WINDOW8), True, [
        add("c", toks(0, 20)), schedule("c", external=12),
        decode("c"),
    ]),
    "external_async_skip": (16, (), True, [
        add("c", toks(0, 20)), schedule("c", external=12, delay=True, gates=_skip(0)),
        cache("c", 12), schedule("c"),
    ]),
    "external_async_skip_one_group": (24, (_FULL4, _WINDOW8), True, [
        add("c", toks(0, 20)), schedule("c", external=16, delay=True, gates=_skip(0)),
        cache("c", 16), schedule("c"),
    ]),
    "external_async_unskipped": (24, (_FULL4, _WINDOW8), True, [
        add("c", toks(0, 20)), schedule("c", external=16, delay=True),
        cache("c", 16), schedule("c"),
    ]),
    "failed_load_recorded": (16, (), True, [
        add("a", toks(0, 8)), schedule("a"),
        add("c", toks(0, 8) + toks(400, 16)),
        schedule("c", external=12, delay=True, gates=_skip(0)),
        cache("c", 12), schedule("c"),
    ]),
    "truncated_hit_with_load": (24, (_FULL4, _MAMBA8), True, [
        add("a", toks(100, 14)), schedule("a", 12), schedule("a"), decode("a"),
        add("b", toks(100, 14) + toks(900, 10)),
        schedule("b", external=8, delay=True, gates=_skip(0), truncate=8),
        cache("b", 16), schedule("b"),
    ]),
    "cross_attention": (16, (_FULL4, _CROSS4), False, [
        add("a", toks(0, 6), encoder=10), schedule("a"), decode("a"), decode("a"),
    ]),
}

#: What vLLM 0.33.0's KVCacheManager answered, allocation by allocation: (new block ids, one
#: list per group or None, the ids ``take_new_block_ids`` drained right after).
# Any: each answer is a heterogeneous literal tuple (data), compared whole.
RECORDED: dict[str, list[tuple[Any, ...]]] = {
    'single_group': [
        ([[1, 2]], [1, 2]),
        ([[3]], [3]),
        ([[]], []),
        ([[]], []),
        ([[4]], [4]),
        ([[4, 5]], [4, 5]),
        ([[]], []),
    ],
    'freed_and_handed_out_again': [
        ([[1, 2]], [1, 2]),
        ([[3, 4, 5, 2, 1]], [3, 4, 5, 2, 1]),
        (None, []),
    ],
    'window_and_full': [
        ([[1, 2], [3, 4]], [1, 2, 3, 4]),
        ([[5, 6], [7, 8]], [5, 6, 7, 8]),
        ([[9, 10], [11, 12]], [9, 10, 11, 12]),
        ([[13], [14]], [13, 14]),
        ([[15, 16], [17, 18]], [15, 16, 17, 18]),
    ],
    'mamba_and_full': [
        ([[1, 2], [3]], [1, 2]),
        ([[4, 5], [6]], [4, 5]),
        ([[7], [8]], [7]),
        ([[9], []], [9]),
        ([[10, 11], [12]], [10, 11]),
    ],
    'cow_full_attention': [
        ([[1, 2, 3], [0, 4]], [1, 2, 3]),
        ([[], []], []),
        ([[], []], []),
        ([[6, 7], [8, 9]], [6, 7]),
    ],
    'external_sync': [
        ([[1, 2, 3, 6, 7], [4, 5, 8, 9]], [1, 2, 3, 6, 7, 4, 5, 8, 9]),
        ([[10], [11]], [10, 11]),
    ],
    'external_async_skip': [
        ([[1, 2, 3]], []),
        ([[4, 5]], [4, 5]),
    ],
    'external_async_skip_one_group': [
        ([[1, 2, 3, 4], [5, 6]], [5, 6]),
        ([[7], [8]], [7, 8]),
    ],
    'external_async_unskipped': [
        ([[1, 2, 3, 4], [5, 6]], [1, 2, 3, 4, 5, 6]),
        ([[7], [8]], [7, 8]),
    ],
    'failed_load_recorded': [
        ([[1, 2]], [1, 2]),
        ([[3, 4, 5]], []),
        ([[6]], [4, 5, 6]),
    ],
    'truncated_hit_with_load': [
        ([[1, 2, 3], [0, 4]], [1, 2, 3]),
        ([[5], []], [5]),
        ([[], []], []),
        ([[7, 8], [9]], []),
        ([[10, 11], [12]], [10, 11]),
    ],
    'cross_attention': [
        ([[1, 2], [3, 4, 5]], [1, 2, 3, 4, 5]),
        ([[], []], []),
        ([[], []], []),
    ],
}


def scenario_spec(name: str, profile: str = "vllm-0.33") -> KVCacheSpec:
    """The protocol spec of scenario ``name``, with ``needs_kv_cache_zeroing``."""
    num_blocks, groups, caching, _ = SCENARIOS[name]
    return KVCacheSpec(num_blocks=num_blocks, block_size=4, profile=profile,
                       enable_caching=caching, kv_cache_groups=groups,
                       needs_kv_cache_zeroing=True)


def scenario_ops(name: str) -> list[tuple[Op, bool]]:
    """Scenario ``name``'s ops, each with whether it answers (an ``allocate_slots``)."""
    return [(op, op["op"] in ("schedule", "decode")) for op in SCENARIOS[name][3]]
