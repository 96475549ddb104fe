"""BlockTable row operations and slot_mapping arithmetic (0.33 and 0.10.2), against hand-worked
values and independent per-token models."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcheck.reference_impl.block_table import (
    PAD_SLOT_ID,
    BlockTable,
    compute_slot_mapping,
    compute_slot_mapping_v0_10,
    slot_mapping_for_request,
)

# The worked example of docs/semantics.md#slot-mapping.
ROWS = [[7, 3, 9], [5, 2]]
QSL = [0, 6, 9]
POSITIONS = [0, 1, 2, 3, 4, 9, 4, 5, 6]
EXPECTED_W1 = [28, 29, 30, 31, 12, 37, 8, 9, 10, -1, -1, -1]
EXPECTED_W2_RANK1 = [-1, 28, -1, 29, -1, 12, -1, 22, -1, -1, -1, -1]
# Rank 0 by hand (V = 8, even offsets are local, local offset = vo // 2):
#   row 0: pos 0 -> 7*4+0 = 28; pos 2 -> 7*4+1 = 29; pos 4 -> 7*4+2 = 30; pos 1, 3, 9 (vo 1) odd
#   row 1: pos 4 -> 5*4+2 = 22; pos 6 -> 5*4+3 = 23; pos 5 odd
EXPECTED_W2_RANK0 = [28, -1, 29, -1, 30, -1, 22, -1, 23, -1, -1, -1]

FAST = settings(max_examples=60, deadline=None)


def make_table(block_size: int = 4, max_num_reqs: int = 4, **kw: int) -> BlockTable:
    return BlockTable(block_size, max_num_reqs, 8, 12, **kw)


# ---------------------------------------------------------------------------------------------
# Worked examples
# ---------------------------------------------------------------------------------------------


def test_worked_example_w1_function() -> None:
    """The worked W=1 example, module-level function, ragged rows."""
    out = compute_slot_mapping(ROWS, 4, QSL, POSITIONS, max_num_batched_tokens=12)
    assert out.dtype == np.int64
    assert out.tolist() == EXPECTED_W1


@pytest.mark.parametrize(
    ("rank", "expected"), [(1, EXPECTED_W2_RANK1), (0, EXPECTED_W2_RANK0)]
)
def test_worked_example_w2(rank: int, expected: list[int]) -> None:
    """The worked W=2, I=1 example on rank 1, and rank 0 worked by hand."""
    out = compute_slot_mapping(
        ROWS, 4, QSL, POSITIONS, max_num_batched_tokens=12, dcp_world_size=2, dcp_rank=rank
    )
    assert out.tolist() == expected


def test_worked_example_block_table_class() -> None:
    """BlockTable.compute_slot_mapping reproduces both worked examples and fills its buffer."""
    cases = [({}, EXPECTED_W1), ({"dcp_world_size": 2, "dcp_rank": 1}, EXPECTED_W2_RANK1)]
    for kw, expected in cases:
        bt = make_table(**kw)
        bt.add_row(ROWS[0], 0)
        bt.add_row(ROWS[1], 1)
        out = bt.compute_slot_mapping(2, np.array(QSL, dtype=np.int32), np.array(POSITIONS))
        assert out.tolist() == expected
        assert bt.slot_mapping.tolist() == expected


def test_dense_int32_table_same_as_ragged() -> None:
    """A dense int32 table gives the same slots as ragged rows."""
    dense = np.array([[7, 3, 9, 0], [5, 2, 0, 0]], dtype=np.int32)
    out = compute_slot_mapping(dense, 4, QSL, POSITIONS, max_num_batched_tokens=12)
    assert out.tolist() == EXPECTED_W1


def test_slot_mapping_for_request() -> None:
    """Per-request helper: positions [2, 6) of blocks [7, 3, 9], bs 4 -> 30, 31, 12, 13."""
    assert slot_mapping_for_request([7, 3, 9], 4, 2, 6) == [30, 31, 12, 13]
    assert slot_mapping_for_request([7, 3, 9], 4, 5, 5) == []
    assert slot_mapping_for_request([7, 3, 9], 4, 11, 12) == [39]
    with pytest.raises(ValueError, match="end <= len"):
        slot_mapping_for_request([7, 3, 9], 4, 0, 13)


# ---------------------------------------------------------------------------------------------
# W = 1 against a per-token loop
# ---------------------------------------------------------------------------------------------


@st.composite
def batches(draw: st.DrawFn, max_reqs: int = 5, max_blocks: int = 6) -> dict:
    """Random batch: permuted non-arange block ids, ragged rows, per-request positions."""
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    num_reqs = draw(st.integers(0, max_reqs))
    num_blocks = [draw(st.integers(1, max_blocks)) for _ in range(num_reqs)]
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    # Ids drawn from a large sparse range, so an arange-like bug cannot pass by accident.
    pool = rng.permutation(10_000)[: sum(num_blocks)] + 1
    rows, start = [], 0
    for n in num_blocks:
        rows.append([int(x) for x in pool[start : start + n]])
        start += n
    positions, qsl = [], [0]
    for n in num_blocks:
        cap = n * block_size
        if draw(st.booleans()):  # realistic: a contiguous run [ctx, ctx + q)
            ctx = draw(st.integers(0, cap - 1))
            q = draw(st.integers(0, cap - ctx))
            pos = list(range(ctx, ctx + q))
        else:  # arbitrary positions, repeats allowed
            pos = draw(st.lists(st.integers(0, cap - 1), max_size=12))
        positions += pos
        qsl.append(qsl[-1] + len(pos))
    return {"block_size": block_size, "rows": rows, "qsl": qsl, "positions": positions}


@FAST
@given(batches(), st.integers(0, 7))
def test_w1_matches_per_token_loop(batch: dict, extra_pad: int) -> None:
    """W=1: slot == row[pos // bs] * bs + pos % bs for each token, -1 padding after."""
    bs, rows, qsl, positions = batch["block_size"], batch["rows"], batch["qsl"], batch["positions"]
    expected = []
    for r in range(len(qsl) - 1):
        for i in range(qsl[r], qsl[r + 1]):
            p = positions[i]
            expected.append(rows[r][p // bs] * bs + p % bs)
    expected += [-1] * extra_pad
    out = compute_slot_mapping(
        rows, bs, qsl, positions, max_num_batched_tokens=len(positions) + extra_pad
    )
    assert out.tolist() == expected


@FAST
@given(batches())
def test_block_table_class_matches_function(batch: dict) -> None:
    """BlockTable built by add_row/append_row gives the function's slots on the same rows."""
    bs, rows = batch["block_size"], batch["rows"]
    bt = BlockTable(bs, 5, 6, 512)  # a batch holds at most 5 * 6 * 16 = 480 tokens
    for r, row in enumerate(rows):
        bt.add_row(row[:1], r)
        bt.append_row(row[1:], r)
    out = bt.compute_slot_mapping(len(rows), batch["qsl"], batch["positions"])
    n = len(batch["positions"])
    assert out.shape == (512,)
    direct = compute_slot_mapping(rows, bs, batch["qsl"], batch["positions"])
    assert out[:n].tolist() == direct.tolist()
    assert (out[n:] == PAD_SLOT_ID).all()


# ---------------------------------------------------------------------------------------------
# DCP
# ---------------------------------------------------------------------------------------------


def dealt_layout(block_size: int, world: int, interleave: int) -> list[tuple[int, int]]:
    """(rank, local block offset) of each offset in a virtual block, by simulating the deal.

    Chunks of ``interleave`` consecutive tokens go to ranks 0, 1, ..., world-1, 0, ...; each
    rank fills its own block front to back. Deliberately a simulation, not the closed formula.
    """
    fill = [0] * world
    layout = []
    for vo in range(block_size * world):
        rank = (vo // interleave) % world  # which chunk, dealt round-robin
        layout.append((rank, fill[rank]))
        fill[rank] += 1
    assert fill == [block_size] * world  # every rank stores exactly one block's worth
    return layout


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("interleave", [1, 2, 4])
@pytest.mark.parametrize("block_size", [4, 8])
def test_dcp_every_position_local_on_exactly_one_rank(
    world: int, interleave: int, block_size: int
) -> None:
    """DCP: each position is local on one rank, at the dealt offset, and ranks fill their blocks."""
    rng = np.random.default_rng(world * 100 + interleave * 10 + block_size)
    num_blocks = [3, 1, 2]
    ids = rng.permutation(500)[: sum(num_blocks)] + 1
    rows = [ids[:3].tolist(), ids[3:4].tolist(), ids[4:6].tolist()]
    v = block_size * world
    # Each request covers all its positions, in a shuffled order.
    positions = [rng.permutation(n * v).tolist() for n in num_blocks]
    flat_pos = [p for request_positions in positions for p in request_positions]
    qsl = np.concatenate([[0], np.cumsum([len(p) for p in positions])])
    req_of = np.repeat(np.arange(3), np.diff(qsl))
    layout = dealt_layout(block_size, world, interleave)

    per_rank = [
        compute_slot_mapping(
            rows, block_size, qsl, flat_pos,
            dcp_world_size=world, dcp_rank=rank, cp_kv_cache_interleave_size=interleave,
        )
        for rank in range(world)
    ]
    stacked = np.stack(per_rank)  # [world, num_tokens]
    assert ((stacked != PAD_SLOT_ID).sum(axis=0) == 1).all()

    for rank in range(world):
        for i, p in enumerate(flat_pos):
            owner, local_off = layout[p % v]
            row = rows[req_of[i]]
            want = row[p // v] * block_size + local_off if owner == rank else PAD_SLOT_ID
            assert per_rank[rank][i] == want, (rank, i, p)
        # Every rank's local slots of a request are exactly all slots of the request's blocks.
        for r, row in enumerate(rows):
            got = sorted(per_rank[rank][(req_of == r) & (per_rank[rank] != PAD_SLOT_ID)].tolist())
            assert got == sorted(b * block_size + o for b in row for o in range(block_size))


def test_dcp_interleave_example_by_hand() -> None:
    """W=2, I=2, bs 4 (V=8): offsets 0,1 -> rank 0; 2,3 -> rank 1; 4,5 -> rank 0; 6,7 -> rank 1.

    Row [7, 3]; positions 0..7 and 10. Rank 1 holds vo 2,3,6,7 at local offsets 0,1,2,3 of its
    block 7 (slots 28..31); pos 10 is vo 2 of block 3 -> rank 1, offset 0 -> slot 12.
    Rank 0 holds vo 0,1,4,5 at local offsets 0,1,2,3 -> 28,29,30,31.
    """
    pos = [0, 1, 2, 3, 4, 5, 6, 7, 10]
    kw = {"dcp_world_size": 2, "cp_kv_cache_interleave_size": 2}
    r0 = compute_slot_mapping([[7, 3]], 4, [0, 9], pos, dcp_rank=0, **kw)
    r1 = compute_slot_mapping([[7, 3]], 4, [0, 9], pos, dcp_rank=1, **kw)
    assert r0.tolist() == [28, 29, -1, -1, 30, 31, -1, -1, -1]
    assert r1.tolist() == [-1, -1, 28, 29, -1, -1, 30, 31, 12]


# ---------------------------------------------------------------------------------------------
# Padding and validation
# ---------------------------------------------------------------------------------------------


def test_tail_padding() -> None:
    """Entries [num_tokens, max_num_batched_tokens) are PAD_SLOT_ID; None means no padding."""
    out = compute_slot_mapping([[5]], 4, [0, 2], [1, 2], max_num_batched_tokens=5)
    assert out.tolist() == [21, 22, -1, -1, -1]
    assert compute_slot_mapping([[5]], 4, [0, 2], [1, 2]).tolist() == [21, 22]
    assert compute_slot_mapping([[5]], 4, [0, 2], [1, 2], max_num_batched_tokens=2).tolist() == [
        21,
        22,
    ]
    empty = compute_slot_mapping([[5]], 4, [0, 0], [], max_num_batched_tokens=3)
    assert empty.tolist() == [-1, -1, -1]
    assert compute_slot_mapping([], 4, [0], [], max_num_batched_tokens=2).tolist() == [-1, -1]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"query_start_loc": [0, 3, 2]}, "non-decreasing"),
        ({"query_start_loc": [1, 3]}, r"query_start_loc\[0\] must be 0"),
        ({"positions": [0, 1]}, "positions has 2 entries"),
        ({"positions": [0, -1, 2]}, "negative"),
        ({"positions": [0, 1, 12]}, "block_idx 3"),
        ({"max_num_batched_tokens": 2}, "exceeds max_num_batched_tokens=2"),
        ({"dcp_world_size": 2, "dcp_rank": 2}, "dcp_rank"),
        ({"dcp_world_size": 2, "dcp_rank": -1}, "dcp_rank"),
        ({"cp_kv_cache_interleave_size": 0}, "interleave"),
        ({"dcp_world_size": 2, "cp_kv_cache_interleave_size": 3}, "must divide block_size"),
        ({"block_size": 0}, "block_size"),
        ({"query_start_loc": [0, 3, 3, 3]}, "3 requests"),
        ({"positions": [0.0, 1.0, 2.0]}, "integers"),
    ],
)
def test_compute_slot_mapping_rejects(kwargs: dict, match: str) -> None:
    """Malformed inputs raise ValueError with a message naming the problem."""
    args = {
        "block_table_rows": [[7, 3, 9], [5]],
        "block_size": 4,
        "query_start_loc": [0, 3, 3],
        "positions": [0, 1, 2],
        "max_num_batched_tokens": 8,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        compute_slot_mapping(**args)


def test_dcp_block_idx_uses_virtual_block_size() -> None:
    """With W=2 a row entry covers bs*W positions: pos 7 fits one block, pos 8 needs two."""
    out = compute_slot_mapping([[7]], 4, [0, 1], [7], dcp_world_size=2, dcp_rank=1)
    assert out.tolist() == [31]  # vo 7 -> rank 1, local offset 3
    with pytest.raises(ValueError, match="has only 1 blocks"):
        compute_slot_mapping([[7]], 4, [0, 1], [8], dcp_world_size=2, dcp_rank=0)


def test_class_position_past_num_blocks_per_row() -> None:
    """The class checks against num_blocks_per_row, not the (zero-filled) table width."""
    bt = make_table()
    bt.add_row([7], 0)
    with pytest.raises(ValueError, match="row 0 has only 1 blocks"):
        bt.compute_slot_mapping(1, [0, 1], [4])


def test_class_num_reqs_and_qsl_shape() -> None:
    """num_reqs beyond max_num_reqs and a query_start_loc of the wrong length are rejected."""
    bt = make_table()
    with pytest.raises(ValueError, match="num_reqs=5"):
        bt.compute_slot_mapping(5, [0] * 6, [])
    with pytest.raises(ValueError, match="num_reqs \\+ 1 = 2"):
        bt.compute_slot_mapping(1, [0, 0, 0], [])
    bt.add_row([1, 2, 3, 4], 0)
    with pytest.raises(ValueError, match="exceeds max_num_batched_tokens=12"):
        bt.compute_slot_mapping(1, [0, 13], list(range(13)))


# ---------------------------------------------------------------------------------------------
# Row operations
# ---------------------------------------------------------------------------------------------


def test_row_ops_add_append_clear() -> None:
    """add_row replaces, append_row extends, clear_row zeroes the used entries."""
    bt = make_table()
    assert bt.block_table.dtype == np.int32 and bt.block_table.shape == (4, 8)
    bt.add_row([7, 3], 1)
    bt.append_row([9], 1)
    bt.append_row([], 1)
    assert bt.get_row(1) == [7, 3, 9] and bt.num_blocks_per_row[1] == 3
    bt.add_row([5], 1)
    assert bt.get_row(1) == [5]
    bt.clear_row(1)
    assert bt.num_blocks_per_row[1] == 0
    assert bt.block_table[1, 0] == 0


def test_move_row_zeroes_source() -> None:
    """move_row copies src into tgt and zeroes the vacated src row (null block)."""
    bt = make_table()
    bt.add_row([7, 3, 9], 2)
    bt.add_row([1, 1, 1, 1, 1], 0)
    bt.move_row(2, 0)
    assert bt.get_row(0) == [7, 3, 9]
    assert bt.num_blocks_per_row[2] == 0
    assert bt.block_table[2].tolist() == [0] * 8
    bt.move_row(0, 0)  # a no-op, not a self-erase
    assert bt.get_row(0) == [7, 3, 9]


def test_swap_row() -> None:
    """swap_row exchanges contents and counts."""
    bt = make_table()
    bt.add_row([7, 3, 9], 0)
    bt.add_row([5], 3)
    bt.swap_row(0, 3)
    assert bt.get_row(0) == [5] and bt.get_row(3) == [7, 3, 9]
    assert bt.num_blocks_per_row.tolist() == [1, 0, 0, 3]


def test_row_ops_errors() -> None:
    """Overflow and bad indices raise ValueError naming the row and the limit."""
    bt = make_table()
    bt.add_row(list(range(1, 7)), 1)
    with pytest.raises(ValueError, match=r"row 1 would hold 9 blocks .*max_num_blocks_per_req=8"):
        bt.append_row([1, 2, 3], 1)
    assert bt.num_blocks_per_row[1] == 6  # unchanged after the failed append
    with pytest.raises(ValueError, match=r"row_idx=4 out of range \[0, max_num_reqs=4\)"):
        bt.add_row([1], 4)
    with pytest.raises(ValueError, match="src=-1"):
        bt.move_row(-1, 0)
    with pytest.raises(ValueError, match="tgt=9"):
        bt.swap_row(0, 9)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*31\)"):
        bt.add_row([-3], 0)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*31\)"):
        bt.add_row([2**31], 0)


