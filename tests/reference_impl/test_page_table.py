"""Conversions between the vLLM block table, FlashInfer's CSR page table and SGLang's
req_to_token, and the slot cross-check between them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcheck.reference_impl.block_table import compute_slot_mapping
from kvcheck.reference_impl.page_table import (
    block_table_from_sglang_req_to_token,
    from_flashinfer_csr,
    slot_from_csr,
    to_flashinfer_csr,
)

FAST = settings(max_examples=60, deadline=None)


# ---------------------------------------------------------------------------------------------
# vLLM -> FlashInfer CSR
# ---------------------------------------------------------------------------------------------


def test_to_csr_by_hand() -> None:
    """Rows [7,3,9], [5,2], bs 4, seq_lens [9, 4]: pages 3 (9 = 2*4 + 1) and 1 (4 = 0*4 + 4)."""
    indptr, indices, last = to_flashinfer_csr([[7, 3, 9], [5, 2]], [9, 4], 4)
    assert indptr.tolist() == [0, 3, 4]
    assert indices.tolist() == [7, 3, 9, 5]
    assert last.tolist() == [1, 4]
    assert indptr.dtype == indices.dtype == last.dtype == np.int32


def test_to_csr_flashinfer_smoke_shape() -> None:
    """FlashInfer test_page.py shape: seq_lens [45, 8, 25, 22], P=16 -> pages [3, 1, 2, 2].

    45 = (3-1)*16 + 13; 8 = 0*16 + 8; 25 = 16 + 9; 22 = 16 + 6.
    """
    rows = np.array([[40, 11, 23], [5, 0, 0], [31, 2, 0], [17, 9, 0]], dtype=np.int32)
    indptr, indices, last = to_flashinfer_csr(rows, np.array([45, 8, 25, 22]), 16)
    assert indptr.tolist() == [0, 3, 4, 6, 8]
    assert indices.tolist() == [40, 11, 23, 5, 31, 2, 17, 9]
    assert last.tolist() == [13, 8, 9, 6]


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_block_multiple_gives_full_last_page(block_size: int) -> None:
    """seq_len == k * block_size -> k pages and last_page_len == block_size (never 0)."""
    indptr, _, last = to_flashinfer_csr([[1, 2, 3]], [3 * block_size], block_size)
    assert indptr.tolist() == [0, 3]
    assert last.tolist() == [block_size]


def test_to_csr_rejects() -> None:
    """seq_len 0, rows too short, ids beyond int32, and negative ids are ValueErrors."""
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 0"):
        to_flashinfer_csr([[1], [2]], [3, 0], 4)
    with pytest.raises(ValueError, match="needs 2 blocks of 4 but its row has 1"):
        to_flashinfer_csr([[1]], [5], 4)
    with pytest.raises(ValueError, match=r"2\*\*31"):
        to_flashinfer_csr(np.array([[2**31]], dtype=np.int64), [1], 4)
    with pytest.raises(ValueError, match=r"2\*\*31"):
        to_flashinfer_csr([[-1]], [1], 4)
    with pytest.raises(ValueError, match="2 seq_lens but the block table has 1 rows"):
        to_flashinfer_csr([[1]], [1, 1], 4)


def test_to_csr_only_reads_used_prefix() -> None:
    """Entries past ceil(seq_len / P) (even huge garbage) are not part of the CSR."""
    rows = np.array([[4, 2**40]], dtype=np.int64)
    indptr, indices, last = to_flashinfer_csr(rows, [3], 4)
    assert (indptr.tolist(), indices.tolist(), last.tolist()) == ([0, 1], [4], [3])


# ---------------------------------------------------------------------------------------------
# FlashInfer CSR -> vLLM
# ---------------------------------------------------------------------------------------------


def test_from_csr_by_hand() -> None:
    """indptr [0,3,4], indices [7,3,9,5], last [1,4], P 4 -> rows padded with pad_block_id."""
    rows, lens = from_flashinfer_csr([0, 3, 4], [7, 3, 9, 5], [1, 4], 4, pad_block_id=99)
    assert rows.tolist() == [[7, 3, 9], [5, 99, 99]]
    assert lens.tolist() == [2 * 4 + 1, 0 * 4 + 4]
    assert rows.dtype == lens.dtype == np.int32


@pytest.mark.parametrize(
    ("indptr", "indices", "last", "match"),
    [
        ([0, 1], [7], [0], r"kv_last_page_len\[0\] = 0"),
        ([0, 1], [7], [5], r"kv_last_page_len\[0\] = 5"),
        ([0, 0], [], [1], "0 pages"),
        ([1, 2], [7, 8], [1], r"kv_indptr\[0\] must be 0"),
        ([0, 2, 1], [7, 8], [1, 1], "non-decreasing"),
        ([0, 3], [7, 8], [1], "exceeds len"),
        ([0, 1], [7], [1, 1], "kv_last_page_len has 2 entries"),
        ([0, 1], [-7], [1], r"2\*\*31"),
    ],
)
def test_from_csr_rejects(indptr: list, indices: list, last: list, match: str) -> None:
    """Malformed CSR inputs raise ValueError naming the entry."""
    with pytest.raises(ValueError, match=match):
        from_flashinfer_csr(indptr, indices, last, 4)


@st.composite
def paged_batches(draw: st.DrawFn) -> dict:
    """Random batch: permuted, shared (prefix) block ids, ragged rows, context + query."""
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    num_reqs = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pool = (rng.permutation(5_000) + 1).tolist()
    shared = pool[:2]  # a shared prefix, as with prefix caching
    rows, seq_lens, query_lens = [], [], []
    nxt = 2
    for _ in range(num_reqs):
        seq_len = draw(st.integers(1, 6 * block_size))
        num_pages = -(-seq_len // block_size)
        use_shared = draw(st.booleans()) and num_pages > 2
        own = pool[nxt : nxt + num_pages]
        nxt += num_pages
        row = (shared + own[2:]) if use_shared else own
        slack = draw(st.integers(0, 2))  # extra table entries that seq_len masks out
        rows.append(row + pool[nxt : nxt + slack])
        nxt += slack
        seq_lens.append(seq_len)
        query_lens.append(draw(st.integers(0, seq_len)))
    return {"block_size": block_size, "rows": rows, "seq_lens": seq_lens, "query_lens": query_lens}


@FAST
@given(paged_batches())
def test_csr_round_trip(batch: dict) -> None:
    """to_flashinfer_csr then from_flashinfer_csr gives the same used prefixes and seq_lens."""
    bs, rows, seq_lens = batch["block_size"], batch["rows"], batch["seq_lens"]
    indptr, indices, last = to_flashinfer_csr(rows, seq_lens, bs)
    assert ((last >= 1) & (last <= bs)).all()
    back, back_lens = from_flashinfer_csr(indptr, indices, last, bs, pad_block_id=0)
    assert back_lens.tolist() == seq_lens
    for b, row in enumerate(rows):
        num_pages = -(-seq_lens[b] // bs)
        assert back[b, :num_pages].tolist() == row[:num_pages]
        assert (back[b, num_pages:] == 0).all()


@FAST
@given(paged_batches())
def test_slot_from_csr_equals_slot_mapping(batch: dict) -> None:
    """Cross-check: kv_indices[kv_indptr[b] + pos//P]*P + pos%P == slot_mapping == table form."""
    bs, rows, seq_lens, query_lens = (
        batch["block_size"], batch["rows"], batch["seq_lens"], batch["query_lens"],
    )
    # The scheduled tokens of request b are its last query_len positions.
    positions = [p for s, q in zip(seq_lens, query_lens, strict=True) for p in range(s - q, s)]
    batch_indices = [b for b, q in enumerate(query_lens) for _ in range(q)]
    qsl = np.concatenate([[0], np.cumsum(query_lens)])

    indptr, indices, _ = to_flashinfer_csr(rows, seq_lens, bs)
    via_csr = slot_from_csr(indptr, indices, bs, batch_indices, positions)
    via_table = compute_slot_mapping(rows, bs, qsl, positions)
    by_hand = [rows[b][p // bs] * bs + p % bs
               for b, p in zip(batch_indices, positions, strict=True)]
    assert via_csr.dtype == np.int64
    assert via_csr.tolist() == via_table.tolist() == by_hand


def test_slot_from_csr_rejects() -> None:
    """A position past the request's pages, a bad batch index or a negative position."""
    indptr, indices = [0, 2, 3], [7, 3, 5]
    assert slot_from_csr(indptr, indices, 4, [0, 1], [5, 3]).tolist() == [13, 23]
    with pytest.raises(ValueError, match="on page 1 but request 1 has 1 pages"):
        slot_from_csr(indptr, indices, 4, [1], [4])
    with pytest.raises(ValueError, match=r"batch_indices\[0\] = 2"):
        slot_from_csr(indptr, indices, 4, [2], [0])
    with pytest.raises(ValueError, match="negative"):
        slot_from_csr(indptr, indices, 4, [0], [-1])


# ---------------------------------------------------------------------------------------------
# SGLang req_to_token
# ---------------------------------------------------------------------------------------------


def build_req_to_token(
    rows: list[list[int]], seq_lens: list[int], page_size: int, pool_rows: list[int], width: int
) -> np.ndarray:
    """req_to_token as SGLang's paged allocator lays it out: one flat slot per position."""
    r2t = np.full((max(pool_rows) + 2, width), -5, dtype=np.int32)  # garbage past seq_len
    for row, seq_len, r in zip(rows, seq_lens, pool_rows, strict=True):
        for pos in range(seq_len):
            r2t[r, pos] = row[pos // page_size] * page_size + pos % page_size
    return r2t


@FAST
@given(paged_batches())
def test_sglang_round_trip(batch: dict) -> None:
    """A req_to_token built from a block table converts back to that table."""
    bs, rows, seq_lens = batch["block_size"], batch["rows"], batch["seq_lens"]
    pool_rows = [2 * b + 1 for b in range(len(rows))][::-1]  # not the batch order; row 0 dummy
    r2t = build_req_to_token(rows, seq_lens, bs, pool_rows, width=6 * bs + 3)
    table, lens = block_table_from_sglang_req_to_token(r2t, pool_rows, seq_lens, bs)
    assert lens.tolist() == seq_lens and lens.dtype == np.int32 and table.dtype == np.int32
    for b, row in enumerate(rows):
        num_pages = -(-seq_lens[b] // bs)
        assert table[b, :num_pages].tolist() == row[:num_pages]


def test_sglang_by_hand() -> None:
    """P=4: slots 28..31 then 12, 13 -> pages [7, 3]; page_size 1 -> the slots themselves."""
    r2t = np.zeros((3, 8), dtype=np.int32)
    r2t[2, :6] = [28, 29, 30, 31, 12, 13]
    table, lens = block_table_from_sglang_req_to_token(r2t, [2], [6], 4)
    assert table.tolist() == [[7, 3]] and lens.tolist() == [6]
    table1, _ = block_table_from_sglang_req_to_token(r2t, [2, 0], [6, 0], 1)
    assert table1.tolist() == [[28, 29, 30, 31, 12, 13], [0, 0, 0, 0, 0, 0]]


def test_sglang_non_contiguous_page_rejected() -> None:
    """Swapped slots inside a page are named: request, position and both values."""
    r2t = np.zeros((3, 8), dtype=np.int32)
    r2t[1, :6] = [28, 29, 31, 30, 12, 13]  # positions 2 and 3 swapped inside page 7
    with pytest.raises(ValueError, match="breaks page contiguity") as exc:
        block_table_from_sglang_req_to_token(r2t, [1], [6], 4)
    msg = str(exc.value)
    assert "request 0" in msg and "position 2" in msg
    assert "= 31" in msg and "= 30" in msg


def test_sglang_unaligned_page_rejected() -> None:
    """A page that starts off a page_size boundary is not a block."""
    r2t = np.zeros((2, 8), dtype=np.int32)
    r2t[1, :5] = [29, 30, 31, 32, 12]  # contiguous but starting at 29, not a multiple of 4
    with pytest.raises(ValueError, match=r"position 0: req_to_token\[1, 0\] = 29.* = 28"):
        block_table_from_sglang_req_to_token(r2t, [1], [5], 4)


def test_sglang_partial_last_page_ignores_tail() -> None:
    """Slots past seq_len are not checked (SGLang leaves garbage there)."""
    r2t = np.full((2, 8), 999, dtype=np.int32)
    r2t[1, :5] = [8, 9, 10, 11, 20]
    table, _ = block_table_from_sglang_req_to_token(r2t, [1], [5], 4)
    assert table.tolist() == [[2, 5]]


def test_sglang_rejects_bad_indices() -> None:
    """Pool index and seq_len out of range are ValueErrors."""
    r2t = np.zeros((2, 8), dtype=np.int32)
    with pytest.raises(ValueError, match="pool_size=2"):
        block_table_from_sglang_req_to_token(r2t, [2], [1], 4)
    with pytest.raises(ValueError, match="max_context_len=8"):
        block_table_from_sglang_req_to_token(r2t, [1], [9], 4)
