"""vLLM 0.33's fine-grained partial hash hits and their copy-on-write in the reference
(docs/semantics.md#fine-grained-partial-hits), replayed call by call against
what vLLM 0.33.0's own ``KVCacheManager`` answered.

How the expected values were obtained: a throwaway script outside the repository (not
committed: it imports vLLM, which the test command does not install) built vLLM 0.33.0's
``KVCacheManager`` (``vllm.v1.core.kv_cache_manager``, CPU-only install) with kvcheck's
``adapters/vllm_kv_config.make_vllm_cache`` (a ``KVCacheConfig`` with one group per entry:
``FullAttentionSpec(block_size, 1 head of 1, float32)``, ``SlidingWindowSpec`` likewise,
``MambaSpec(block_size, shapes=((2, 3),), dtypes=(float32,), mamba_cache_mode="align",
num_speculative_blocks=...)``; ``scheduler_block_size`` and ``hash_block_size`` from vLLM's
``resolve_kv_cache_block_sizes``, the pool size below, ``max_model_len`` uncapped, KV events
on), hashed requests with sha256 and ``PYTHONHASHSEED=0`` through vLLM's
``get_request_block_hasher`` (``adapters/vllm_requests.make_request``), and ran each
scenario's ops as a scheduler does: ``get_computed_blocks``, ``allocate_slots(req, new,
hit_tokens, hit_blocks, num_lookahead_tokens)`` then ``num_computed_tokens += hit + new``,
decode (append one output token, ``allocate_slots(req, 1)``), ``new_step_starts``,
``take_kv_cache_block_copies()`` followed by ``block_pool.free_blocks(retained)`` (vLLM 0.33's
scheduler, non-deferred mode), ``coordinator.enable_partial_hash_hits``, the tables
(``get_block_ids``), the free queue (``get_all_free_blocks``), every block's ``ref_cnt``, and
``take_events`` (kind, group, the first 8 hex digits of each hash and of the parent, token ids,
block size: with ``PYTHONHASHSEED=0`` vLLM's and the reference's hashes are the same bytes).
The printed answers are the literals below; nothing here is computed by the reference.
``check_invariants`` must hold after every allocation, free and release.

What the scenarios show (full attention 4 and Mamba 8 unless said: hash block 4, scheduler
block 8):

* ``mamba_partial_hit``: request a's chunk ends at 12 tokens, its prompt's last hash boundary,
  inside Mamba block 1: a partial-block key (one ``BlockStored`` of 4 tokens, parent the hash
  at 8) on its running state block 4. Its next allocation copies that state (block 6 popped
  from the queue head), moves the key onto the copy (no event), retains both (``ref_cnt`` 2 on
  4, 1 on 6 though no table holds it); the release puts 6 at the tail (it is keyed). b hits 12
  tokens (``[0, 6]`` in Mamba: a hit at a hash boundary inside a block), its table gets the
  copy-on-write block 9 in place of 6 (9 first among the new blocks, retained: ``ref_cnt`` 2),
  and block 9 is keyed at 16 tokens once full (its full key);
* ``full_and_mamba_partial_hit`` (full attention 8, Mamba 12: hash block 4, scheduler block
  24): blocks are cached up to the exact token count (no rounding), so full attention keys a's
  prompt tail at 20 inside its block 2 at once; b's hit of 20 tokens ends inside a block of
  both groups: two copies, group 0's first, each hit block replaced by its copy; when a's
  block 2 fills, its partial key is removed before its full key is stored and then registered
  again as a second key;
* ``same_source_twice``: b and c hit the same state in one step: the retained list holds the
  source twice (``[6, 8, 6, 11]``) and releasing it drops both references;
* ``reservation_one_short`` / ``reservation_fits``: b needs 5 free blocks, the copy-on-write
  block included: refused with 4 (nothing changes), served with 5;
  ``full_reservation_one_short`` / ``full_reservation_fits`` (full attention 8, Mamba 12): one
  copy-on-write block per group, full attention's included;
* ``moved_key_same_step``: the key moved onto a's copy cannot be hit in the step that made
  the copy (the copy runs with that step): b is refused, then served at the next step;
* ``window_keeps_them_off``: a sliding window of block 8 beside (the hash block is 4): the
  feature is off, hits land on the scheduler block (8 tokens, not 12), no copies;
* ``window_at_hash_block``: a window of block 4 leaves it on;
* ``speculative_partial_hit``: one speculative block: b takes 2 + 1 + 1 Mamba blocks;
* ``producer_freed_first``: a is freed before its next allocation: no copy, its state block
  stays keyed in the free queue and b's hit copies from it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from manager_op_replay import block_ids, build_033, replay_ops

from kvcheck.adapters.reference import IMPL_INFO, ReferenceManager
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, RequestView
from kvcheck.reference_impl import partial_hash_hits_enabled
from kvcheck.reference_impl.block import get_block_hash
from kvcheck.reference_impl.errors import InvariantViolation, KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.kv_cache_interface import (
    KVCacheSpec as GroupSpec,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request

P14 = list(range(100, 114))
P22 = list(range(200, 222))


class Scenario(NamedTuple):
    """Groups (``("f", block_size)``, ``("s", block_size, window)``, ``("m", block_size[,
    num_speculative_blocks])``; Mamba in mode "align"), pool size and the ops."""

    groups: list[tuple[Any, ...]]
    num_blocks: int
    ops: list[tuple[Any, ...]]


SCENARIOS: dict[str, Scenario] = {
    "mamba_partial_hit": Scenario([("f", 4), ("m", 8)], 16, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12), ("tables",), ("events",),
        ("step",), ("copies",), ("alloc", "a", 2), ("tables",), ("refs",), ("queue",),
        ("events",), ("copies",), ("refs",), ("queue",),
        ("step",), ("req", "b", [*P14, 7, 8, 9]), ("lookup", "b"), ("alloc", "b", 5),
        ("tables",), ("refs",), ("events",), ("copies",), ("refs",), ("queue",),
        ("step",), ("decode", "b", 5), ("decode", "b", 6), ("decode", "b", 7), ("tables",),
        ("events",), ("free", "a"), ("free", "b"), ("queue",), ("refs",), ("events",),
    ]),
    "full_and_mamba_partial_hit": Scenario([("f", 8), ("m", 12)], 20, [
        ("req", "a", P22), ("lookup", "a"), ("alloc", "a", 20), ("events",), ("step",),
        ("alloc", "a", 2), ("copies",), ("events",), ("step",),
        ("req", "b", [*P22, 1, 2, 3]), ("lookup", "b"), ("alloc", "b", 5), ("tables",),
        ("refs",), ("events",), ("copies",), ("refs",), ("queue",),
        ("step",), ("decode", "a", 9), ("decode", "a", 8), ("events",), ("tables",),
        ("decode", "b", 4), ("events",), ("tables",), ("free", "b"), ("free", "a"),
        ("queue",), ("events",),
    ]),
    "same_source_twice": Scenario([("f", 4), ("m", 8)], 20, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12), ("step",), ("alloc", "a", 2),
        ("copies",), ("step",),
        ("req", "b", [*P14, 1]), ("req", "c", [*P14, 2, 3]), ("lookup", "b"),
        ("alloc", "b", 3), ("lookup", "c"), ("alloc", "c", 5), ("tables",), ("refs",),
        ("copies",), ("refs",), ("queue",), ("events",),
    ]),
    "reservation_one_short": Scenario([("f", 4), ("m", 8)], 10, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12), ("step",), ("alloc", "a", 2),
        ("copies",), ("step",), ("queue",), ("refs",),
        ("req", "b", [*P14, 7, 8, 9]), ("lookup", "b"), ("alloc", "b", 5), ("queue",),
        ("refs",), ("tables",), ("copies",), ("events",),
    ]),
    "reservation_fits": Scenario([("f", 4), ("m", 8)], 11, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12), ("step",), ("alloc", "a", 2),
        ("copies",), ("step",), ("queue",),
        ("req", "b", [*P14, 7, 8, 9]), ("lookup", "b"), ("alloc", "b", 5), ("queue",),
        ("tables",), ("copies",), ("queue",),
    ]),
    "window_keeps_them_off": Scenario([("f", 4), ("s", 8, 8), ("m", 8)], 24, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 8), ("step",), ("alloc", "a", 4),
        ("step",), ("alloc", "a", 2), ("copies",), ("events",), ("step",),
        ("req", "b", [*P14, 7, 8, 9]), ("lookup", "b"), ("alloc", "b", 5), ("tables",),
        ("copies",),
    ]),
    "window_at_hash_block": Scenario([("f", 4), ("s", 4, 6), ("m", 8)], 24, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12), ("step",), ("alloc", "a", 2),
        ("copies",), ("step",),
        ("req", "b", [*P14, 7, 8, 9]), ("lookup", "b"), ("alloc", "b", 5), ("tables",),
        ("copies",),
    ]),
    "speculative_partial_hit": Scenario([("f", 4), ("m", 8, 1)], 24, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12, 2), ("tables",), ("step",),
        ("alloc", "a", 2, 2), ("tables",), ("copies",), ("step",),
        ("req", "b", [*P14, 7, 8, 9]), ("lookup", "b"), ("alloc", "b", 5, 2), ("tables",),
        ("copies",), ("refs",), ("queue",), ("step",), ("decode", "b", 1), ("tables",),
        ("events",),
    ]),
    "full_reservation_one_short": Scenario([("f", 8), ("m", 12)], 9, [
        ("req", "a", P22), ("lookup", "a"), ("alloc", "a", 20), ("step",), ("alloc", "a", 2),
        ("copies",), ("step",), ("queue",),
        ("req", "b", [*P22, 1, 2, 3]), ("lookup", "b"), ("alloc", "b", 5), ("queue",),
        ("refs",), ("copies",),
    ]),
    "full_reservation_fits": Scenario([("f", 8), ("m", 12)], 10, [
        ("req", "a", P22), ("lookup", "a"), ("alloc", "a", 20), ("step",), ("alloc", "a", 2),
        ("copies",), ("step",), ("queue",),
        ("req", "b", [*P22, 1, 2, 3]), ("lookup", "b"), ("alloc", "b", 5), ("tables",),
        ("copies",), ("queue",),
    ]),
    "moved_key_same_step": Scenario([("f", 4), ("m", 8)], 16, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12), ("step",), ("alloc", "a", 2),
        ("req", "b", [*P14, 7]), ("lookup", "b"), ("alloc", "b", 3), ("copies",), ("queue",),
        ("step",), ("lookup", "b"), ("alloc", "b", 3), ("tables",), ("copies",),
    ]),
    "producer_freed_first": Scenario([("f", 4), ("m", 8)], 16, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12), ("step",), ("free", "a"),
        ("copies",), ("queue",), ("events",),
        ("req", "b", [*P14, 7, 8, 9]), ("lookup", "b"), ("alloc", "b", 5), ("tables",),
        ("refs",), ("copies",), ("refs",), ("queue",), ("events",),
    ]),
}

#: What vLLM 0.33.0 answered, one row per observing op (the first row: whether its
#: coordinator turned fine-grained hits on).
RECORDED: dict[str, list[tuple[Any, ...]]] = {
    'mamba_partial_hit': [
        ('enabled', True),
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('tables', {'a': [[1, 2, 3], [0, 4]]}),
        ('events',
         [('S', 0, ('e14b2274', '2fbb6da4', 'f29fa8c6'), None,
           (100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111), 4),
          ('S', 1, (), None, (100, 101, 102, 103, 104, 105, 106, 107), 8),
          ('S', 1, ('f29fa8c6',), '2fbb6da4', (108, 109, 110, 111), 4)]),
        ('copies', [], []),
        ('alloc', 'a', [[5], []]),
        ('tables', {'a': [[1, 2, 3, 5], [0, 4]]}),
        ('refs', [1, 1, 1, 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        ('queue', [7, 8, 9, 10, 11, 12, 13, 14, 15]),
        ('events', []),
        ('copies', [(4, 6)], [4, 6]),
        ('refs', [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        ('queue', [7, 8, 9, 10, 11, 12, 13, 14, 15, 6]),
        ('lookup', 'b', [[1, 2, 3], [0, 6]], 12),
        ('alloc', 'b', [[7, 8], [9, 10]]),
        ('tables', {'a': [[1, 2, 3, 5], [0, 4]], 'b': [[1, 2, 3, 7, 8], [0, 9, 10]]}),
        ('refs', [2, 2, 2, 1, 1, 1, 1, 1, 2, 1, 0, 0, 0, 0, 0]),
        ('events',
         [('S', 0, ('ec1721cc',), 'f29fa8c6', (112, 113, 7, 8), 4),
          ('S', 1, ('ec1721cc',), '2fbb6da4', (108, 109, 110, 111, 112, 113, 7, 8), 8)]),
        ('copies', [(6, 9)], [6, 9]),
        ('refs', [2, 2, 2, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]),
        ('queue', [11, 12, 13, 14, 15, 6]),
        ('decode', 'b', [[], []]),
        ('decode', 'b', [[], []]),
        ('decode', 'b', [[], []]),
        ('tables', {'a': [[1, 2, 3, 5], [0, 4]], 'b': [[1, 2, 3, 7, 8], [0, 0, 10]]}),
        ('events', [('S', 0, ('f3d7c57e',), 'ec1721cc', (9, 5, 6, 7), 4)]),
        ('queue', [10, 4, 5, 11, 12, 13, 14, 15, 6, 9, 8, 7, 3, 2, 1]),
        ('refs', [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        ('events', []),
    ],
    'full_and_mamba_partial_hit': [
        ('enabled', True),
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('events',
         [('S', 0, ('6cbb48f1', 'be615ed3'), None,
           (200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215),
           8),
          ('S', 0, ('3e4923be',), 'be615ed3', (216, 217, 218, 219), 4),
          ('S', 1, (), None, (200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211),
           12),
          ('S', 1, ('3e4923be',), 'be615ed3', (216, 217, 218, 219), 4)]),
        ('alloc', 'a', [[], []]),
        ('copies', [(4, 5)], [4, 5]),
        ('events', []),
        ('lookup', 'b', [[1, 2, 3], [0, 5]], 20),
        ('alloc', 'b', [[6, 7], [8, 9]]),
        ('tables', {'a': [[1, 2, 3], [0, 4]], 'b': [[1, 2, 6, 7], [0, 8, 9]]}),
        ('refs', [2, 2, 2, 1, 1, 2, 1, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        ('events',
         [('S', 0, ('f232a49f',), 'be615ed3', (216, 217, 218, 219, 220, 221, 1, 2), 8),
          ('S', 1, ('f232a49f',), 'af58f740',
           (212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 1, 2), 12)]),
        ('copies', [(3, 6), (5, 8)], [3, 6, 5, 8]),
        ('refs', [2, 2, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        ('queue', [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 5]),
        ('decode', 'a', [[], []]),
        ('decode', 'a', [[], []]),
        ('events',
         [('R', 0, ('3e4923be',)),
          ('S', 0, ('3127e075',), 'be615ed3', (216, 217, 218, 219, 220, 221, 9, 8), 8),
          ('S', 0, ('3e4923be',), 'be615ed3', (216, 217, 218, 219), 4),
          ('S', 1, ('3127e075',), 'af58f740',
           (212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 9, 8), 12)]),
        ('tables', {'a': [[1, 2, 3], [0, 4]], 'b': [[1, 2, 6, 7], [0, 8, 9]]}),
        ('decode', 'b', [[], []]),
        ('events', []),
        ('tables', {'a': [[1, 2, 3], [0, 4]], 'b': [[1, 2, 6, 7], [0, 0, 9]]}),
        ('queue', [9, 7, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 5, 8, 6, 3, 2, 1, 4]),
        ('events', []),
    ],
    'same_source_twice': [
        ('enabled', True),
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('alloc', 'a', [[5], []]),
        ('copies', [(4, 6)], [4, 6]),
        ('lookup', 'b', [[1, 2, 3], [0, 6]], 12),
        ('alloc', 'b', [[7], [8]]),
        ('lookup', 'c', [[1, 2, 3], [0, 6]], 12),
        ('alloc', 'c', [[9, 10], [11, 12]]),
        ('tables',
         {'a': [[1, 2, 3, 5], [0, 4]],
          'b': [[1, 2, 3, 7], [0, 8]],
          'c': [[1, 2, 3, 9, 10], [0, 11, 12]]}),
        ('refs', [3, 3, 3, 1, 1, 2, 1, 2, 1, 1, 2, 1, 0, 0, 0, 0, 0, 0, 0]),
        ('copies', [(6, 8), (6, 11)], [6, 8, 6, 11]),
        ('refs', [3, 3, 3, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]),
        ('queue', [13, 14, 15, 16, 17, 18, 19, 6]),
        ('events',
         [('S', 0, ('e14b2274', '2fbb6da4', 'f29fa8c6'), None,
           (100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111), 4),
          ('S', 1, (), None, (100, 101, 102, 103, 104, 105, 106, 107), 8),
          ('S', 1, ('f29fa8c6',), '2fbb6da4', (108, 109, 110, 111), 4),
          ('S', 0, ('6010f8ce',), 'f29fa8c6', (112, 113, 2, 3), 4),
          ('S', 1, ('6010f8ce',), '2fbb6da4', (108, 109, 110, 111, 112, 113, 2, 3), 8)]),
    ],
    'reservation_one_short': [
        ('enabled', True),
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('alloc', 'a', [[5], []]),
        ('copies', [(4, 6)], [4, 6]),
        ('queue', [7, 8, 9, 6]),
        ('refs', [1, 1, 1, 1, 1, 0, 0, 0, 0]),
        ('lookup', 'b', [[1, 2, 3], [0, 6]], 12),
        ('alloc', 'b', None),
        ('queue', [7, 8, 9, 6]),
        ('refs', [1, 1, 1, 1, 1, 0, 0, 0, 0]),
        ('tables', {'a': [[1, 2, 3, 5], [0, 4]], 'b': [[], []]}),
        ('copies', [], []),
        ('events',
         [('S', 0, ('e14b2274', '2fbb6da4', 'f29fa8c6'), None,
           (100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111), 4),
          ('S', 1, (), None, (100, 101, 102, 103, 104, 105, 106, 107), 8),
          ('S', 1, ('f29fa8c6',), '2fbb6da4', (108, 109, 110, 111), 4)]),
    ],
    'reservation_fits': [
        ('enabled', True),
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('alloc', 'a', [[5], []]),
        ('copies', [(4, 6)], [4, 6]),
        ('queue', [7, 8, 9, 10, 6]),
        ('lookup', 'b', [[1, 2, 3], [0, 6]], 12),
        ('alloc', 'b', [[7, 8], [9, 10]]),
        ('queue', []),
        ('tables', {'a': [[1, 2, 3, 5], [0, 4]], 'b': [[1, 2, 3, 7, 8], [0, 9, 10]]}),
        ('copies', [(6, 9)], [6, 9]),
        ('queue', [6]),
    ],
    'window_keeps_them_off': [
        ('enabled', False),
        ('lookup', 'a', [[], [], []], 0),
        ('alloc', 'a', [[1, 2], [3], [4]]),
        ('alloc', 'a', [[5], [6], [7]]),
        ('alloc', 'a', [[8], [], []]),
        ('copies', [], []),
        ('events',
         [('S', 0, ('e14b2274', '2fbb6da4'), None, (100, 101, 102, 103, 104, 105, 106, 107),
           4),
          ('S', 1, ('2fbb6da4',), None, (100, 101, 102, 103, 104, 105, 106, 107), 8),
          ('S', 2, ('2fbb6da4',), None, (100, 101, 102, 103, 104, 105, 106, 107), 8)]),
        ('lookup', 'b', [[1, 2], [3], [4]], 8),
        ('alloc', 'b', [[9, 10], [11], [12]]),
        ('tables',
         {'a': [[1, 2, 5, 8], [3, 6], [0, 7]], 'b': [[1, 2, 9, 10], [3, 11], [4, 12]]}),
        ('copies', [], []),
    ],
    'window_at_hash_block': [
        ('enabled', True),
        ('lookup', 'a', [[], [], []], 0),
        ('alloc', 'a', [[1, 2, 3], [4, 5, 6], [0, 7]]),
        ('alloc', 'a', [[8], [9], []]),
        ('copies', [(7, 10)], [7, 10]),
        ('lookup', 'b', [[1, 2, 3], [0, 5, 6], [0, 10]], 12),
        ('alloc', 'b', [[11, 12], [13, 14], [15, 16]]),
        ('tables',
         {'a': [[1, 2, 3, 8], [0, 5, 6, 9], [0, 7]],
          'b': [[1, 2, 3, 11, 12], [0, 5, 6, 13, 14], [0, 15, 16]]}),
        ('copies', [(10, 15)], [10, 15]),
    ],
    'speculative_partial_hit': [
        ('enabled', True),
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3, 4], [0, 5, 6]]),
        ('tables', {'a': [[1, 2, 3, 4], [0, 5, 6]]}),
        ('alloc', 'a', [[], []]),
        ('tables', {'a': [[1, 2, 3, 4], [0, 5, 6]]}),
        ('copies', [(5, 7)], [5, 7]),
        ('lookup', 'b', [[1, 2, 3], [0, 7]], 12),
        ('alloc', 'b', [[8, 9], [10, 11, 12]]),
        ('tables', {'a': [[1, 2, 3, 4], [0, 5, 6]], 'b': [[1, 2, 3, 8, 9], [0, 10, 11, 12]]}),
        ('copies', [(7, 10)], [7, 10]),
        ('refs', [2, 2, 2, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        ('queue', [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 7]),
        ('decode', 'b', [[], []]),
        ('tables', {'a': [[1, 2, 3, 4], [0, 5, 6]], 'b': [[1, 2, 3, 8, 9], [0, 0, 11, 12]]}),
        ('events',
         [('S', 0, ('e14b2274', '2fbb6da4', 'f29fa8c6'), None,
           (100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111), 4),
          ('S', 1, (), None, (100, 101, 102, 103, 104, 105, 106, 107), 8),
          ('S', 1, ('f29fa8c6',), '2fbb6da4', (108, 109, 110, 111), 4),
          ('S', 0, ('ec1721cc',), 'f29fa8c6', (112, 113, 7, 8), 4),
          ('S', 1, ('ec1721cc',), '2fbb6da4', (108, 109, 110, 111, 112, 113, 7, 8), 8)]),
    ],
    'producer_freed_first': [
        ('enabled', True),
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('copies', [], []),
        ('queue', [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 3, 2, 1, 4]),
        ('events',
         [('S', 0, ('e14b2274', '2fbb6da4', 'f29fa8c6'), None,
           (100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111), 4),
          ('S', 1, (), None, (100, 101, 102, 103, 104, 105, 106, 107), 8),
          ('S', 1, ('f29fa8c6',), '2fbb6da4', (108, 109, 110, 111), 4)]),
        ('lookup', 'b', [[1, 2, 3], [0, 4]], 12),
        ('alloc', 'b', [[5, 6], [7, 8]]),
        ('tables', {'b': [[1, 2, 3, 5, 6], [0, 7, 8]]}),
        ('refs', [1, 1, 1, 1, 1, 1, 2, 1, 0, 0, 0, 0, 0, 0, 0]),
        ('copies', [(4, 7)], [4, 7]),
        ('refs', [1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]),
        ('queue', [9, 10, 11, 12, 13, 14, 15, 4]),
        ('events',
         [('S', 0, ('ec1721cc',), 'f29fa8c6', (112, 113, 7, 8), 4),
          ('S', 1, ('ec1721cc',), '2fbb6da4', (108, 109, 110, 111, 112, 113, 7, 8), 8)]),
    ],
    'full_reservation_one_short': [
        ('enabled', True),
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('alloc', 'a', [[], []]),
        ('copies', [(4, 5)], [4, 5]),
        ('queue', [6, 7, 8, 5]),
        ('lookup', 'b', [[1, 2, 3], [0, 5]], 20),
        ('alloc', 'b', None),
        ('queue', [6, 7, 8, 5]),
        ('refs', [1, 1, 1, 1, 0, 0, 0, 0]),
        ('copies', [], []),
    ],
    'full_reservation_fits': [
        ('enabled', True),
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('alloc', 'a', [[], []]),
        ('copies', [(4, 5)], [4, 5]),
        ('queue', [6, 7, 8, 9, 5]),
        ('lookup', 'b', [[1, 2, 3], [0, 5]], 20),
        ('alloc', 'b', [[6, 7], [8, 9]]),
        ('tables', {'a': [[1, 2, 3], [0, 4]], 'b': [[1, 2, 6, 7], [0, 8, 9]]}),
        ('copies', [(3, 6), (5, 8)], [3, 6, 5, 8]),
        ('queue', [5]),
    ],
    'moved_key_same_step': [
        ('enabled', True),
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('alloc', 'a', [[5], []]),
        ('lookup', 'b', [[1, 2, 3], [0, 6]], 12),
        ('alloc', 'b', None),
        ('copies', [(4, 6)], [4, 6]),
        ('queue', [7, 8, 9, 10, 11, 12, 13, 14, 15, 6]),
        ('lookup', 'b', [[1, 2, 3], [0, 6]], 12),
        ('alloc', 'b', [[7], [8]]),
        ('tables', {'a': [[1, 2, 3, 5], [0, 4]], 'b': [[1, 2, 3, 7], [0, 8]]}),
        ('copies', [(6, 8)], [6, 8]),
    ],
}


def _specs(groups: list[tuple[Any, ...]]) -> list[GroupSpec]:
    out: list[GroupSpec] = []
    for g in groups:
        if g[0] == "f":
            out.append(FullAttentionSpec(g[1]))
        elif g[0] == "s":
            out.append(SlidingWindowSpec(g[1], g[2]))
        elif g[0] == "c":
            out.append(ChunkedLocalAttentionSpec(g[1], g[2]))
        else:
            out.append(MambaSpec(g[1], "align", g[2] if len(g) > 2 else 0))
    return out


def _replay(s: Scenario) -> list[tuple[Any, ...]]:
    """The scenario's ops on the reference's ``KVCacheManager``, answered as the recorder
    printed vLLM's answers."""
    m = build_033(s.num_blocks, _specs(s.groups))
    return [("enabled", m.enable_partial_hash_hits), *replay_ops(m, s.ops)]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_matches_vllm(name: str) -> None:
    got = _replay(SCENARIOS[name])
    want = RECORDED[name]
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        assert g == w, f"{name}: answer {i} ({w[0]}) differs from vLLM 0.33.0's"
    assert len(got) == len(want)


