"""vLLM 0.33's asynchronous scheduling in the KV-cache manager (capability
``async_scheduling``; docs/semantics.md#asynchronous-scheduling): scenarios whose answers were
recorded from vLLM 0.33.0's own ``KVCacheManager``, replayed by the suite
(``conformance/test_async_scheduling.py``).

With async scheduling vLLM's scheduler schedules a request's next step before the output of
its previous one is processed: ``num_computed_tokens`` counts the in-flight tokens
optimistically and ``Request.num_in_flight_tokens`` counts them. ``allocate_slots`` frees
the blocks a sliding window, a finished chunk or a Mamba group skips at ``max(0,
total_computed - num_in_flight_tokens)`` tokens (``kv_cache_manager.py:555-570``: an
in-flight step's attention still reads below the optimistic count), and a finishing KV
producer's partial tail is finalized only when no token is in flight
(``finalize_partial_tail_offloads``, ``single_type_kv_cache_manager.py:1940-1950``).

How the answers were obtained: each scenario's ops ran through kvcheck's vLLM adapter and
driver (``Driver(load_impl("vllm"), spec)``, vLLM 0.33.0, CPU install, ``PYTHONHASHSEED=0``)
in a throwaway script outside the repository (it imports vLLM, which the test command does
not install); the adapter sets ``Request.num_in_flight_tokens`` on vLLM's request for the
call. ``answers`` are each op's ``StepResult`` (hits and new block ids per group, 0 the null
block) with the request's block tables after it (None once freed); ``tails`` every
non-empty ``finalize_partial_tail_offloads`` answer. Nothing here is computed by the
reference. Every ``*_sync`` scenario is its neighbour without tokens in flight: where their
tables differ, the synchronous rule would have freed a block an in-flight step reads.

vLLM 0.10.2 has no asynchronous-scheduling count in its KV-cache manager: no table there.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.conformance.ops import Op, StepResult, add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["ASYNC_SCENARIOS", "MISSING_010", "SCENARIOS_RAW", "AsyncScenario"]

#: Why vLLM 0.10.2 has no table.
MISSING_010 = ("vLLM 0.10.2's KV-cache manager reads no in-flight count (vLLM 0.33's "
               "asynchronous scheduling added Request.num_in_flight_tokens)")

_Tables = list[list[int]] | None


@dataclass(frozen=True)
class AsyncScenario:
    """``ops`` on a pool of ``num_blocks`` blocks (null block included) in ``groups`` (the
    spec's ``block_size`` is 4, prefix caching on); vLLM 0.33's answer to each op with the
    op's request's block tables after it, and the partial tails finalized."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    ops: tuple[Op, ...]
    answers: tuple[tuple[StepResult, _Tables], ...]
    tails: tuple[tuple[str, list[tuple[int, int, int]]], ...]


#: ``schedule`` / ``decode``'s ``allocate_slots`` keyword arguments.
_Gates = dict[str, bool | int | list[int]]


def _in_flight(k: int) -> _Gates:
    return {"num_in_flight_tokens": k}


_FULL4 = KVCacheGroupSpec("full_attention", 4)
_SW8 = KVCacheGroupSpec("sliding_window", 4, sliding_window=8)
_CHUNK8 = KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=8)
_ALIGN4 = KVCacheGroupSpec("mamba", 4, mamba_cache_mode="align")
_ALIGN8 = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")
_P24 = tuple(range(500, 524))
_P14 = tuple(range(100, 114))


def _window_ops(in_flight: bool) -> tuple[Op, ...]:
    """A 24-token prompt in chunks of 8 then two decodes, each step with the previous one's
    tokens in flight (``in_flight``) or none."""
    def k(n: int) -> _Gates | None:
        return _in_flight(n) if in_flight else None
    return (add("a", _P24), schedule("a", 8), schedule("a", 8, gates=k(8)),
            schedule("a", 8, gates=k(8)), decode("a", gates=k(8)), decode("a", gates=k(1)),
            free("a"))


