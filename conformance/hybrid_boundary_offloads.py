"""Golden scenarios of the boundary-state hand-offs (capability ``boundary_state_offloads``,
vLLM 0.33; docs/semantics.md#boundary-state-hand-offs).

A Mamba "align" group hands each state block ``cache_blocks`` keys to a KV connector at its
exact boundary (``(index + 1) * block_size``; the skipped states are nulls, never handed off),
and with fine-grained hits the copy-on-write copy of a running request's own partial tail (the
prompt's last hash boundary inside a block) in the step that makes the copy; a request freed
exactly at that boundary hands off its own table block instead
(``finalize_partial_tail_offloads``). Full attention hands nothing off; a request's own
copy-on-write of a hit is not handed off. The driver drains them where vLLM's ``schedule()``
does (``kvcheck.conformance.boundary_offloads``).

``answers`` are what vLLM's own ``KVCacheManager`` answered to each op, replayed through
kvcheck's vLLM adapter (``Driver(load_impl("vllm"), spec)`` on vLLM 0.33.0) and copied here as
literals: each op's ``StepResult`` (hits and new block ids per group, 0 the null block),
``offloads`` every non-empty drain of ``take_boundary_state_offloads()`` in order, ``tails``
every non-empty ``finalize_partial_tail_offloads`` answer with its request, ``copies`` every
``(src, dst)`` copy drained. vLLM 0.10.2 has no Mamba prefix caching: no table there.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.conformance.ops import Op, StepResult, add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["MISSING_010", "OFFLOAD_SCENARIOS", "OffloadScenario"]

#: Why vLLM 0.10.2 has no table.
MISSING_010 = ("vLLM 0.10.2 has no Mamba prefix caching (no mamba_cache_mode 'align'), so no "
               "boundary-state hand-offs")

_Entry = tuple[int, int, int]


@dataclass(frozen=True)
class OffloadScenario:
    """``ops`` on a pool of ``num_blocks`` blocks (null block included) in ``groups`` (the
    spec's ``block_size`` is 4, prefix caching on); vLLM 0.33's answer to each op, the
    hand-offs drained, the partial tails finalized and the copies drained."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    ops: tuple[Op, ...]
    answers: tuple[StepResult, ...]
    offloads: tuple[dict[str, list[_Entry]], ...]
    tails: tuple[tuple[str, list[_Entry]], ...]
    copies: tuple[tuple[int, int], ...]


def _align(block_size: int) -> KVCacheGroupSpec:
    return KVCacheGroupSpec("mamba", block_size, mamba_cache_mode="align")


_FULL4 = KVCacheGroupSpec("full_attention", 4)
_P10 = tuple(range(300, 310))
_P14 = tuple(range(100, 114))
_P22 = tuple(range(200, 222))

#: The scenarios before their answers: (name, why, groups, num_blocks, ops).
_SCENARIOS = (
    ("mamba_alone_states",
     ("one Mamba group of 4: each state block keyed is handed off once, at (index + 1) * 4; "
     "a chunk's skipped states are nulls, never handed off"),
     (_align(4),), 12,
     (add("a", _P10), schedule("a", 8), schedule("a"), decode("a"), decode("a"), free("a"))),
    ("only_mamba_hands_off",
     ("full attention beside Mamba at 4: only the Mamba group hands off, request by request "
     "in the order made; a hit's blocks are not handed off again"),
     (_FULL4, _align(4)), 24,
     (add("a", _P10), add("b", _P14), schedule("a", 6), schedule("b", 12), schedule("a"),
      schedule("b"), add("c", (*_P14, 1, 2, 3)), schedule("c"), decode("c"), free("a"),
      free("b"), free("c"))),
    ("producer_copy_handed_off",
     ("Mamba at 8 beside full attention at 4 (fine-grained hits): a's prompt tail state at 12 "
     "is keyed inside its block, copied in its next step and that copy handed off at 12, "
     "then the full block at 16; b's own copy-on-write of its hit is not handed off"),
     (_FULL4, _align(8)), 16,
     (add("a", _P14), schedule("a", 12), schedule("a"), decode("a"), decode("a"),
      add("b", (*_P14, 7, 8, 9)), schedule("b"), decode("b"), free("a"), free("b"))),
    ("producer_finishes_at_boundary",
     ("a request freed right at its prompt tail boundary (12) hands off its own table block "
     "(the driver plays a KV producer); a request hitting that state in the same step is "
     "refused (keyed in this step), then served in the next with its own copy-on-write, "
     "which is not handed off"),
     (_FULL4, _align(8)), 16,
     (add("a", _P14), schedule("a", 12), free("a"), add("b", (*_P14, 7, 8, 9)),
      schedule("b"), decode("b"), free("b"))),
    ("preempted_in_step_drops_its_hand_offs",
     ("a preempted inside the step (free with preempt: before the step's drain, no tail "
     "finalized) loses the hand-off its chunk made in that step; b's, made in the same step, "
     "is drained with the next step"),
     (_align(4),), 12,
     (add("a", _P10), add("b", _P14), schedule("a", 8), schedule("b", 8),
      free("a", preempt=True), schedule("b"), decode("b"), free("b"))),
    ("preempted_producer_drops_its_tail",
     ("Mamba at 8 beside full attention at 4: a, preempted in the step that keyed its prompt "
     "tail at 12 inside a block, hands neither the tail's copy nor the tail off, then or "
     "when it is admitted again and finishes"),
     (_FULL4, _align(8)), 16,
     (add("a", _P14), schedule("a", 12), free("a", preempt=True), add("b", _P10),
      schedule("b"), schedule("a", 12), decode("b"), free("a"), free("b"))),
    ("two_mamba_groups",
     ("Mamba at 8 and 12 beside full attention at 4: both groups key the prompt tail at 20 "
     "inside a block, and hand off their copies group by group in the next step"),
     (_FULL4, _align(8), _align(12)), 32,
     (add("a", _P22), schedule("a", 20), schedule("a"), decode("a"), decode("a"),
      free("a"))),
)

#: What vLLM 0.33.0 answered through kvcheck's adapter and driver, per scenario: (answers,
#: hand-offs drained, tails finalized, copies drained).
_RECORDED: dict[str, tuple[tuple[StepResult, ...], tuple[dict[str, list[_Entry]], ...],
                           tuple[tuple[str, list[_Entry]], ...],
                           tuple[tuple[int, int], ...]]] = {
    'mamba_alone_states': (
        ({},
         {'hits': ([[]], 0), 'new': [[0, 1]]},
         {'new': [[2]]},
         {'new': [[]]},
         {'new': [[]]},
         {}),
        ({'a': [(0, 1, 8)]}, {'a': [(0, 2, 12)]}),
        (),
        ()),
    'only_mamba_hands_off': (
        ({},
         {},
         {'hits': ([[], []], 0), 'new': [[1, 2], [0, 3]]},
         {'hits': ([[], []], 0), 'new': [[4, 5, 6], [0, 0, 7]]},
         {'new': [[8], [9]]},
         {'new': [[10], [11]]},
         {},
         {'hits': ([[4, 5, 6], [0, 0, 7]], 12), 'new': [[12, 13], [0, 14]]},
         {'new': [[], []]},
         {},
         {},
         {}),
        ({'b': [(1, 7, 12)]}, {'a': [(1, 3, 8)]}),
        (),
        ()),
    'producer_copy_handed_off': (
        ({},
         {'hits': ([[], []], 0), 'new': [[1, 2, 3], [0, 4]]},
         {'new': [[5], []]},
         {'new': [[], []]},
         {'new': [[], []]},
         {},
         {'hits': ([[1, 2, 3], [0, 6]], 12), 'new': [[7, 8], [9, 10]]},
         {'new': [[], []]},
         {},
         {}),
        ({'a': [(1, 6, 12)]}, {'a': [(1, 4, 16)]}, {'b': [(1, 9, 16)]}),
        (),
        ((4, 6), (6, 9))),
    'producer_finishes_at_boundary': (
        ({},
         {'hits': ([[], []], 0), 'new': [[1, 2, 3], [0, 4]]},
         {},
         {},
         {'hits': ([[1, 2, 3], [0, 4]], 12), 'new': None},
         {'hits': ([[1, 2, 3], [0, 4]], 12), 'new': [[5], [6]]},
         {}),
        (),
        (('a', [(1, 4, 12)]),),
        ((4, 6),)),
    'preempted_in_step_drops_its_hand_offs': (
        ({},
         {},
         {'hits': ([[]], 0), 'new': [[0, 1]]},
         {'hits': ([[]], 0), 'new': [[0, 2]]},
         {},
         {'new': [[0, 3]]},
         {'new': [[]]},
         {}),
        ({'b': [(0, 2, 8)]},),
        (),
        ()),
    'preempted_producer_drops_its_tail': (
        ({},
         {'hits': ([[], []], 0), 'new': [[1, 2, 3], [0, 4]]},
         {},
         {},
         {'hits': ([[], []], 0), 'new': [[5, 6, 7], [0, 8]]},
         {'hits': ([[1, 2, 3], [0, 4]], 12), 'new': [[9], [10]]},
         {'new': [[], []]},
         {},
         {}),
        (),
        (),
        ((4, 10),)),
    'two_mamba_groups': (
        ({},
         {'hits': ([[], [], []], 0), 'new': [[1, 2, 3, 4, 5], [0, 0, 6], [0, 7]]},
         {'new': [[8], [], []]},
         {'new': [[], [], []]},
         {'new': [[], [], []]},
         {}),
        ({'a': [(1, 9, 20), (2, 10, 20)]}, {'a': [(1, 6, 24), (2, 7, 24)]}),
        (),
        ((6, 9), (7, 10))),
}

OFFLOAD_SCENARIOS = tuple(
    OffloadScenario(name, why, groups, num_blocks, ops, *_RECORDED[name])
    for name, why, groups, num_blocks, ops in _SCENARIOS)
