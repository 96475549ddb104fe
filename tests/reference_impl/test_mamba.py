"""The reference's Mamba KV-cache groups (``MambaSpec``/``MambaManager``): vLLM 0.33's modes
"none" and "align" and vLLM 0.10.2's Mamba manager, replayed call by call against block ids
recorded from vLLM's own classes, and the layouts vLLM refuses (or the reference does not
model) refused by name.

How the expected values were obtained: a throwaway script outside the repository (not
committed: it imports vLLM, which the test command does not install) built vLLM 0.33.0's and
0.10.2's own
``KVCacheManager`` (``vllm.v1.core.kv_cache_manager``, CPU-only installs) over a
``KVCacheConfig`` with the same groups (``MambaSpec(block_size, shapes=((2, 3),),
dtypes=(float32,), mamba_cache_mode=..., num_speculative_blocks=...)``, 0.10.2 without
``mamba_cache_mode``; ``FullAttentionSpec(block_size, 1 head of 8, float32)``), the same pool
size, ``max_model_len=1000``, ``scheduler_block_size = lcm`` and ``hash_block_size = gcd`` of
the block sizes (caching on; ``lcm`` off), requests hashed with sha256 through
``get_request_block_hasher``, and ran each scenario's ops below in order:
``get_computed_blocks``, ``allocate_slots(req, new, hit_tokens, hit_blocks,
num_lookahead_tokens=...)`` (or with ``num_external_computed_tokens``), advancing
``num_computed_tokens`` and appending output tokens as a scheduler does,
``coordinator.get_blocks``, the free queue (``get_all_free_blocks``), ``free``,
``new_step_starts`` and ``take_events`` (kind, number of hashes, parent None or not, token
ids, block size, group: vLLM's NONE_HASH is random, so hash values are not compared). The
printed answers are the literals below; nothing here is computed by the reference.
``check_invariants`` must hold after every allocation and free.

What the scenarios show (block size 4 unless said):

* ``align_prefill_decode``: a 10-token prompt takes ``[null, null, B]`` (``cdiv(10, 4) = 3``
  entries, the ``n - 1`` skipped tokens' blocks are nulls, and the nulls are returned as new
  blocks, as vLLM returns them); at 12 tokens the state moves to a new block, and one step
  later the block of two steps ago is freed and nulled (block 1 to the free queue's tail: it
  was cached at 12 tokens);
* ``align_chunked_spec``: one speculative block, lookahead ignored in align mode;
* ``align_relocate``: a step that skips past the speculative block moves it to the table's
  end and leaves a null at its index (``[1, 0, 2, 3]``: not append-only);
* ``align_hit_same_step``: a hit on ONE block padded with nulls; the hit is refused (None)
  while its block was cached in this step, and accepted after ``new_step_starts``;
* ``align_full_pool``: a new request takes ``1 + num_speculative_blocks`` blocks at most;
* ``none_small_blocks`` / ``v010_spec_lookahead``: mode "none" (0.33 frees the blocks of
  the ``n - 1`` skipped tokens; 0.10.2 keeps every block) with speculative blocks
  (``num_tokens + block_size * num_speculative_blocks`` slots, lookahead included);
* ``hybrid_*``: full attention + Mamba "align": the common hit length is where Mamba has a
  cached state (``hybrid_fixed_point``: full attention hits 12 tokens, Mamba 8, hit 8),
  aligned to the scheduler block (``hybrid_alignment``: full attention blocks of 8, Mamba of
  4: Mamba's cached state at 12 tokens is skipped), and freeing order into the queue;
  ``hybrid_nocache``: mode "none" beside full attention with caching off, both releases;
* ``align_events``: a Mamba group's ``BlockStored`` carries the hashes of its non-null
  blocks only while ``token_ids`` spans every block of the range (one hash, 8 tokens), and a
  range of nulls still yields a ``BlockStored`` with no hash (vLLM 0.33 emits it);
* ``align_external`` / ``none_external``: external (KV-connector) tokens of a new request:
  the Mamba group nulls all but the block of the last external token
  (``allocate_slots(..., num_external_computed_tokens=8)`` in vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import pytest

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.events import BlockRemoved, BlockStored
from kvcheck.reference_impl.kv_cache_interface import (
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    get_kv_cache_spec_kind,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request


class Scenario(NamedTuple):
    """Groups (``("m", block_size, mode, num_speculative_blocks)`` or ``("f",
    block_size)``), pool size, caching, the ops, and per profile what vLLM answered."""

    specs: tuple[tuple[Any, ...], ...]
    num_blocks: int
    caching: bool
    ops: list[tuple[Any, ...]]
    expected: dict[str, list[tuple[Any, ...]]]
    events: bool = False


SCENARIOS: dict[str, Scenario] = {
    'align_prefill_decode': Scenario(
        specs=(('m', 4, 'align', 0),), num_blocks=12, caching=True,
        ops=[('req', 'a', 100, 10, ()), ('hit', 'a'), ('alloc', 'a', 10, 0, True),
             ('table', 'a'), ('freeq',), ('adv', 'a', 10, [1]), ('alloc', 'a', 1, 0, False),
             ('table', 'a'), ('adv', 'a', 1, [2]), ('alloc', 'a', 1, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 1, [3]), ('alloc', 'a', 1, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 1, [4]), ('alloc', 'a', 1, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 1, [5]), ('alloc', 'a', 1, 0, False), ('table', 'a'),
             ('freeq',), ('free', 'a'), ('freeq',)],
        expected={
            'vllm-0.33': [('hit', 'a', [[]], 0), ('alloc', 'a', [[0, 0, 1]]),
                 ('table', 'a', [[0, 0, 1]]), ('freeq', [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]),
                 ('alloc', 'a', [[]]), ('table', 'a', [[0, 0, 1]]), ('alloc', 'a', [[]]),
                 ('table', 'a', [[0, 0, 1]]), ('freeq', [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]),
                 ('alloc', 'a', [[2]]), ('table', 'a', [[0, 0, 1, 2]]),
                 ('freeq', [3, 4, 5, 6, 7, 8, 9, 10, 11]), ('alloc', 'a', [[]]),
                 ('table', 'a', [[0, 0, 0, 2]]), ('freeq', [3, 4, 5, 6, 7, 8, 9, 10, 11, 1]),
                 ('alloc', 'a', [[]]), ('table', 'a', [[0, 0, 0, 2]]),
                 ('freeq', [3, 4, 5, 6, 7, 8, 9, 10, 11, 1]),
                 ('freeq', [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1])],
        }),
    'align_chunked_spec': Scenario(
        specs=(('m', 4, 'align', 1),), num_blocks=14, caching=True,
        ops=[('req', 'a', 100, 14, ()), ('hit', 'a'), ('alloc', 'a', 8, 0, True),
             ('table', 'a'), ('freeq',), ('adv', 'a', 8, []), ('alloc', 'a', 4, 0, False),
             ('table', 'a'), ('freeq',), ('adv', 'a', 4, []), ('alloc', 'a', 2, 2, False),
             ('table', 'a'), ('freeq',), ('adv', 'a', 2, [7]), ('alloc', 'a', 1, 2, False),
             ('table', 'a'), ('freeq',), ('adv', 'a', 1, [8]), ('alloc', 'a', 1, 2, False),
             ('table', 'a'), ('freeq',), ('free', 'a'), ('freeq',)],
        expected={
            'vllm-0.33': [('hit', 'a', [[]], 0), ('alloc', 'a', [[0, 1, 2]]),
                 ('table', 'a', [[0, 1, 2]]), ('freeq', [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]),
                 ('alloc', 'a', [[3]]), ('table', 'a', [[0, 1, 2, 3]]),
                 ('freeq', [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]), ('alloc', 'a', [[4]]),
                 ('table', 'a', [[0, 0, 2, 3, 4]]),
                 ('freeq', [5, 6, 7, 8, 9, 10, 11, 12, 13, 1]), ('alloc', 'a', [[]]),
                 ('table', 'a', [[0, 0, 0, 3, 4]]),
                 ('freeq', [5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 2]), ('alloc', 'a', [[]]),
                 ('table', 'a', [[0, 0, 0, 3, 4]]),
                 ('freeq', [5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 2]),
                 ('freeq', [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 2, 3])],
        }),
    'align_relocate': Scenario(
        specs=(('m', 4, 'align', 1),), num_blocks=12, caching=True,
        ops=[('req', 'a', 100, 20, ()), ('alloc', 'a', 4, 0, False), ('table', 'a'), ('freeq',),
             ('adv', 'a', 4, []), ('alloc', 'a', 8, 0, False), ('table', 'a'), ('freeq',),
             ('adv', 'a', 8, []), ('alloc', 'a', 8, 0, False), ('table', 'a'), ('freeq',),
             ('free', 'a'), ('freeq',)],
        expected={
            'vllm-0.33': [('alloc', 'a', [[1, 2]]), ('table', 'a', [[1, 2]]),
                 ('freeq', [3, 4, 5, 6, 7, 8, 9, 10, 11]), ('alloc', 'a', [[2, 3]]),
                 ('table', 'a', [[1, 0, 2, 3]]), ('freeq', [4, 5, 6, 7, 8, 9, 10, 11]),
                 ('alloc', 'a', [[3, 4]]), ('table', 'a', [[0, 0, 2, 0, 3, 4]]),
                 ('freeq', [5, 6, 7, 8, 9, 10, 11, 1]),
                 ('freeq', [4, 5, 6, 7, 8, 9, 10, 11, 1, 3, 2])],
        }),
    'align_hit_same_step': Scenario(
        specs=(('m', 4, 'align', 0),), num_blocks=12, caching=True,
        ops=[('req', 'a', 100, 12, ()), ('alloc', 'a', 8, 0, False), ('table', 'a'), ('freeq',),
             ('req', 'b', 100, 12, ()), ('hit', 'b'), ('alloc', 'b', 3, 0, True),
             ('table', 'b'), ('step',), ('hit', 'b'), ('alloc', 'b', 3, 0, True),
             ('table', 'b'), ('freeq',), ('adv', 'a', 8, []), ('alloc', 'a', 4, 0, False),
             ('table', 'a'), ('freeq',), ('adv', 'b', 3, []), ('alloc', 'b', 3, 0, False),
             ('table', 'b'), ('freeq',), ('free', 'a'), ('free', 'b'), ('freeq',), ('step',),
             ('req', 'c', 100, 14, ()), ('hit', 'c'), ('alloc', 'c', 2, 0, True),
             ('table', 'c'), ('freeq',)],
        expected={
            'vllm-0.33': [('alloc', 'a', [[0, 1]]), ('table', 'a', [[0, 1]]),
                 ('freeq', [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), ('hit', 'b', [[0, 1]], 8),
                 ('alloc', 'b', None), ('table', 'b', [[]]), ('hit', 'b', [[0, 1]], 8),
                 ('alloc', 'b', [[2]]), ('table', 'b', [[0, 1, 2]]),
                 ('freeq', [3, 4, 5, 6, 7, 8, 9, 10, 11]), ('alloc', 'a', [[3]]),
                 ('table', 'a', [[0, 1, 3]]), ('freeq', [4, 5, 6, 7, 8, 9, 10, 11]),
                 ('alloc', 'b', [[4]]), ('table', 'b', [[0, 0, 2, 4]]),
                 ('freeq', [5, 6, 7, 8, 9, 10, 11]),
                 ('freeq', [4, 5, 6, 7, 8, 9, 10, 11, 3, 1, 2]), ('hit', 'c', [[0, 0, 3]], 12),
                 ('alloc', 'c', [[4]]), ('table', 'c', [[0, 0, 3, 4]]),
                 ('freeq', [5, 6, 7, 8, 9, 10, 11, 1, 2])],
        }),
    'align_full_pool': Scenario(
        specs=(('m', 4, 'align', 1),), num_blocks=5, caching=True,
        ops=[('req', 'a', 100, 10, ()), ('alloc', 'a', 10, 0, False), ('table', 'a'),
             ('freeq',), ('req', 'b', 200, 10, ()), ('alloc', 'b', 10, 0, False),
             ('table', 'b'), ('freeq',), ('adv', 'a', 10, [1, 2, 3]),
             ('alloc', 'a', 3, 0, False), ('table', 'a'), ('freeq',)],
        expected={
            'vllm-0.33': [('alloc', 'a', [[0, 0, 1, 2]]), ('table', 'a', [[0, 0, 1, 2]]),
                 ('freeq', [3, 4]), ('alloc', 'b', [[0, 0, 3, 4]]),
                 ('table', 'b', [[0, 0, 3, 4]]), ('freeq', []), ('alloc', 'a', None),
                 ('table', 'a', [[0, 0, 1, 2]]), ('freeq', [])],
        }),
    'none_small_blocks': Scenario(
        specs=(('m', 4, 'none', 1),), num_blocks=12, caching=False,
        ops=[('req', 'a', 100, 10, ()), ('alloc', 'a', 10, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 10, [1]), ('alloc', 'a', 1, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 1, [2]), ('alloc', 'a', 1, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 1, [3]), ('alloc', 'a', 1, 2, False), ('table', 'a'),
             ('freeq',), ('free', 'a'), ('freeq',)],
        expected={
            'vllm-0.33': [('alloc', 'a', [[1, 2, 3, 4]]), ('table', 'a', [[1, 2, 3, 4]]),
                 ('freeq', [5, 6, 7, 8, 9, 10, 11]), ('alloc', 'a', [[]]),
                 ('table', 'a', [[0, 0, 3, 4]]), ('freeq', [2, 1, 5, 6, 7, 8, 9, 10, 11]),
                 ('alloc', 'a', [[]]), ('table', 'a', [[0, 0, 3, 4]]),
                 ('freeq', [2, 1, 5, 6, 7, 8, 9, 10, 11]), ('alloc', 'a', [[2]]),
                 ('table', 'a', [[0, 0, 3, 4, 2]]), ('freeq', [1, 5, 6, 7, 8, 9, 10, 11]),
                 ('freeq', [2, 4, 3, 1, 5, 6, 7, 8, 9, 10, 11])],
            'vllm-0.10': [('alloc', 'a', [[1, 2, 3, 4]]), ('table', 'a', [[1, 2, 3, 4]]),
                 ('freeq', [5, 6, 7, 8, 9, 10, 11]), ('alloc', 'a', [[]]),
                 ('table', 'a', [[1, 2, 3, 4]]), ('freeq', [5, 6, 7, 8, 9, 10, 11]),
                 ('alloc', 'a', [[]]), ('table', 'a', [[1, 2, 3, 4]]),
                 ('freeq', [5, 6, 7, 8, 9, 10, 11]), ('alloc', 'a', [[5]]),
                 ('table', 'a', [[1, 2, 3, 4, 5]]), ('freeq', [6, 7, 8, 9, 10, 11]),
                 ('freeq', [6, 7, 8, 9, 10, 11, 5, 4, 3, 2, 1])],
        }),
    'v010_spec_lookahead': Scenario(
        specs=(('m', 4, 'none', 2),), num_blocks=14, caching=False,
        ops=[('req', 'a', 100, 10, ()), ('alloc', 'a', 10, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 10, [1]), ('alloc', 'a', 1, 3, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 1, [2]), ('alloc', 'a', 1, 3, False), ('table', 'a'),
             ('freeq',), ('free', 'a'), ('freeq',)],
        expected={
            'vllm-0.33': [('alloc', 'a', [[1, 2, 3, 4, 5]]), ('table', 'a', [[1, 2, 3, 4, 5]]),
                 ('freeq', [6, 7, 8, 9, 10, 11, 12, 13]), ('alloc', 'a', [[2]]),
                 ('table', 'a', [[0, 0, 3, 4, 5, 2]]),
                 ('freeq', [1, 6, 7, 8, 9, 10, 11, 12, 13]), ('alloc', 'a', [[]]),
                 ('table', 'a', [[0, 0, 3, 4, 5, 2]]),
                 ('freeq', [1, 6, 7, 8, 9, 10, 11, 12, 13]),
                 ('freeq', [2, 5, 4, 3, 1, 6, 7, 8, 9, 10, 11, 12, 13])],
            'vllm-0.10': [('alloc', 'a', [[1, 2, 3, 4, 5]]), ('table', 'a', [[1, 2, 3, 4, 5]]),
                 ('freeq', [6, 7, 8, 9, 10, 11, 12, 13]), ('alloc', 'a', [[6]]),
                 ('table', 'a', [[1, 2, 3, 4, 5, 6]]), ('freeq', [7, 8, 9, 10, 11, 12, 13]),
                 ('alloc', 'a', [[]]), ('table', 'a', [[1, 2, 3, 4, 5, 6]]),
                 ('freeq', [7, 8, 9, 10, 11, 12, 13]),
                 ('freeq', [7, 8, 9, 10, 11, 12, 13, 6, 5, 4, 3, 2, 1])],
        }),
    'hybrid_full_mamba': Scenario(
        specs=(('f', 4), ('m', 4, 'align', 0)), num_blocks=20, caching=True,
        ops=[('req', 'a', 100, 14, ()), ('alloc', 'a', 14, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 14, [9]), ('alloc', 'a', 1, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 1, [10]), ('alloc', 'a', 1, 0, False), ('table', 'a'),
             ('freeq',), ('free', 'a'), ('freeq',), ('step',),
             ('req', 'b', 100, 14, (9, 10, 11, 12)), ('hit', 'b'), ('alloc', 'b', 2, 0, True),
             ('table', 'b'), ('freeq',)],
        expected={
            'vllm-0.33': [('alloc', 'a', [[1, 2, 3, 4], [0, 0, 0, 5]]),
                 ('table', 'a', [[1, 2, 3, 4], [0, 0, 0, 5]]),
                 ('freeq', [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
                 ('alloc', 'a', [[], []]), ('table', 'a', [[1, 2, 3, 4], [0, 0, 0, 5]]),
                 ('freeq', [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
                 ('alloc', 'a', [[], []]), ('table', 'a', [[1, 2, 3, 4], [0, 0, 0, 5]]),
                 ('freeq', [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
                 ('freeq', [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 4, 3, 2, 1, 5]),
                 ('hit', 'b', [[1, 2, 3, 4], [0, 0, 0, 5]], 16), ('alloc', 'b', [[6], [7]]),
                 ('table', 'b', [[1, 2, 3, 4, 6], [0, 0, 0, 5, 7]]),
                 ('freeq', [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19])],
        }),
    'hybrid_fixed_point': Scenario(
        specs=(('f', 4), ('m', 4, 'align', 0)), num_blocks=24, caching=True,
        ops=[('req', 'a', 100, 16, ()), ('alloc', 'a', 8, 0, False), ('adv', 'a', 8, []),
             ('alloc', 'a', 8, 0, False), ('table', 'a'), ('freeq',), ('adv', 'a', 8, [1]),
             ('free', 'a'), ('freeq',), ('step',), ('req', 'b', 100, 14, (7, 7, 7)),
             ('hit', 'b'), ('alloc', 'b', 9, 0, True), ('table', 'b'), ('freeq',)],
        expected={
            'vllm-0.33': [('alloc', 'a', [[1, 2], [0, 3]]), ('alloc', 'a', [[4, 5], [0, 6]]),
                 ('table', 'a', [[1, 2, 4, 5], [0, 3, 0, 6]]),
                 ('freeq', [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
                 ('freeq',
                  [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 5, 4, 2, 1,
                   6, 3]),
                 ('hit', 'b', [[1, 2], [0, 3]], 8), ('alloc', 'b', [[7, 8, 9], [0, 0, 10]]),
                 ('table', 'b', [[1, 2, 7, 8, 9], [0, 3, 0, 0, 10]]),
                 ('freeq', [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 5, 4, 6])],
        }),
    'hybrid_alignment': Scenario(
        specs=(('f', 8), ('m', 4, 'align', 0)), num_blocks=24, caching=True,
        ops=[('req', 'a', 100, 24, ()), ('alloc', 'a', 8, 0, False), ('adv', 'a', 8, []),
             ('alloc', 'a', 4, 0, False), ('adv', 'a', 4, []), ('alloc', 'a', 8, 0, False),
             ('table', 'a'), ('freeq',), ('adv', 'a', 8, []), ('free', 'a'), ('freeq',),
             ('step',), ('req', 'b', 100, 22, (7, 7, 7)), ('hit', 'b'),
             ('alloc', 'b', 9, 0, True), ('table', 'b'), ('freeq',)],
        expected={
            'vllm-0.33': [('alloc', 'a', [[1], [0, 2]]), ('alloc', 'a', [[3], [4]]),
                 ('alloc', 'a', [[5], [0, 6]]), ('table', 'a', [[1, 3, 5], [0, 0, 4, 0, 6]]),
                 ('freeq',
                  [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 2]),
                 ('freeq',
                  [6, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 2, 3,
                   1, 4]),
                 ('hit', 'b', [[1], [0, 2]], 8), ('alloc', 'b', [[6, 5], [0, 0, 7]]),
                 ('table', 'b', [[1, 6, 5], [0, 2, 0, 0, 7]]),
                 ('freeq',
                  [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 3, 4])],
        }),
    'hybrid_nocache': Scenario(
        specs=(('f', 4), ('m', 8, 'none', 1)), num_blocks=20, caching=False,
        ops=[('req', 'a', 100, 14, ()), ('alloc', 'a', 14, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 14, [9]), ('alloc', 'a', 1, 0, False), ('table', 'a'),
             ('freeq',), ('adv', 'a', 1, [10]), ('alloc', 'a', 1, 2, False), ('table', 'a'),
             ('freeq',), ('free', 'a'), ('freeq',)],
        expected={
            'vllm-0.33': [('alloc', 'a', [[1, 2, 3, 4], [5, 6, 7]]),
                 ('table', 'a', [[1, 2, 3, 4], [5, 6, 7]]),
                 ('freeq', [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
                 ('alloc', 'a', [[], []]), ('table', 'a', [[1, 2, 3, 4], [0, 6, 7]]),
                 ('freeq', [5, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
                 ('alloc', 'a', [[5], [8]]), ('table', 'a', [[1, 2, 3, 4, 5], [0, 6, 7, 8]]),
                 ('freeq', [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
                 ('freeq', [8, 7, 6, 5, 4, 3, 2, 1, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19])],
            'vllm-0.10': [('alloc', 'a', [[1, 2, 3, 4], [5, 6, 7]]),
                 ('table', 'a', [[1, 2, 3, 4], [5, 6, 7]]),
                 ('freeq', [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
                 ('alloc', 'a', [[], []]), ('table', 'a', [[1, 2, 3, 4], [5, 6, 7]]),
                 ('freeq', [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
                 ('alloc', 'a', [[8], [9]]), ('table', 'a', [[1, 2, 3, 4, 8], [5, 6, 7, 9]]),
                 ('freeq', [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
                 ('freeq', [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 8, 4, 3, 2, 1, 9, 7, 6, 5])],
        }),
    'align_events': Scenario(
        specs=(('f', 4), ('m', 4, 'align', 0)), num_blocks=24, caching=True, events=True,
        ops=[('req', 'a', 100, 16, ()), ('alloc', 'a', 8, 0, False), ('events',),
             ('adv', 'a', 8, []), ('alloc', 'a', 8, 0, False), ('events',), ('table', 'a'),
             ('adv', 'a', 8, [1, 2, 3, 4, 5]), ('alloc', 'a', 1, 0, False), ('events',),
             ('adv', 'a', 1, []), ('alloc', 'a', 1, 0, False), ('events',), ('table', 'a'),
             ('adv', 'a', 1, []), ('alloc', 'a', 1, 0, False), ('events',), ('table', 'a'),
             ('adv', 'a', 1, []), ('alloc', 'a', 1, 0, False), ('events',), ('table', 'a'),
             ('free', 'a'), ('freeq',), ('req', 'z', 300, 30, ()), ('alloc', 'z', 30, 0, False),
             ('events',), ('freeq',)],
        expected={
            'vllm-0.33': [('alloc', 'a', [[1, 2], [0, 3]]),
                 ('events',
                  [['BlockStored', 2, True, [100, 101, 102, 103, 104, 105, 106, 107], 4, 0],
                   ['BlockStored', 1, True, [100, 101, 102, 103, 104, 105, 106, 107], 4, 1]]),
                 ('alloc', 'a', [[4, 5], [0, 6]]),
                 ('events',
                  [['BlockStored', 2, False, [108, 109, 110, 111, 112, 113, 114, 115], 4, 0],
                   ['BlockStored', 1, False, [108, 109, 110, 111, 112, 113, 114, 115], 4, 1]]),
                 ('table', 'a', [[1, 2, 4, 5], [0, 3, 0, 6]]), ('alloc', 'a', [[7], [8]]),
                 ('events', []), ('alloc', 'a', [[], []]), ('events', []),
                 ('table', 'a', [[1, 2, 4, 5, 7], [0, 0, 0, 0, 8]]), ('alloc', 'a', [[], []]),
                 ('events', []), ('table', 'a', [[1, 2, 4, 5, 7], [0, 0, 0, 0, 8]]),
                 ('alloc', 'a', [[], []]),
                 ('events',
                  [['BlockStored', 1, False, [1, 2, 3, 4], 4, 0],
                   ['BlockStored', 1, False, [1, 2, 3, 4], 4, 1]]),
                 ('table', 'a', [[1, 2, 4, 5, 7], [0, 0, 0, 0, 8]]),
                 ('freeq',
                  [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 3, 6, 7, 5, 4, 2,
                   1, 8]),
                 ('alloc', 'z', [[9, 10, 11, 12, 13, 14, 15, 16], [0, 0, 0, 0, 0, 0, 0, 17]]),
                 ('events',
                  [['BlockStored', 7, True,
                    [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312, 313, 314,
                     315, 316, 317, 318, 319, 320, 321, 322, 323, 324, 325, 326, 327],
                    4, 0],
                   ['BlockStored', 0, True,
                    [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312, 313, 314,
                     315, 316, 317, 318, 319, 320, 321, 322, 323, 324, 325, 326, 327],
                    4, 1]]),
                 ('freeq', [18, 19, 20, 21, 22, 23, 3, 6, 7, 5, 4, 2, 1, 8])],
        }),
    'align_external': Scenario(
        specs=(('f', 4), ('m', 4, 'align', 1)), num_blocks=24, caching=True,
        ops=[('req', 'a', 100, 14, ()), ('ext', 'a', 4, 8), ('table', 'a'), ('freeq',),
             ('adv', 'a', 12, []), ('alloc', 'a', 2, 0, False), ('table', 'a'), ('freeq',),
             ('free', 'a'), ('freeq',)],
        expected={
            'vllm-0.33': [('ext', 'a', [[4], [5, 6]]), ('table', 'a', [[1, 2, 4], [0, 3, 5, 6]]),
                 ('freeq', [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]),
                 ('alloc', 'a', [[7], [8]]), ('table', 'a', [[1, 2, 4, 7], [0, 0, 5, 6, 8]]),
                 ('freeq', [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 3]),
                 ('freeq',
                  [8, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 3, 4, 2,
                   1, 5])],
        }),
    'none_external': Scenario(
        specs=(('m', 4, 'none', 0),), num_blocks=24, caching=False,
        ops=[('req', 'a', 100, 14, ()), ('ext', 'a', 4, 8), ('table', 'a'), ('freeq',),
             ('adv', 'a', 12, []), ('alloc', 'a', 2, 0, False), ('table', 'a'), ('freeq',),
             ('free', 'a'), ('freeq',)],
        expected={
            'vllm-0.33': [('ext', 'a', [[2]]), ('table', 'a', [[0, 1, 2]]),
                 ('freeq',
                  [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                   23]),
                 ('alloc', 'a', [[1]]), ('table', 'a', [[0, 0, 2, 1]]),
                 ('freeq',
                  [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                   23]),
                 ('freeq',
                  [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                   22, 23])],
        }),

}


def _spec(t: tuple[Any, ...]) -> KVCacheSpec:
    if t[0] == "f":
        return FullAttentionSpec(t[1])
    return MambaSpec(t[1], mamba_cache_mode=t[2], num_speculative_blocks=t[3])


def _ids(groups: Sequence[Sequence[KVCacheBlock]]) -> list[list[int]]:
    return [[b.block_id for b in g] for g in groups]


def _event(e: object) -> list[Any]:
    if isinstance(e, BlockStored):
        return ["BlockStored", len(e.block_hashes), e.parent_block_hash is None,
                list(e.token_ids), e.block_size, e.group_idx]
    if isinstance(e, BlockRemoved):
        return ["BlockRemoved", len(e.block_hashes), e.group_idx]
    return [type(e).__name__]


def _replay(sc: Scenario, profile: str) -> list[tuple[Any, ...]]:
    m = KVCacheManager(sc.num_blocks, kv_cache_specs=[_spec(t) for t in sc.specs],
                       enable_caching=sc.caching, profile=profile, pythonhashseed="0",
                       max_model_len=1000, enable_kv_cache_events=sc.events)
    reqs: dict[str, Request] = {}
    hits: dict[str, tuple[Any, int]] = {}
    adopted: dict[str, int] = {}
    out: list[tuple[Any, ...]] = []
    for op in sc.ops:
        kind, *args = op
        if kind == "req":
            rid, start, n, extra = args
            reqs[rid] = m.make_request(rid, [*range(start, start + n), *extra])
        elif kind == "hit":
            blocks, n = m.get_computed_blocks(reqs[args[0]])
            hits[args[0]] = (blocks, n)
            out.append(("hit", args[0], _ids(blocks), n))
        elif kind == "alloc":
            rid, new, lookahead, use_hits = args
            blocks, n = hits[rid] if use_hits else (None, 0)
            res = m.allocate_slots(reqs[rid], new, n, blocks, lookahead)
            out.append(("alloc", rid, None if res is None else _ids(res)))
            if res is not None and use_hits:
                adopted[rid] = n
            m.check_invariants()
        elif kind == "ext":  # external (KV-connector) tokens of a new request
            rid, new, external = args
            res = m.allocate_slots(reqs[rid], new, 0, None, 0, False, external)
            out.append(("ext", rid, None if res is None else _ids(res)))
            m.check_invariants()
        elif kind == "adv":
            rid, n, tokens = args
            reqs[rid].num_computed_tokens += n + adopted.pop(rid, 0)
            for t in tokens:
                reqs[rid].append_output_token_ids(t)
        elif kind == "table":
            out.append(("table", args[0], [list(g) for g in m.get_block_ids(args[0])]))
        elif kind == "freeq":
            out.append(("freeq", [b.block_id for b in m.block_pool.free_block_queue]))
        elif kind == "free":
            m.free(reqs[args[0]])
            m.check_invariants()
        elif kind == "events":  # hash values differ (NONE_HASH); their shape does not
            out.append(("events", [_event(e) for e in m.take_events()]))
        else:
            assert kind == "step", kind
            m.new_step_starts()
    return out


@pytest.mark.parametrize(("name", "profile"), [
    (name, profile) for name, sc in SCENARIOS.items() for profile in sc.expected])
def test_replay_matches_vllm(name: str, profile: str) -> None:
    sc = SCENARIOS[name]
    specs = sc.specs
    if profile == "vllm-0.10":  # 0.10.2's MambaSpec has no mode: its behaviour is "none"
        assert all(t[0] == "f" or t[2] == "none" for t in specs)
    got = _replay(sc, profile)
    expected = sc.expected[profile]
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, f"{name} ({profile}) answer {i}: got {g}, vLLM gave {e}"


def test_same_step_refusal_counts_more_than_the_pool() -> None:
    """A hit on a block cached in this step: vLLM 0.33's ``get_num_blocks_to_allocate``
    answers ``num_gpu_blocks + 1`` (12 + 1 recorded from its ``MambaManager``)."""
    m = KVCacheManager(12, kv_cache_specs=[MambaSpec(4, mamba_cache_mode="align")],
                       profile="vllm-0.33", pythonhashseed="0")
    a = m.make_request("a", range(100, 112))
    assert _ids(m.allocate_slots(a, 8) or ()) == [[0, 1]]
    b = m.make_request("b", range(100, 112))
    blocks, n = m.get_computed_blocks(b)
    assert (_ids(blocks), n) == ([[0, 1]], 8)
    coordinator = m.coordinator
    assert coordinator.get_num_blocks_to_allocate_main("b", 11, blocks, 8, 11, 8) == 13
    m.new_step_starts()
    # After the step: cdiv(11, 4) = 3 entries - 2 hits = 1 new block; the hit block is held.
    assert coordinator.get_num_blocks_to_allocate_main("b", 11, blocks, 8, 11, 8) == 1


def test_kind_name_is_vllms() -> None:
    assert get_kv_cache_spec_kind(MambaSpec(4)) == "mamba"  # KVCacheSpecKind.MAMBA


def test_new_step_starts_is_a_no_op_without_mamba() -> None:
    for profile in ("vllm-0.33", "vllm-0.10"):
        m = KVCacheManager(6, 2, profile=profile, pythonhashseed="0")
        req = m.make_request("a", range(4))
        assert _ids(m.allocate_slots(req, 4) or ()) == [[1, 2]]
        m.new_step_starts()
        assert m.get_block_ids("a") == ([1, 2],)
        assert m.get_computed_blocks(m.make_request("b", range(4)))[1] == 2


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"mamba_cache_mode": "all"}, "mamba_cache_mode must be one of"),
    ({"num_speculative_blocks": -1}, "num_speculative_blocks must be an int >= 0"),
    ({"num_speculative_blocks": True}, "num_speculative_blocks must be an int >= 0"),
    ({"num_prefill_checkpoint_blocks": -1}, "num_prefill_checkpoint_blocks must be an int >= 0"),
    ({"prefill_checkpoint_alignment": 0}, "prefill_checkpoint_alignment must be None or an int"),
    ({"prefill_checkpoint_alignment": True}, "checkpoint_alignment > 0"),
])
def test_bad_spec_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(KVCacheMisuseError, match=match):
        MambaSpec(4, **kwargs)


@pytest.mark.parametrize(("profile", "specs", "caching", "retention", "match"), [
    # vLLM 0.33 MambaManager asserts it (single_type_kv_cache_manager.py:1442-1444).
    ("vllm-0.33", (MambaSpec(4),), True, None, "requires mamba_cache_mode"),
    ("vllm-0.33", (FullAttentionSpec(4), MambaSpec(4)), True, None,
     "requires mamba_cache_mode"),
    # 0.10.2: gpu_model_runner raises NotImplementedError, config turns caching off.
    ("vllm-0.10", (MambaSpec(4),), True, None, "Prefix caching is not supported for Mamba"),
    ("vllm-0.10", (MambaSpec(4, mamba_cache_mode="align"),), False, None,
     "vLLM 0.33 MambaSpec field"),
    # 0.10.2's MambaSpec has no prefill checkpoint fields.
    ("vllm-0.10", (MambaSpec(4, num_prefill_checkpoint_blocks=1),), False, None,
     "num_prefill_checkpoint_blocks and prefill_checkpoint_alignment are vLLM 0.33"),
    ("vllm-0.10", (MambaSpec(4, prefill_checkpoint_alignment=1),), False, None,
     "vLLM 0.10.2's MambaSpec has neither"),
    # 0.33 _validate_prefix_cache_retention_interval: a Mamba group takes retention, but a
    # positive interval must be a multiple of the scheduler block (lcm 8 here).
    ("vllm-0.33", (FullAttentionSpec(4), MambaSpec(8, mamba_cache_mode="align")), True, 4,
     (r"prefix_cache_retention_interval \(4\) must be non-negative and a multiple of "
      r"scheduler_block_size \(8\)")),
    ("vllm-0.33", (FullAttentionSpec(4), CrossAttentionSpec(4), MambaSpec(4)), False, None,
     "beside a cross-attention group"),
])
def test_refused_layouts(profile: str, specs: tuple[KVCacheSpec, ...], caching: bool,
                         retention: int | None, match: str) -> None:
    with pytest.raises(KVCacheMisuseError, match=match):
        KVCacheManager(16, kv_cache_specs=specs, enable_caching=caching, profile=profile,
                       prefix_cache_retention_interval=retention, pythonhashseed="0")


def test_align_without_caching_is_modelled() -> None:
    """vLLM's config resets the mode to "none" with caching off, but its ``MambaManager``
    runs "align" without caching as well; the table is align's (recorded: ``[0, 0, 1]``)."""
    m = KVCacheManager(12, kv_cache_specs=[MambaSpec(4, mamba_cache_mode="align")],
                       enable_caching=False, profile="vllm-0.33", pythonhashseed="0")
    req = m.make_request("a", range(100, 110))
    assert _ids(m.allocate_slots(req, 10) or ()) == [[0, 0, 1]]
    m.check_invariants()
