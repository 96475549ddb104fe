"""Layout helpers: shapes, zero-copy views between vLLM / FlashInfer forms, slot arithmetic."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvcheck.gpu_kernels import layout  # noqa: E402


def test_pad_slot_id_is_the_reference_managers():
    """PAD_SLOT_ID is vLLM's -1 and the very object kvcheck.reference_impl exports."""
    from kvcheck.reference_impl.block_table import PAD_SLOT_ID

    assert layout.PAD_SLOT_ID == PAD_SLOT_ID == -1


def test_shapes():
    """NHD, HND, vLLM 2 x NHD, FlashInfer 5-D and packed K||V shapes."""
    assert layout.kv_cache_shape(10, 16, 8, 128) == (10, 16, 8, 128)
    assert layout.kv_cache_shape(10, 16, 8, 128, "HND") == (10, 8, 16, 128)
    assert layout.vllm_kv_cache_shape(10, 16, 8, 128) == (2, 10, 16, 8, 128)
    assert layout.flashinfer_kv_cache_shape(10, 16, 8, 128) == (10, 2, 16, 8, 128)
    assert layout.flashinfer_kv_cache_shape(10, 16, 8, 128, "HND") == (10, 2, 8, 16, 128)
    assert layout.packed_kv_cache_shape(10, 16, 8, 128) == (10, 8, 16, 256)
    with pytest.raises(ValueError, match="layout must be"):
        layout.kv_cache_shape(10, 16, 8, 128, "nhd")


def test_vllm_and_flashinfer_views_alias_the_same_memory():
    """vLLM's [2, N, P, H, D] transposed is FlashInfer's [N, 2, P, H, D]; K/V views agree."""
    kv = torch.randn(layout.vllm_kv_cache_shape(5, 4, 2, 8))
    fi = layout.vllm_to_flashinfer(kv)
    assert fi.shape == (5, 2, 4, 2, 8) and fi.data_ptr() == kv.data_ptr()
    k_vllm, v_vllm = layout.split_vllm_kv_cache(kv)
    k_fi, v_fi = layout.split_flashinfer_kv_cache(fi)
    assert torch.equal(k_vllm, k_fi) and torch.equal(v_vllm, v_fi)
    assert layout.flashinfer_to_vllm(fi).data_ptr() == kv.data_ptr()
    k_fi[3, 1, 0, 5] = 42.0  # a write through one view is visible through the other
    assert k_vllm[3, 1, 0, 5] == 42.0


def test_nhd_hnd_permutation_round_trip():
    """NHD -> HND -> NHD is the identity view; element (b, p, h, d) maps to (b, h, p, d)."""
    nhd = torch.randn(3, 16, 2, 8)
    hnd = layout.nhd_to_hnd(nhd)
    assert hnd.shape == (3, 2, 16, 8) and hnd[1, 1, 13, 4] == nhd[1, 13, 1, 4]
    assert torch.equal(layout.hnd_to_nhd(hnd), nhd)
    assert layout.as_nhd(hnd, "HND").stride() == nhd.stride()


def test_packed_kv_views_strides():
    """The packed K||V form gives strided NHD views with a contiguous head dim."""
    kv = torch.randn(layout.packed_kv_cache_shape(3, 16, 2, 64))
    key, value = layout.split_packed_kv_cache(kv, 64)
    assert key.shape == value.shape == (3, 16, 2, 64)
    assert key.stride() == (4096, 128, 2048, 1)
    assert value.data_ptr() - key.data_ptr() == 64 * kv.element_size()
    assert key[2, 5, 1, 7] == kv[2, 1, 5, 7] and value[2, 5, 1, 7] == kv[2, 1, 5, 64 + 7]


@pytest.mark.parametrize("form", layout.KV_CACHE_FORMS)
def test_allocate_kv_cache_forms(form):
    """Every form yields 4-D K/V views over one storage, in the layout it reports."""
    pair = layout.allocate_kv_cache(form, 6, 16, 2, 64, torch.float16)
    expected = layout.kv_cache_shape(6, 16, 2, 64, pair.layout)
    assert pair.key_cache.shape == pair.value_cache.shape == expected
    assert pair.key_cache.stride(-1) == 1
    pair.key_cache.fill_(1.0)
    pair.value_cache.fill_(2.0)
    assert bool((pair.key_cache == 1.0).all()), "K and V views overlap"


def test_slot_to_block_worked_example():
    """45 = 2 * 16 + 13."""
    assert layout.slot_to_block(45, 16) == (2, 13)
    assert layout.slot_to_block(0, 1) == (0, 0)
    with pytest.raises(ValueError, match="PAD_SLOT_ID"):
        layout.slot_to_block(layout.PAD_SLOT_ID, 16)


def test_flashinfer_csr_round_trip():
    """Dense vLLM table <-> FlashInfer CSR: 45 tokens of 16 = 3 pages, last page 13."""
    table = torch.tensor([[3, 1, 2], [7, 0, 0], [5, 4, 0]], dtype=torch.int32)
    seq_lens = torch.tensor([45, 16, 0], dtype=torch.int32)
    indptr, indices, last = layout.block_table_to_flashinfer_csr(table, seq_lens, 16)
    assert indptr.tolist() == [0, 3, 4, 4] and indices.tolist() == [3, 1, 2, 7]
    assert last.tolist() == [13, 16, 0]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    # Cross-check invariant: slot of position p is indices[indptr[b] + p // P] * P + p % P.
    assert int(indices[indptr[0] + 29 // 16]) * 16 + 29 % 16 == 1 * 16 + 13
    back, back_lens = layout.flashinfer_csr_to_block_table(indptr, indices, last, 16)
    assert back.tolist() == [[3, 1, 2], [7, 0, 0], [0, 0, 0]]
    assert back_lens.tolist() == [45, 16, 0]