def _mamba_ops(in_flight: bool) -> tuple[Op, ...]:
    def k(n: int) -> _Gates | None:
        return _in_flight(n) if in_flight else None
    return (add("a", _P24), schedule("a", 8), schedule("a", 4, gates=k(8)),
            schedule("a", 8, gates=k(4)), decode("a", gates=k(8)), free("a"))


#: The scenarios before their answers: name -> (why, groups, num_blocks, ops).
SCENARIOS_RAW: dict[str, tuple[str, tuple[KVCacheGroupSpec, ...], int, tuple[Op, ...]]] = {
    "window_in_flight": (
        ("a sliding window of 8 beside full attention: with the previous chunk's 8 tokens in "
         "flight, the blocks below the window are freed at computed - 8 tokens (the third "
         "step frees none, the sync rule two)"),
        (_FULL4, _SW8), 24, _window_ops(True)),
    "window_sync": (
        "window_in_flight without tokens in flight: the window frees at the computed count",
        (_FULL4, _SW8), 24, _window_ops(False)),
    "chunked_local_in_flight": (
        ("chunks of 8 beside full attention: a finished chunk's blocks are freed only once "
         "the processed tokens leave it"),
        (_FULL4, _CHUNK8), 24, _window_ops(True)),
    "chunked_local_sync": (
        "chunked_local_in_flight without tokens in flight",
        (_FULL4, _CHUNK8), 24, _window_ops(False)),
    "mamba_align_in_flight": (
        ("a Mamba 'align' group of 4 beside full attention: the state block before the "
         "processed tokens' is kept while a step is in flight"),
        (_FULL4, _ALIGN4), 24, _mamba_ops(True)),
    "mamba_align_sync": (
        "mamba_align_in_flight without tokens in flight",
        (_FULL4, _ALIGN4), 24, _mamba_ops(False)),
    "producer_tail_in_flight": (
        ("a KV producer freed right at its prompt tail boundary (12) while its 12 tokens are "
         "in flight: no partial tail is finalized (consumed all the same)"),
        (_FULL4, _ALIGN8), 16,
        (add("a", _P14), schedule("a", 12), free("a", in_flight=12),
         add("b", (*_P14, 7, 8, 9)), schedule("b"), decode("b"), free("b"))),
}

