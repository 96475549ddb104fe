"""copy_blocks and gather_kv (Triton) against their references: bit-exact, every layout."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvcheck.gpu_kernels import (  # noqa: E402
    copy_blocks,
    copy_blocks_ref,
    gather_kv,
    gather_kv_ref,
    paged_attention_decode,
)
from kvcheck.gpu_kernels.cases import AttentionCase, build_attention_inputs  # noqa: E402
from kvcheck.gpu_kernels.layout import KV_CACHE_FORMS, allocate_kv_cache  # noqa: E402


def _random_bits(pair, seed):
    gen = torch.Generator().manual_seed(seed)
    storages = pair.storage if isinstance(pair.storage, tuple) else (pair.storage,)
    for storage in storages:
        bits = storage.view(torch.uint8)
        bits.copy_(torch.randint(0, 256, tuple(bits.shape), generator=gen,
                                 dtype=torch.uint8).to(bits.device))


def _same_bits(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("form", KV_CACHE_FORMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn, torch.float32])
def test_copy_blocks_matches_reference(device, form, dtype):
    """Blocks are copied bit-exactly (random bits, NaN payloads included) in every form."""
    got = allocate_kv_cache(form, 9, 16, 2, 64, dtype, device)
    want = allocate_kv_cache(form, 9, 16, 2, 64, dtype, device)
    for pair in (got, want):
        _random_bits(pair, seed=0)
    mapping = torch.tensor([[3, 7], [5, 1], [8, 0]], dtype=torch.int64, device=device)
    copy_blocks([got.key_cache, got.value_cache], mapping)
    copy_blocks_ref([want.key_cache, want.value_cache], mapping)
    assert _same_bits(got.key_cache, want.key_cache)
    assert _same_bits(got.value_cache, want.value_cache)
    assert _same_bits(got.key_cache[7], got.key_cache[3])


@pytest.mark.parametrize(
    ("mapping", "match"),
    [
        ([[1, 2], [3, 2]], "distinct"),
        ([[1, 2], [2, 3]], "never a source"),
        ([[1, 9]], "out of range"),
    ],
)
def test_copy_blocks_rejects_ambiguous_mappings(mapping, match):
    """Parallel copies have no order, so overlapping or out-of-range mappings are refused."""
    cache = torch.zeros(9, 16, 2, 64)
    with pytest.raises(ValueError, match=match):
        copy_blocks([cache], torch.tensor(mapping))


def test_copy_blocks_rejects_wrong_mapping_dtype():
    """block_mapping must be int64 [num_pairs, 2]."""
    with pytest.raises(ValueError, match="int64"):
        copy_blocks([torch.zeros(4, 16, 2, 64)], torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[num_pairs, 2\]"):
        copy_blocks([torch.zeros(4, 16, 2, 64)], torch.tensor([[0, 1, 2]]))


@pytest.mark.parametrize("form", ["nhd", "hnd", "packed_kv", "flashinfer_hnd"])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_gather_kv_matches_reference(device, form, block_size):
    """Paged -> contiguous, through permuted and shared block ids, bit-exact."""
    case = AttentionCase(f"gather-{form}", device, block_size=block_size, num_kv_heads=2,
                         queries_per_kv=1, head_size=64,
                         seq_lens=(1, block_size + 1, 37, block_size), form=form,
                         shared_blocks=1)
    inputs = build_attention_inputs(case)
    cache = inputs["cache"]
    args = (cache.key_cache, cache.value_cache, inputs["block_table"], inputs["seq_lens"])
    keys, values = gather_kv(*args, layout=cache.layout)
    ref_keys, ref_values = gather_kv_ref(*args, layout=cache.layout)
    assert keys.shape == (sum(case.seq_lens), 2, 64)
    assert _same_bits(keys, ref_keys) and _same_bits(values, ref_values)
    assert not bool(torch.isnan(keys).any()), "gathered a poisoned (unused) slot"


def test_gather_kv_fp8_is_raw_bytes(device):
    """fp8 caches are gathered as stored codes (no dequantisation)."""
    case = AttentionCase("gather-fp8", device, block_size=16, num_kv_heads=1,
                         queries_per_kv=1, head_size=64, seq_lens=(20, 3),
                         kv_cache_dtype="fp8")
    inputs = build_attention_inputs(case)
    cache = inputs["cache"]
    args = (cache.key_cache, cache.value_cache, inputs["block_table"], inputs["seq_lens"])
    keys, _ = gather_kv(*args)
    assert keys.dtype == torch.float8_e4m3fn
    assert _same_bits(keys, gather_kv_ref(*args)[0])


def test_copy_on_write_then_decode_sees_the_copy(device):
    """After copying a shared block and repointing one sequence at the copy, decode is unchanged."""
    case = AttentionCase("cow", device, block_size=16, num_kv_heads=2, queries_per_kv=4,
                         head_size=64, seq_lens=(40, 40), dtype="float32", shared_blocks=2)
    inputs = build_attention_inputs(case)
    cache, table = inputs["cache"], inputs["block_table"]
    args = (inputs["query"], cache.key_cache, cache.value_cache)
    before = paged_attention_decode(*args, table, inputs["seq_lens"], inputs["scale"])
    shared = int(table[1, 0])
    used = set(table.flatten().tolist())
    spare = next(b for b in range(1, cache.key_cache.shape[0]) if b not in used)  # 3 spares
    copy_blocks([cache.key_cache, cache.value_cache],
                torch.tensor([[shared, spare]], device=device))
    table[1, 0] = spare
    after = paged_attention_decode(*args, table, inputs["seq_lens"], inputs["scale"])
    torch.testing.assert_close(after, before, atol=0, rtol=0)
