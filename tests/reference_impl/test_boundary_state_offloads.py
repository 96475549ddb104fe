"""vLLM 0.33's boundary-state hand-offs for a KV connector in the reference
(``KVCacheManager.take_boundary_state_offloads`` and ``finalize_partial_tail_offloads``;
docs/semantics.md#boundary-state-hand-offs), replayed call by call against what vLLM 0.33.0's
own ``KVCacheManager`` answered.

How the expected values were obtained: a throwaway script outside the repository (not
committed: it imports vLLM, which the test command does not install) built vLLM 0.33.0's
``KVCacheManager`` with kvcheck's ``adapters/vllm_kv_config.make_vllm_cache`` for the same
groups (full attention ``("f", block_size)``, Mamba ``("m", block_size[,
num_speculative_blocks[, num_prefill_checkpoint_blocks, prefill_checkpoint_alignment]])`` in
mode "align"; prefix caching on, ``max_model_len`` uncapped),
hashed requests with sha256 and ``PYTHONHASHSEED=0`` through vLLM's
``get_request_block_hasher`` at the hash block (``adapters/vllm_requests``), and ran each
scenario's ops as vLLM's scheduler makes its calls: ``get_computed_blocks``,
``allocate_slots(req, new, hit_tokens, hit_blocks, num_lookahead_tokens)`` then
``num_computed_tokens += hit + new``, decode (append one output token, ``allocate_slots(req,
1)``), ``new_step_starts``, ``take_boundary_state_offloads()``,
``take_kv_cache_block_copies()`` followed by ``block_pool.free_blocks(retained)``,
``finalize_partial_tail_offloads(req)`` (its ``num_in_flight_tokens`` 0), ``free``, the
tables (``get_block_ids``) and every block's ``ref_cnt``. The printed answers are the literals
below; nothing here is computed by the reference.

What the scenarios show:

* ``mamba_alone`` (one Mamba group of 4): each state block ``cache_blocks`` keys is offered
  once, at ``(index + 1) * 4``; a chunk skips states (nulls), which are never offered; the
  drain empties the list;
* ``with_full_attention`` (full attention 4, Mamba 4): only the Mamba group offers; two
  requests' offers come keyed by request, in the order made; a hit's blocks are not offered
  again;
* ``freed_before_drain``: a request freed (finished or preempted) before the drain loses its
  offers, another request's stay;
* ``fine_grained_copy`` (full attention 4, Mamba 8: fine-grained hits): a's chunk ends at its
  prompt's last hash boundary (12) inside Mamba block 1: nothing offered then (the key is a
  partial one); its next allocation copies that state and offers the copy at 12, then the full
  block at 16; a new request's own copy-on-write of a hit is not offered;
* ``finalize_producer``: a producer finishing at its boundary hands its table block at 12;
  a second call answers nothing;
* ``finalize_past_boundary``: a producer that computed more than its boundary (a decode
  without its copy: the last step's answer was refused) hands nothing, and is consumed;
* ``producer_freed``: a producer freed before its copy: its tail is forgotten (no offer at
  its next life, nothing to finalize);
* ``speculative`` (Mamba 8 with one speculative block): the relocated speculative blocks are
  not offered; the copy is;
* ``prefill_checkpoint`` (Mamba 8 with one prefill checkpoint block, alignment 4): a 22-token
  chunk exports its checkpoint at 20 into the block at index 1, keyed at 20 and handed off
  at 20 (not at its index's ``(index + 1) * 8``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from manager_op_replay import build_033, replay_ops

from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec, MambaSpec
from kvcheck.reference_impl.kv_cache_interface import KVCacheSpec as GroupSpec

P14 = list(range(100, 114))
P10 = list(range(300, 310))


class Scenario(NamedTuple):
    """Groups (``("f", block_size)``, ``("m", block_size[, num_speculative_blocks[,
    num_prefill_checkpoint_blocks, prefill_checkpoint_alignment]])``; Mamba in mode
    "align"), pool size and the ops."""

    groups: list[tuple[Any, ...]]
    num_blocks: int
    ops: list[tuple[Any, ...]]


SCENARIOS: dict[str, Scenario] = {
    "mamba_alone": Scenario([("m", 4)], 12, [
        ("req", "a", P10), ("lookup", "a"), ("alloc", "a", 8), ("tables",), ("offloads",),
        ("offloads",), ("step",), ("alloc", "a", 2), ("tables",), ("offloads",), ("step",),
        ("decode", "a", 1), ("decode", "a", 2), ("tables",), ("offloads",), ("free", "a"),
        ("offloads",),
    ]),
    "with_full_attention": Scenario([("f", 4), ("m", 4)], 24, [
        ("req", "a", P10), ("lookup", "a"), ("alloc", "a", 6), ("req", "b", P14),
        ("lookup", "b"), ("alloc", "b", 12), ("tables",), ("offloads",), ("step",),
        ("alloc", "a", 4), ("alloc", "b", 2), ("offloads",), ("step",),
        ("req", "c", [*P14, 1, 2, 3]), ("lookup", "c"), ("alloc", "c", 5), ("tables",),
        ("offloads",), ("copies",), ("step",), ("decode", "c", 4), ("offloads",),
    ]),
    "freed_before_drain": Scenario([("f", 4), ("m", 4)], 24, [
        ("req", "a", P10), ("req", "b", P14), ("lookup", "a"), ("alloc", "a", 8),
        ("lookup", "b"), ("alloc", "b", 8), ("free", "a"), ("offloads",), ("step",),
        ("req", "a", P10), ("lookup", "a"), ("alloc", "a", 10), ("tables",), ("free", "b"),
        ("offloads",),
    ]),
    "fine_grained_copy": Scenario([("f", 4), ("m", 8)], 16, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12), ("tables",), ("offloads",),
        ("step",), ("alloc", "a", 2), ("tables",), ("offloads",), ("copies",), ("refs",),
        ("step",), ("decode", "a", 1), ("decode", "a", 2), ("offloads",),
        ("req", "b", [*P14, 7, 8, 9]), ("lookup", "b"), ("alloc", "b", 5), ("tables",),
        ("offloads",), ("copies",), ("step",), ("decode", "b", 3), ("offloads",),
    ]),
    "finalize_producer": Scenario([("f", 4), ("m", 8)], 16, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12), ("offloads",),
        ("finalize", "a"), ("finalize", "a"), ("tables",), ("free", "a"), ("offloads",),
        ("copies",),
    ]),
    "finalize_past_boundary": Scenario([("f", 4), ("m", 8)], 16, [
        ("req", "a", P14), ("req", "b", P14), ("lookup", "a"), ("alloc", "a", 12),
        ("step",), ("lookup", "b"), ("alloc", "b", 13), ("finalize", "b"), ("finalize", "a"),
        ("offloads",), ("copies",), ("step",), ("alloc", "a", 2), ("offloads",), ("copies",),
    ]),
    "producer_freed": Scenario([("f", 4), ("m", 8)], 16, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12), ("step",), ("free", "a"),
        ("offloads",), ("copies",), ("step",),
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 2), ("tables",), ("offloads",),
        ("copies",), ("finalize", "a"),
    ]),
    "speculative": Scenario([("f", 4), ("m", 8, 1)], 24, [
        ("req", "a", P14), ("lookup", "a"), ("alloc", "a", 12, 2), ("tables",),
        ("offloads",), ("step",), ("alloc", "a", 2, 2), ("tables",), ("offloads",),
        ("copies",), ("step",), ("decode", "a", 5), ("decode", "a", 6), ("tables",),
        ("offloads",),
    ]),
    "prefill_checkpoint": Scenario([("f", 4), ("m", 8, 0, 1, 4)], 24, [
        ("req", "a", list(range(200, 222))), ("lookup", "a"), ("alloc", "a", 22),
        ("tables",), ("offloads",), ("step",), ("decode", "a", 1), ("decode", "a", 2),
        ("tables",), ("offloads",), ("copies",),
    ]),
}

#: What vLLM 0.33.0 answered, one row per observing op.
RECORDED: dict[str, list[tuple[Any, ...]]] = {
    'mamba_alone': [
        ('lookup', 'a', [[]], 0),
        ('alloc', 'a', [[0, 1]]),
        ('tables', {'a': [[0, 1]]}),
        ('offloads', {'a': [(0, 1, 8)]}),
        ('offloads', {}),
        ('alloc', 'a', [[2]]),
        ('tables', {'a': [[0, 1, 2]]}),
        ('offloads', {}),
        ('decode', 'a', [[]]),
        ('decode', 'a', [[]]),
        ('tables', {'a': [[0, 0, 2]]}),
        ('offloads', {'a': [(0, 2, 12)]}),
        ('offloads', {}),
    ],
    'with_full_attention': [
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2], [0, 3]]),
        ('lookup', 'b', [[], []], 0),
        ('alloc', 'b', [[4, 5, 6], [0, 0, 7]]),
        ('tables', {'a': [[1, 2], [0, 3]], 'b': [[4, 5, 6], [0, 0, 7]]}),
        ('offloads', {'b': [(1, 7, 12)]}),
        ('alloc', 'a', [[8], [9]]),
        ('alloc', 'b', [[10], [11]]),
        ('offloads', {'a': [(1, 3, 8)]}),
        ('lookup', 'c', [[4, 5, 6], [0, 0, 7]], 12),
        ('alloc', 'c', [[12, 13], [0, 14]]),
        ('tables',
         {'a': [[1, 2, 8], [0, 3, 9]],
          'b': [[4, 5, 6, 10], [0, 0, 7, 11]],
          'c': [[4, 5, 6, 12, 13], [0, 0, 7, 0, 14]]}),
        ('offloads', {}),
        ('copies', [], []),
        ('decode', 'c', [[], []]),
        ('offloads', {}),
    ],
    'freed_before_drain': [
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2], [0, 3]]),
        ('lookup', 'b', [[], []], 0),
        ('alloc', 'b', [[4, 5], [0, 6]]),
        ('offloads', {'b': [(1, 6, 8)]}),
        ('lookup', 'a', [[1, 2], [0, 3]], 8),
        ('alloc', 'a', [[7, 8, 9], [0, 0, 10]]),
        ('tables', {'b': [[4, 5], [0, 6]], 'a': [[1, 2, 7, 8, 9], [0, 3, 0, 0, 10]]}),
        ('offloads', {}),
    ],
    'fine_grained_copy': [
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('tables', {'a': [[1, 2, 3], [0, 4]]}),
        ('offloads', {}),
        ('alloc', 'a', [[5], []]),
        ('tables', {'a': [[1, 2, 3, 5], [0, 4]]}),
        ('offloads', {'a': [(1, 6, 12)]}),
        ('copies', [(4, 6)], [4, 6]),
        ('refs', [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        ('decode', 'a', [[], []]),
        ('decode', 'a', [[], []]),
        ('offloads', {'a': [(1, 4, 16)]}),
        ('lookup', 'b', [[1, 2, 3], [0, 6]], 12),
        ('alloc', 'b', [[7, 8], [9, 10]]),
        ('tables', {'a': [[1, 2, 3, 5], [0, 4]], 'b': [[1, 2, 3, 7, 8], [0, 9, 10]]}),
        ('offloads', {'b': [(1, 9, 16)]}),
        ('copies', [(6, 9)], [6, 9]),
        ('decode', 'b', [[], []]),
        ('offloads', {}),
    ],
    'finalize_producer': [
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('offloads', {}),
        ('finalize', 'a', [(1, 4, 12)]),
        ('finalize', 'a', []),
        ('tables', {'a': [[1, 2, 3], [0, 4]]}),
        ('offloads', {}),
        ('copies', [], []),
    ],
    'finalize_past_boundary': [
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('lookup', 'b', [[1, 2, 3], [0, 4]], 12),
        ('alloc', 'b', [[5, 6, 7, 8], [9, 0, 10]]),
        ('finalize', 'b', []),
        ('finalize', 'a', [(1, 4, 12)]),
        ('offloads', {}),
        ('copies', [(4, 9)], [4, 9]),
        ('alloc', 'a', [[11], []]),
        ('offloads', {}),
        ('copies', [(4, 12)], [4, 12]),
    ],
    'producer_freed': [
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3], [0, 4]]),
        ('offloads', {}),
        ('copies', [], []),
        ('lookup', 'a', [[1, 2, 3], [0, 4]], 12),
        ('alloc', 'a', [[5], [6]]),
        ('tables', {'a': [[1, 2, 3, 5], [0, 6]]}),
        ('offloads', {}),
        ('copies', [(4, 6)], [4, 6]),
        ('finalize', 'a', []),
    ],
    'speculative': [
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3, 4], [0, 5, 6]]),
        ('tables', {'a': [[1, 2, 3, 4], [0, 5, 6]]}),
        ('offloads', {}),
        ('alloc', 'a', [[], []]),
        ('tables', {'a': [[1, 2, 3, 4], [0, 5, 6]]}),
        ('offloads', {'a': [(1, 7, 12)]}),
        ('copies', [(5, 7)], [5, 7]),
        ('decode', 'a', [[], []]),
        ('decode', 'a', [[], []]),
        ('tables', {'a': [[1, 2, 3, 4], [0, 5, 6]]}),
        ('offloads', {'a': [(1, 5, 16)]}),
    ],
    'prefill_checkpoint': [
        ('lookup', 'a', [[], []], 0),
        ('alloc', 'a', [[1, 2, 3, 4, 5, 6], [0, 7, 8]]),
        ('tables', {'a': [[1, 2, 3, 4, 5, 6], [0, 7, 8]]}),
        ('offloads', {'a': [(1, 7, 20)]}),
        ('decode', 'a', [[], []]),
        ('decode', 'a', [[], []]),
        ('tables', {'a': [[1, 2, 3, 4, 5, 6], [0, 0, 8]]}),
        ('offloads', {'a': [(1, 8, 24)]}),
        ('copies', [], []),
    ],
}


def _specs(groups: list[tuple[Any, ...]]) -> list[GroupSpec]:
    return [FullAttentionSpec(g[1]) if g[0] == "f"
            else MambaSpec(g[1], "align", *g[2:]) for g in groups]


def _replay(s: Scenario) -> list[tuple[Any, ...]]:
    """The scenario's ops on the reference's ``KVCacheManager``, answered as the recorder
    printed vLLM's answers."""
    return replay_ops(build_033(s.num_blocks, _specs(s.groups)), s.ops)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_matches_vllm(name: str) -> None:
    got = _replay(SCENARIOS[name])
    want = RECORDED[name]
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        assert g == w, f"{name}: answer {i} ({w[0]}) differs from vLLM 0.33.0's"
    assert len(got) == len(want)
