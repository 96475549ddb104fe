"""Kernel benchmark inputs: fragmented, non-repeating block tables, slot arithmetic, rotation
of input sets, the shipped cases and their bytes."""

from __future__ import annotations

import math

import pytest

from kvcheck.bench.kernels.inputs import (
    KERNEL_OPS,
    KernelBenchCase,
    bytes_per_call,
    kernel_cases,
    plan_block_tables,
    slots_of_new_tokens,
)


def test_block_tables_never_repeat_a_block() -> None:
    """Across 3 sets of 4 sequences every id in 1..num_blocks-1 appears exactly once, block 0
    (null) never; rows have ceil(seq_len / block_size) entries and are not contiguous runs."""
    seq_lens = (33, 16, 1, 70)
    tables, num_blocks = plan_block_tables(seq_lens, 16, 3, seed=0, label="t")
    need = [math.ceil(n / 16) for n in seq_lens]
    assert num_blocks == 1 + 3 * sum(need)
    ids = [b for table in tables for row in table for b in row]
    assert sorted(ids) == list(range(1, num_blocks))
    for table in tables:
        assert [len(row) for row in table] == need
    longest = tables[0][3]
    assert longest != list(range(longest[0], longest[0] + len(longest)))  # fragmented
    again, _ = plan_block_tables(seq_lens, 16, 3, seed=0, label="t")
    assert again == tables  # deterministic


def test_slots_of_new_tokens_hand_computed() -> None:
    """rows [[7, 3]], seq_len 20, 2 new tokens, block 16: positions 18, 19 -> block 3, rows 2
    and 3 -> slots 50, 51; then the padding."""
    assert slots_of_new_tokens([[7, 3]], [20], [2], 16, num_pad=2) == [50, 51, -1, -1]
    assert slots_of_new_tokens([[7, 3], [5]], [17, 1], [1, 1], 16) == [48, 80]


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("op", KERNEL_OPS)
def test_shipped_cases_are_valid_and_stable(op: str, device: str) -> None:
    """Every shipped case is well-formed and deterministic; decode cases are decodes."""
    cases = kernel_cases(op, device)
    assert cases and cases == kernel_cases(op, device)
    for case in cases:
        assert case.op == op and min(case.seq_lens) >= 1
        if op == "paged_attention_decode" or case.name.startswith("decode"):
            assert set(case.query_lens) == {1}
    if device == "cuda":
        assert all(c.dtype == "bfloat16" and c.head_size == 128 for c in cases)


def test_bytes_per_call_uses_the_case_shape() -> None:
    """A 2-sequence bf16 decode: the decode model; the varlen form adds query_start_loc."""
    case = KernelBenchCase("t", "paged_attention_decode", (100, 17), (1, 1), num_kv_heads=8,
                           queries_per_kv=4, head_size=128, block_size=16)
    assert bytes_per_call(case) == 512_044  # see test_metrics.test_paged_decode_bytes...
    varlen = KernelBenchCase("t", "paged_attention_varlen", (100, 17), (1, 1), num_kv_heads=8,
                             queries_per_kv=4, head_size=128, block_size=16)
    assert bytes_per_call(varlen) == 512_044 + 4 * 3
    store = KernelBenchCase("t", "store_kv_cache", (100, 17), (1, 1), num_kv_heads=8,
                            queries_per_kv=4, head_size=128, block_size=16, num_pad=3)
    assert bytes_per_call(store) == 5 * 8 + 2 * (2 * 8 * 128 * 2) * 2


def test_bad_cases_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown kernel op"):
        KernelBenchCase("t", "copy", (1,), (1,), 1, 1, 16, 16)
    with pytest.raises(ValueError, match="query_len <= seq_len"):
        KernelBenchCase("t", "paged_attention_varlen", (1,), (2,), 1, 1, 16, 16)


def test_input_pool_rotates_disjoint_sets_with_fresh_inputs() -> None:
    """Consecutive rounds use other blocks and new queries; the slot mapping matches the
    rows handed out; after num_input_sets rounds the block sets come back."""
    torch = pytest.importorskip("torch")
    from kvcheck.bench.kernels.inputs import KernelInputPool

    case = KernelBenchCase("t", "paged_attention_decode", (20, 5, 33), (1, 1, 1),
                           num_kv_heads=2, queries_per_kv=2, head_size=16, block_size=16,
                           dtype="float32", num_input_sets=2)
    pool = KernelInputPool(case, "cpu")
    a, b, c = pool.next_round(), pool.next_round(), pool.next_round()
    assert not {x for row in a.rows for x in row} & {x for row in b.rows for x in row}
    assert a.rows == c.rows and a.set_index == c.set_index == 0
    assert not torch.equal(a.query, c.query)
    assert a.block_table[0, :2].tolist() == a.rows[0]
    assert a.slot_mapping.tolist() == slots_of_new_tokens(a.rows, case.seq_lens,
                                                          case.query_lens, 16)
    assert pool.pool_bytes == 2 * pool.num_blocks * 16 * 2 * 16 * 4
    pool.release()
