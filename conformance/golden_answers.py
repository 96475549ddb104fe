"""The checks a recorded golden scenario makes after replaying its ops on a ``Pair``: each op's
answer as vLLM's own ``KVCacheManager`` gave it (and, where recorded, the free block count
after it), and the free queue after the last op; and, before it, the skip of an
implementation that does not declare what the scenario needs (``skip_unless_declared``).

Shared by the feature areas whose scenarios were recorded op by op from vLLM 0.33.0
(``test_eagle``, ``test_prefill_lookahead``, ``test_shared_prefix_checkpoint``,
``test_hash_lookahead``), so that a failure reads the same in each: the scenario, the op, both
answers and the implementation's runnable repro (``Pair.impl.snippet()``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvcheck.conformance.differential import Pair
    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.conformance.ops import Op

__all__ = ["ANSWER_FORMAT", "assert_answers", "assert_free_queue", "skip_unless_declared"]

#: How an answer reads, said after each mismatch.
ANSWER_FORMAT = "hits and new block ids per group, 0 the null block; new None: refused"


def skip_unless_declared(impl: ImplHandle, needs: Iterable[str], *,
                         capabilities: Collection[str] | None = None) -> None:
    """Skip the calling test unless ``impl`` declares every capability in ``needs``, naming
    the missing ones (sorted). ``capabilities``: what to look them up in, when not the
    declared ones (``ImplInfo.capabilities``), e.g. a profile's ``effective_capabilities``."""
    __tracebackhide__ = True  # a skip report names the test's line, not this one
    have = impl.info.capabilities if capabilities is None else capabilities
    missing = sorted({c for c in needs if c not in have})
    if missing:
        pytest.skip(f"{impl.name} does not declare capability "
                    f"{', '.join(repr(c) for c in missing)} (IMPL_INFO.capabilities)")


def assert_answers(pair: Pair, where: str, ops: Sequence[Op], answers: Sequence[object],
                   num_free: Sequence[int] | None = None, *, source: str = "vLLM") -> None:
    """Apply ``ops`` in order; each answer must equal ``answers[i]`` and, when ``num_free`` is
    given, ``num_free_blocks()`` right after it must equal ``num_free[i]``.

    Args:
        pair: the implementation (and oracle) under test, on the scenario's spec.
        where: the scenario named in a failure, e.g. ``"name (why)"``.
        source: who gave the recorded answers, e.g. ``"vLLM 0.33.0"``.
    """
    __tracebackhide__ = True
    frees: Sequence[int | None] = num_free if num_free is not None else [None] * len(ops)
    for i, (op, want, free) in enumerate(zip(ops, answers, frees, strict=True)):
        got = pair.apply(op)
        assert got == want, (f"{where}, op #{i + 1} {op}: answered {got}, {source} {want} "
                             f"({ANSWER_FORMAT})\n" + pair.impl.snippet())
        if free is not None:
            now = pair.impl.manager.num_free_blocks()
            assert now == free, (f"{where}, after op #{i + 1} {op}: num_free_blocks() {now}, "
                                 f"{source} {free}\n" + pair.impl.snippet())


def assert_free_queue(pair: Pair, where: str, free_queue: Sequence[int],
                      *, source: str = "vLLM") -> None:
    """With ``free_queue_order`` declared, the free queue after the last op is
    ``free_queue`` (LRU first); without it, nothing is checked."""
    __tracebackhide__ = True
    if "free_queue_order" not in pair.impl.capabilities:
        return
    queue = list(pair.impl.manager.free_block_ids())
    assert queue == list(free_queue), (
        f"{where}: free queue after the last op {queue}, {source} {list(free_queue)}\n"
        + pair.impl.snippet())