#: ``coordinator.enable_partial_hash_hits`` of vLLM 0.33.0's ``KVCacheManager`` for these
#: groups (prefix caching on; hash block 4 in every layout but the single Mamba group's 8),
#: recorded by the same script. Chunked local attention at block 4 beside full attention 4 and
#: Mamba 8 was built with kvcheck's adapter refusal lifted (vLLM itself takes it: its chunked
#: manager asserts its block equals the hit alignment, here the hash block).
RECORDED_ENABLED = [
    ([("f", 4), ("m", 8)], True),
    ([("f", 4), ("m", 4)], False),  # the Mamba block is the hash block
    ([("f", 8), ("m", 12)], True),
    ([("m", 8), ("m", 12)], True),
    ([("f", 4), ("s", 8, 8), ("m", 8)], False),  # a window at another block size
    ([("f", 4), ("s", 4, 6), ("m", 8)], True),
    ([("f", 4), ("c", 4, 8), ("m", 8)], True),
    ([("f", 4), ("c", 8, 8), ("m", 8)], False),  # chunked local at another block size
    ([("m", 8)], False),  # one group: the unitary coordinator
    ([("f", 8), ("s", 4, 8)], False),  # no Mamba group
    ([("f", 8), ("m", 4)], False),
]


@pytest.mark.parametrize(("groups", "enabled"), RECORDED_ENABLED)
def test_enabled_where_vllm_enables_them(groups: list[tuple[Any, ...]], enabled: bool) -> None:
    specs = _specs(groups)
    m = KVCacheManager(16, kv_cache_specs=specs, profile="vllm-0.33", pythonhashseed="0")
    assert m.enable_partial_hash_hits is enabled
    if len(specs) > 1:
        assert partial_hash_hits_enabled(specs, m.hash_block_size) is enabled