# ---------------------------------------------------------------------------------------------
# 0.10.2 variant
# ---------------------------------------------------------------------------------------------


def test_v0_10_examples_by_hand() -> None:
    """0.10.2 formula worked by hand.

    Rows [7,3,9], [5,2]; bs 4; tokens (row, pos): (0,0) (0,5) (0,9) (1,2) (1,7).
      W=1: 7*4+0=28; 3*4+1=13; 9*4+1=37; 5*4+2=22; 2*4+3=11.
      W=2 (V=8, local iff vo % 2 == rank, offset vo // 2):
        (0,0): vo 0 rank 0 off 0 -> 28      (0,5): vo 5 rank 1 off 2 -> 7*4+2 = 30
        (0,9): block 1 vo 1 rank 1 off 0 -> 3*4 = 12
        (1,2): vo 2 rank 0 off 1 -> 21      (1,7): vo 7 rank 1 off 3 -> 5*4+3 = 23
    """
    req, pos = [0, 0, 0, 1, 1], [0, 5, 9, 2, 7]
    assert compute_slot_mapping_v0_10(ROWS, 4, req, pos).tolist() == [28, 13, 37, 22, 11]
    w2 = {"dcp_world_size": 2}
    assert compute_slot_mapping_v0_10(ROWS, 4, req, pos, dcp_rank=0, **w2).tolist() == [
        28, -1, -1, 21, -1,
    ]
    assert compute_slot_mapping_v0_10(ROWS, 4, req, pos, dcp_rank=1, **w2).tolist() == [
        -1, 30, 12, -1, 23,
    ]
    out = compute_slot_mapping_v0_10(ROWS, 4, req, pos)
    assert out.dtype == np.int64 and out.shape == (5,)  # no padding fill


