"""The kernel conformance checks have teeth: mutants fail with self-explaining messages."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvcheck.gpu_kernels import (  # noqa: E402
    attention_ref,
    gather_kv_ref,
    paged_attention_decode,
    paged_attention_varlen,
    store_kv_cache,
)
from kvcheck.gpu_kernels import conformance as kc  # noqa: E402


def _first(cases, **match):
    for case in cases:
        if all(getattr(case, k) == v for k, v in match.items()):
            return case
    raise LookupError(match)


def test_kvcheck_kernel_set_is_complete():
    """Our own KernelSet provides all three ops and declares every layout, dtype and feature."""
    ks = kc.kvcheck_kernel_set()
    assert ks.store_kv_cache is store_kv_cache
    assert ks.paged_attention_decode is paged_attention_decode
    assert ks.paged_attention_varlen is paged_attention_varlen
    assert all(reason is None for _, _, reason in kc.kernel_checks(ks, "cpu"))


def test_kernel_check_ids_are_unique_and_stable():
    """Test ids are '<op>[<case name>]', unique per device (they go into skip files)."""
    ids = [tid for tid, _, _ in kc.kernel_checks(kc.KernelSet(), "cpu")]
    assert len(ids) == len(set(ids))
    assert "store_kv_cache[nhd-f16-bs16-h2-d64]" in ids
    assert "paged_attention_decode[decode-split3-f16-gqa4]" in ids


def test_skip_reasons_follow_declared_support():
    """Missing ops, forms, dtypes, fp8 and features are skipped with a reason, not failed."""
    ks = kc.KernelSet(name="nhd-only", paged_attention_decode=paged_attention_decode,
                      layouts=frozenset({"NHD"}), dtypes=frozenset({"float16"}),
                      kv_cache_dtypes=frozenset({"auto"}), features=frozenset({"sliding_window"}))
    decode = list(kc.decode_cases("cpu"))
    assert "provides no store_kv_cache" in ks.skip_reason(
        "store_kv_cache", next(kc.store_cases("cpu")))
    assert "HND" in ks.skip_reason("paged_attention_decode", _first(decode, form="hnd"))
    assert "bfloat16" in ks.skip_reason("paged_attention_decode",
                                        _first(decode, dtype="bfloat16", form="nhd"))
    assert "kv_cache_dtype" in ks.skip_reason("paged_attention_decode",
                                              _first(decode, kv_cache_dtype="fp8",
                                                     dtype="float16"))
    assert "softcap" in ks.skip_reason("paged_attention_decode",
                                       _first(decode, softcap=30.0))
    assert "num_splits" in ks.skip_reason("paged_attention_decode",
                                          _first(decode, num_splits=2))
    assert ks.skip_reason("paged_attention_decode", _first(decode, sliding_window=5)) is None
    with pytest.raises(ValueError, match="unknown kernel op"):
        ks.skip_reason("paged_attention", decode[0])


def test_store_mutant_writing_padding_is_caught(device):
    """A store that clamps PAD_SLOT_ID to slot 0 (forgets the skip) fails, naming the slot."""

    def clamps_padding(key, value, key_cache, value_cache, slot_mapping, **kw):
        store_kv_cache(key, value, key_cache, value_cache, slot_mapping.clamp(min=0), **kw)

    case = _first(kc.store_cases(device), form="nhd", dtype="float16")
    with pytest.raises(AssertionError) as info:
        kc.check_store_kv_cache(clamps_padding, case)
    message = str(info.value)
    assert f"store_kv_cache[{case.name}]" in message
    assert "PAD_SLOT_ID" in message and "bit-exact" in message and "max abs err" in message


def test_store_mutant_swapping_heads_is_caught(device):
    """A store that writes head h to head H-1-h fails with the first mismatching index."""

    def flips_heads(key, value, key_cache, value_cache, slot_mapping, **kw):
        store_kv_cache(key.flip(1), value.flip(1), key_cache, value_cache, slot_mapping, **kw)

    case = _first(kc.store_cases(device), form="hnd")
    with pytest.raises(AssertionError, match=r"first at \(block_id=\d+, block_offset=\d+, "
                                             r"head=0, dim=0\)"):
        kc.check_store_kv_cache(flips_heads, case)


def test_decode_mutant_ignoring_block_table_is_caught(device):
    """Reading blocks 0, 1, 2, ... instead of the table (FlashInfer tests' arange) fails."""

    def ignores_table(query, key_cache, value_cache, block_table, seq_lens, scale, **kw):
        arange = torch.arange(block_table.numel(), dtype=block_table.dtype,
                              device=block_table.device).reshape(block_table.shape)
        arange %= key_cache.shape[0]
        return paged_attention_decode(query, key_cache, value_cache, arange, seq_lens, scale,
                                      **kw)

    case = _first(kc.decode_cases(device), block_size=16, queries_per_kv=4, head_size=64)
    with pytest.raises(AssertionError, match=r"paged_attention_decode\[.*outside tolerance"):
        kc.check_paged_attention_decode(ignores_table, case)


def test_decode_mutant_reading_past_seq_len_is_caught(device):
    """Attending to one key too many hits a poisoned slot: the message explains the NaN."""

    def one_too_many(query, key_cache, value_cache, block_table, seq_lens, scale, **kw):
        return paged_attention_decode(query, key_cache, value_cache, block_table, seq_lens + 1,
                                      scale, **kw)

    case = _first(kc.decode_cases(device), block_size=16, queries_per_kv=1, head_size=128)
    with pytest.raises(AssertionError, match="read past seq_len"):
        kc.check_paged_attention_decode(one_too_many, case)


def test_decode_mutant_ignoring_window_is_caught(device):
    """Dropping sliding_window fails the window cases."""

    def no_window(*args, sliding_window=None, **kw):
        return paged_attention_decode(*args, **kw)

    case = _first(kc.decode_cases(device), sliding_window=5)
    with pytest.raises(AssertionError, match="max abs err"):
        kc.check_paged_attention_decode(no_window, case)


def test_varlen_mutant_causal_from_zero_is_caught(device):
    """Placing query i at position i (ignoring the cached context) fails the mixed batches."""

    def causal_from_zero(query, key_cache, value_cache, block_table, query_start_loc, seq_lens,
                         scale, **kw):
        keys, values = gather_kv_ref(key_cache, value_cache, block_table, seq_lens,
                                     layout=kw.get("layout", "NHD"))
        out = torch.zeros_like(query)
        qsl, start = query_start_loc.tolist(), 0
        for seq, seq_len in enumerate(seq_lens.tolist()):
            q = query[qsl[seq]:qsl[seq + 1]]
            n = q.shape[0]
            out[qsl[seq]:qsl[seq + 1]] = attention_ref(
                q, keys[start:start + n].float(), values[start:start + n].float(), scale)
            start += seq_len
        return out

    case = _first(kc.varlen_cases(device), block_size=16, queries_per_kv=4,
                  kv_cache_dtype="auto")
    with pytest.raises(AssertionError, match=r"paged_attention_varlen\[.*first mismatch at "
                                             r"\(token="):
        kc.check_paged_attention_varlen(causal_from_zero, case)


def test_attention_tolerances_are_per_dtype():
    """fp32 is tight, bf16 loose, fp8 caches widen by FP8_TOLERANCE_FACTOR."""
    assert kc.attention_tolerance("float32") == (2e-5, 2e-5)
    assert kc.attention_tolerance("float16", "fp8") == (4e-3, 4e-3)
    with pytest.raises(AssertionError, match=r"atol=0\.002, rtol=0\.002 for float16"):
        kc.assert_attention_close("op", "c", torch.ones(2, 2), torch.zeros(2, 2), "float16",
                                  ("seq", "head"))


def test_check_rejects_wrong_case_kind(device):
    """A varlen case given to the decode check (or vice versa) is a usage error."""
    varlen = next(kc.varlen_cases(device))
    with pytest.raises(ValueError, match="varlen case"):
        kc.check_paged_attention_decode(paged_attention_decode, varlen)
    with pytest.raises(ValueError, match="decode case"):
        kc.check_paged_attention_varlen(paged_attention_varlen,
                                        dataclasses.replace(varlen, query_lens=None))