def test_off_without_caching() -> None:
    """Caching off: vLLM's coordinator without prefix cache never turns them on."""
    specs = [FullAttentionSpec(4), MambaSpec(8, "align")]
    m = KVCacheManager(16, kv_cache_specs=specs, enable_caching=False, profile="vllm-0.33",
                       pythonhashseed="0")
    assert not m.enable_partial_hash_hits
    assert m.coordinator.cache_hit_alignment_tokens == 8


def _manager(num_blocks: int = 20) -> KVCacheManager:
    return KVCacheManager(num_blocks, kv_cache_specs=[FullAttentionSpec(4), MambaSpec(8, "align")],
                          profile="vllm-0.33", pythonhashseed="0")


def _copy_made(m: KVCacheManager) -> Request:
    """``mamba_partial_hit`` up to a's copy: a computed 12, then 2 tokens (the copy of its
    state block 4 into block 6 made, not taken)."""
    a = m.make_request("a", P14)
    assert m.allocate_slots(a, 12) is not None
    a.num_computed_tokens = 12
    m.new_step_starts()
    assert m.allocate_slots(a, 2) is not None
    return a


def test_retained_references_are_counted_by_the_invariants() -> None:
    """Law 6 counts a copy's retained references: taking the copies without releasing them
    leaves references no table or copy accounts for."""
    m = _manager()
    _copy_made(m)
    m.check_invariants()  # block 4: one table entry + one retained, block 6: one retained
    copies, retained = m.take_kv_cache_block_copies()
    assert (copies, [b.block_id for b in retained]) == ([(4, 6)], [4, 6])
    with pytest.raises(InvariantViolation, match="block 4: ref_cnt=2 but 1 block-table"):
        m.check_invariants()
    m.block_pool.free_retained_blocks(retained)
    m.check_invariants()
    assert m.take_kv_cache_block_copies() == ([], [])  # drained once


