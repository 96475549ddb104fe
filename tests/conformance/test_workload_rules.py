"""The workload machine's own arithmetic (``kvcheck.conformance.workload_machine``), pinned
where a wrong value reached the driver before: the prefill boundary of the fine-grained and
boundary-state rules (4fb854e, 5388904; found only by CI's 2,000-example multi-group
differential against vLLM 0.33.0)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcheck.conformance.workload_machine import last_hash_boundary


@pytest.mark.parametrize(("num_tokens", "hash_block_size", "lookahead", "boundary"), [
    (9, 4, 0, 8),    # the last token is left to compute
    (8, 4, 0, 4),    # a whole-block prompt stops a block early
    (10, 4, 2, 8),   # two lookahead tokens after the boundary
    (9, 4, 2, 4),    # ... and not one fewer
    (6, 2, 3, 2),
    (3, 1, 2, 1),
    (4, 4, 0, 0),    # no boundary before the last token
    (1, 1, 2, 0),    # a one-token prompt under L = 2: 0, not -1 (5388904)
    (2, 4, 3, 0),    # shorter than its lookahead: 0, not -4 (4fb854e)
    (0, 4, 0, 0),
])
def test_last_hash_boundary(num_tokens: int, hash_block_size: int, lookahead: int,
                            boundary: int) -> None:
    assert last_hash_boundary(num_tokens, hash_block_size, lookahead) == boundary


@given(num_tokens=st.integers(0, 200), hash_block_size=st.integers(1, 32),
       lookahead=st.integers(0, 8))
def test_last_hash_boundary_is_the_largest_keyable_one(num_tokens: int, hash_block_size: int,
                                                       lookahead: int) -> None:
    """A non-negative multiple of the hash block with ``max(1, L)`` tokens after it, and the
    next multiple has fewer (or it is 0 and none has them)."""
    boundary = last_hash_boundary(num_tokens, hash_block_size, lookahead)
    lag = max(1, lookahead)
    assert boundary >= 0 and boundary % hash_block_size == 0
    assert boundary == 0 or num_tokens - boundary >= lag
    assert num_tokens - (boundary + hash_block_size) < lag