@FAST
@given(batches(), st.sampled_from([(1, 0), (2, 0), (2, 1), (4, 3)]))
def test_v0_10_agrees_with_0_33_at_interleave_1(batch: dict, dcp: tuple[int, int]) -> None:
    """With I=1 the two versions' formulas give the same slots (rows sized for bs*W)."""
    world, rank = dcp
    bs, rows, qsl = batch["block_size"], batch["rows"], batch["qsl"]
    # Positions were drawn for bs-sized blocks; they are also valid for the larger virtual ones.
    req = np.repeat(np.arange(len(qsl) - 1), np.diff(qsl))
    new = compute_slot_mapping(
        rows, bs, qsl, batch["positions"], dcp_world_size=world, dcp_rank=rank
    )
    old = compute_slot_mapping_v0_10(
        rows, bs, req, batch["positions"], dcp_world_size=world, dcp_rank=rank
    )
    assert new.tolist() == old.tolist()


def test_v0_10_rejects() -> None:
    """0.10 variant: length mismatch, bad row, block past the row, negative position."""
    with pytest.raises(ValueError, match="req_indices has 1 entries"):
        compute_slot_mapping_v0_10(ROWS, 4, [0], [0, 1])
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        compute_slot_mapping_v0_10(ROWS, 4, [2], [0])
    with pytest.raises(ValueError, match="row 1 has only 2 blocks"):
        compute_slot_mapping_v0_10(ROWS, 4, [1], [8])
    with pytest.raises(ValueError, match="negative"):
        compute_slot_mapping_v0_10(ROWS, 4, [1], [-1])