def test_free_retained_blocks_refuses_more_releases_than_references() -> None:
    m = _manager()
    _copy_made(m)
    _, retained = m.take_kv_cache_block_copies()
    block_6 = retained[1]
    queue = [b.block_id for b in m.block_pool.free_block_queue]
    with pytest.raises(KVCacheMisuseError, match="block 6 is listed 2 times but has ref_cnt 1"):
        m.block_pool.free_retained_blocks([*retained, block_6])
    assert [b.block_id for b in m.block_pool.free_block_queue] == queue  # nothing changed
    assert (retained[0].ref_cnt, block_6.ref_cnt) == (2, 1)


def test_move_block_hashes_refuses_a_keyed_destination() -> None:
    m = _manager()
    _copy_made(m)
    pool = m.block_pool
    moved = pool.blocks[6]
    assert [get_block_hash(k).hex()[:8] for k in pool.cache_keys_of(moved)] == ["f29fa8c6"]
    with pytest.raises(KVCacheMisuseError, match="destination already carries a cache key"):
        pool.move_block_hashes(pool.blocks[1], moved)


def test_hits_of_the_wrong_shape_are_refused() -> None:
    """A fine-grained hit of 12 tokens is 3 full-attention blocks and 2 Mamba entries (the
    last partly hit); whole blocks of Mamba's 8 would be 1.5."""
    m = _manager()
    a = _copy_made(m)
    m.take_kv_cache_block_copies()
    b = m.make_request("b", [*P14, 7])
    blocks, n = m.get_computed_blocks(b)
    assert (block_ids(blocks), n) == ([[1, 2, 3], [0, 6]], 12)
    with pytest.raises(KVCacheMisuseError, match="group 1 got 1 hit blocks of 8 tokens"):
        m.allocate_slots(b, 3, 12, (blocks[0], blocks[1][1:]))
    assert a.num_computed_tokens == 12


