"""The references themselves, against hand-written math and the spec's worked examples.

The kernels are only as trustworthy as these: each check here uses a different computation
(explicit loops, closed forms) than the reference it tests.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kvcheck.gpu_kernels.reference import (  # noqa: E402
    attention_ref,
    copy_blocks_ref,
    gather_kv_ref,
    paged_attention_decode_ref,
    paged_attention_varlen_ref,
    store_kv_cache_ref,
)


def _naive_attention(q, k, v, scale, q_pos, window=None, softcap=None):
    """One query vector [D] against keys [L, D]: explicit loops, math.exp, no torch softmax."""
    scores = []
    for j in range(k.shape[0]):
        if j > q_pos or (window is not None and q_pos - j >= window):
            continue
        s = float(q @ k[j]) * scale
        if softcap is not None:
            s = softcap * math.tanh(s / softcap)
        scores.append((j, s))
    top = max(s for _, s in scores)
    weights = [(j, math.exp(s - top)) for j, s in scores]
    total = sum(w for _, w in weights)
    return sum(w / total * v[j] for j, w in weights)


def test_store_ref_flashinfer_worked_example():
    """Position 45 of a request with blocks [3, 1, 2] (bs 16) lands in block 2, row 13."""
    block_table = [3, 1, 2]
    pos = 45  # 45 = (3 - 1) * 16 + 13
    slot = block_table[pos // 16] * 16 + pos % 16
    cache = torch.zeros(4, 16, 1, 4)
    key = torch.arange(4.0).reshape(1, 1, 4)
    store_kv_cache_ref(key, key, cache, cache.clone(), torch.tensor([slot]))
    assert slot == 45 and cache[2, 13, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert int((cache != 0).sum()) == 3


def test_store_ref_fp8_divides_then_rounds_to_nearest_even():
    """fp8: stored = e4m3(x / scale); 1.99 rounds to 2.0 (the carry the interpreter loses)."""
    key = torch.tensor([1.99, 0.9375, 0.97, -3.0]).reshape(1, 1, 4) * 4
    cache = torch.zeros(1, 2, 1, 4, dtype=torch.uint8)  # uint8-allocated, like vLLM
    store_kv_cache_ref(key, key, cache, cache.clone(), torch.tensor([1]), "fp8", 4.0, 4.0)
    stored = cache.view(torch.float8_e4m3fn)[0, 1, 0].float().tolist()
    # e4m3 near 1 has steps of 1/8: 0.97 -> 1.0, 0.9375 is exact, 1.99 -> 2.0.
    assert stored == [2.0, 0.9375, 1.0, -3.0]


def test_store_ref_hnd_and_padding():
    """HND caches are written at [block, head, offset]; PAD_SLOT_ID rows are skipped."""
    cache = torch.zeros(2, 3, 4, 2)  # HND: 2 blocks, 3 heads, block_size 4, D 2
    key = torch.ones(2, 3, 2)
    store_kv_cache_ref(key, key, cache, cache.clone(), torch.tensor([-1, 6]), layout="HND")
    assert cache[1, :, 2].eq(1).all() and int((cache != 0).sum()) == 6


@pytest.mark.parametrize(("window", "softcap"), [(None, None), (3, None), (None, 0.7), (2, 5.0)])
def test_attention_ref_against_explicit_loops(window, softcap):
    """attention_ref equals a per-query, per-head loop with math.exp (GQA ratio 3)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 6, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(9, 2, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(9, 2, 8, generator=gen, dtype=torch.float64)
    out = attention_ref(q, k, v, 0.3, sliding_window=window, softcap=softcap)
    for i in range(4):
        for h in range(6):
            kv_head = h // 3  # query heads 0-2 -> KV head 0, 3-5 -> KV head 1
            want = _naive_attention(q[i, h], k[:, kv_head], v[:, kv_head], 0.3, 5 + i,
                                    window, softcap)
            torch.testing.assert_close(out[i, h], want.float(), atol=1e-5, rtol=1e-5)


def test_sliding_window_is_vllm_window_size_left_plus_one():
    """Window W keeps keys with q_pos - k_pos < W: vLLM's window_size=(W - 1, 0)."""
    q = torch.zeros(1, 1, 4)  # equal scores: the output is the mean of the visible values
    k = torch.zeros(10, 1, 4)
    v = torch.arange(10.0).reshape(10, 1, 1).repeat(1, 1, 4)
    out = attention_ref(q, k, v, 1.0, sliding_window=3)
    assert out[0, 0, 0].item() == pytest.approx((7 + 8 + 9) / 3)


def test_paged_refs_agree_with_contiguous_attention():
    """decode/varlen refs through a permuted block table == attention_ref on contiguous K/V."""
    gen = torch.Generator().manual_seed(1)
    bs, seq_len = 4, 10
    keys = torch.randn(seq_len, 2, 8, generator=gen)
    values = torch.randn(seq_len, 2, 8, generator=gen)
    block_ids = [5, 0, 3]
    key_cache = torch.full((6, bs, 2, 8), float("nan"))
    value_cache = torch.full((6, bs, 2, 8), float("nan"))
    for pos in range(seq_len):
        key_cache[block_ids[pos // bs], pos % bs] = keys[pos]
        value_cache[block_ids[pos // bs], pos % bs] = values[pos]
    table = torch.tensor([block_ids], dtype=torch.int32)
    seq_lens = torch.tensor([seq_len], dtype=torch.int32)
    q = torch.randn(3, 4, 8, generator=gen)
    want = attention_ref(q, keys, values, 0.5)
    got = paged_attention_varlen_ref(q, key_cache, value_cache, table,
                                     torch.tensor([0, 3]), seq_lens, 0.5)
    torch.testing.assert_close(got, want)
    got_decode = paged_attention_decode_ref(q[2:], key_cache, value_cache, table, seq_lens, 0.5)
    torch.testing.assert_close(got_decode, want[2:])
    gathered, _ = gather_kv_ref(key_cache, value_cache, table, seq_lens)
    assert torch.equal(gathered, keys)


def test_copy_blocks_ref():
    """Each (src, dst) pair copies the whole block in every cache."""
    caches = [torch.arange(24.0).reshape(4, 2, 3, 1), torch.arange(24.0).reshape(4, 3, 2, 1)]
    copy_blocks_ref(caches, torch.tensor([[0, 3], [2, 1]]))
    for cache in caches:
        assert torch.equal(cache[3], cache[0]) and torch.equal(cache[1], cache[2])