#: What vLLM 0.33.0 answered through kvcheck's adapter and driver, per scenario: (each op's
#: answer with its request's tables after it, tails finalized).
_RECORDED: dict[str, tuple[tuple[tuple[StepResult, _Tables], ...],
                           tuple[tuple[str, list[tuple[int, int, int]]], ...]]] = {
    'window_in_flight': (
        ((({}, None),
          ({'hits': ([[], []], 0), 'new': [[1, 2], [3, 4]]}, [[1, 2], [3, 4]]),
          ({'new': [[5, 6], [7, 8]]}, [[1, 2, 5, 6], [3, 4, 7, 8]]),
          ({'new': [[9, 10], [11, 12]]}, [[1, 2, 5, 6, 9, 10], [3, 4, 7, 8, 11, 12]]),
          ({'new': [[13], [14]]}, [[1, 2, 5, 6, 9, 10, 13], [0, 0, 7, 8, 11, 12, 14]]),
          ({'new': [[], []]}, [[1, 2, 5, 6, 9, 10, 13], [0, 0, 0, 0, 11, 12, 14]]),
          ({}, None)),
         ())),
    'window_sync': (
        ((({}, None),
          ({'hits': ([[], []], 0), 'new': [[1, 2], [3, 4]]}, [[1, 2], [3, 4]]),
          ({'new': [[5, 6], [7, 8]]}, [[1, 2, 5, 6], [3, 4, 7, 8]]),
          ({'new': [[9, 10], [11, 12]]}, [[1, 2, 5, 6, 9, 10], [0, 0, 7, 8, 11, 12]]),
          ({'new': [[13], [14]]}, [[1, 2, 5, 6, 9, 10, 13], [0, 0, 0, 0, 11, 12, 14]]),
          ({'new': [[], []]}, [[1, 2, 5, 6, 9, 10, 13], [0, 0, 0, 0, 11, 12, 14]]),
          ({}, None)),
         ())),
    'chunked_local_in_flight': (
        ((({}, None),
          ({'hits': ([[], []], 0), 'new': [[1, 2], [3, 4]]}, [[1, 2], [3, 4]]),
          ({'new': [[5, 6], [7, 8]]}, [[1, 2, 5, 6], [3, 4, 7, 8]]),
          ({'new': [[9, 10], [11, 12]]}, [[1, 2, 5, 6, 9, 10], [0, 0, 7, 8, 11, 12]]),
          ({'new': [[13], [14]]}, [[1, 2, 5, 6, 9, 10, 13], [0, 0, 0, 0, 11, 12, 14]]),
          ({'new': [[], []]}, [[1, 2, 5, 6, 9, 10, 13], [0, 0, 0, 0, 0, 0, 14]]),
          ({}, None)),
         ())),
    'chunked_local_sync': (
        ((({}, None),
          ({'hits': ([[], []], 0), 'new': [[1, 2], [3, 4]]}, [[1, 2], [3, 4]]),
          ({'new': [[5, 6], [7, 8]]}, [[1, 2, 5, 6], [0, 0, 7, 8]]),
          ({'new': [[9, 10], [11, 12]]}, [[1, 2, 5, 6, 9, 10], [0, 0, 0, 0, 11, 12]]),
          ({'new': [[13], [14]]}, [[1, 2, 5, 6, 9, 10, 13], [0, 0, 0, 0, 0, 0, 14]]),
          ({'new': [[], []]}, [[1, 2, 5, 6, 9, 10, 13], [0, 0, 0, 0, 0, 0, 14]]),
          ({}, None)),
         ())),
    'mamba_align_in_flight': (
        ((({}, None),
          ({'hits': ([[], []], 0), 'new': [[1, 2], [0, 3]]}, [[1, 2], [0, 3]]),
          ({'new': [[4], [5]]}, [[1, 2, 4], [0, 3, 5]]),
          ({'new': [[6, 7], [0, 8]]}, [[1, 2, 4, 6, 7], [0, 3, 5, 0, 8]]),
          ({'new': [[9], [10]]}, [[1, 2, 4, 6, 7, 9], [0, 0, 5, 0, 8, 10]]),
          ({}, None)),
         ())),
    'mamba_align_sync': (
        ((({}, None),
          ({'hits': ([[], []], 0), 'new': [[1, 2], [0, 3]]}, [[1, 2], [0, 3]]),
          ({'new': [[4], [5]]}, [[1, 2, 4], [0, 3, 5]]),
          ({'new': [[6, 7], [0, 8]]}, [[1, 2, 4, 6, 7], [0, 0, 5, 0, 8]]),
          ({'new': [[9], [10]]}, [[1, 2, 4, 6, 7, 9], [0, 0, 0, 0, 8, 10]]),
          ({}, None)),
         ())),
    'producer_tail_in_flight': (
        ((({}, None),
          ({'hits': ([[], []], 0), 'new': [[1, 2, 3], [0, 4]]}, [[1, 2, 3], [0, 4]]),
          ({}, None),
          ({}, None),
          ({'hits': ([[1, 2, 3], [0, 4]], 12), 'new': None}, None),
          ({'hits': ([[1, 2, 3], [0, 4]], 12), 'new': [[5], [6]]}, [[1, 2, 3, 5], [0, 6]]),
          ({}, None)),
         ())),
}

ASYNC_SCENARIOS = tuple(
    AsyncScenario(name, why, groups, num_blocks, ops, *_RECORDED[name])
    for name, (why, groups, num_blocks, ops) in SCENARIOS_RAW.items())