def _adapter_spec(num_blocks: int) -> KVCacheSpec:
    return KVCacheSpec(num_blocks=num_blocks, block_size=4, kv_cache_groups=(
        KVCacheGroupSpec("full_attention", 4),
        KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")))


def test_adapter_drains_the_copies_and_releases_them_as_vllms_scheduler() -> None:
    """``ReferenceManager.take_kv_cache_block_copies`` (capability ``fine_grained_hits``):
    ``same_source_twice`` through the adapter: the copies as vLLM answered them, and the
    free queue and ``ref_cnt`` after the release as vLLM's ``free_blocks(retained)`` left
    them."""
    assert "fine_grained_hits" in IMPL_INFO.capabilities
    m = ReferenceManager(_adapter_spec(20))
    a = RequestView("a", tuple(P14))
    assert m.allocate_slots(a, 12) == [[1, 2, 3], [0, 4]]
    a = RequestView("a", tuple(P14), num_computed_tokens=12)
    assert m.take_kv_cache_block_copies() == []
    m.new_step_starts()
    assert m.allocate_slots(a, 2) == [[5], []]
    assert m.take_kv_cache_block_copies() == [(4, 6)]
    m.new_step_starts()
    for rid, prompt, new in (("b", (*P14, 1), 3), ("c", (*P14, 2, 3), 5)):
        view = RequestView(rid, prompt)
        ids, n = m.get_computed_blocks(view)
        assert (ids, n) == ([[1, 2, 3], [0, 6]], 12)
        assert m.allocate_slots(view, new, n, ids) is not None
    assert m.take_kv_cache_block_copies() == [(6, 8), (6, 11)]
    assert [m.ref_cnt(i) for i in range(1, 20)] == [
        3, 3, 3, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert m.free_block_ids() == [13, 14, 15, 16, 17, 18, 19, 6]
    assert m.take_kv_cache_block_copies() == []
    m.check_invariants()
